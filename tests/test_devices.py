"""devices.py: which devices the towers go on (real, fake and no GPUs)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tensorflow as tf
from fakes import (
    ACTION_SPACE,
    OBS_SPACE,
    PGPolicy,
    fake_gpus,
    mlp_batch,
    small_config,
)

from policy_service.engine import devices
from policy_service.engine.devices import CPU, FAKE_GPU, GPU, TowerDevices, choose_tower_devices

TESTS_DIR = Path(__file__).resolve().parent
REPO_DIR = TESTS_DIR.parent


@pytest.mark.parametrize("fake", [False, True])
@pytest.mark.parametrize("visible", [0, 1, 2, 4])
def test_zero_gpus_is_one_cpu_tower_whatever_is_visible(fake, visible):
    chosen = choose_tower_devices(0, fake, visible_gpus=visible)
    assert chosen == TowerDevices(("/CPU:0",), CPU)
    assert chosen.num_towers == 1 and chosen.variable_device == "/CPU:0"
    assert chosen.gradient_reduction == "sum_on_variable_device"


@pytest.mark.parametrize(
    "num_gpus, visible, expected",
    [
        (0.5, 1, ("/GPU:0",)),  # a fraction shares one GPU: one tower
        (0.5, 4, ("/GPU:0",)),
        (1, 1, ("/GPU:0",)),
        (1, 4, ("/GPU:0",)),
        (2, 2, ("/GPU:0", "/GPU:1")),
        (2, 4, ("/GPU:0", "/GPU:1")),
        (2.0, 3, ("/GPU:0", "/GPU:1")),
    ],
)
def test_visible_gpus_give_one_tower_per_requested_gpu(num_gpus, visible, expected):
    chosen = choose_tower_devices(num_gpus, False, visible_gpus=visible)
    assert chosen.devices == expected and chosen.kind == GPU
    assert chosen.variable_device == "/GPU:0" and chosen.note is None


@pytest.mark.parametrize("visible", [1, 4])
def test_real_gpus_override_no_fake_gpus_asked_for(visible):
    chosen = choose_tower_devices(2, True, visible_gpus=visible)
    assert chosen.devices == ("/CPU:0", "/CPU:1") and chosen.kind == FAKE_GPU
    assert chosen.gradient_reduction == "sum_on_variable_device"  # NCCL only between GPUs
    assert chosen.note == (
        f"num_gpus=2 with _fake_gpus: {visible} GPU(s) visible, left unused; "
        "2 tower(s) on fake GPUs (logical CPU devices /CPU:0, /CPU:1)"
    )


@pytest.mark.parametrize(
    "num_gpus, expected",
    [
        (0.5, ("/CPU:0",)),
        (1, ("/CPU:0",)),
        (2, ("/CPU:0", "/CPU:1")),
        (4, ("/CPU:0", "/CPU:1", "/CPU:2", "/CPU:3")),
    ],
)
def test_fake_gpus_without_gpus_are_separate_logical_cpus(num_gpus, expected):
    chosen = choose_tower_devices(num_gpus, True, visible_gpus=0)
    assert chosen.devices == expected and chosen.kind == FAKE_GPU
    assert chosen.num_towers == len(expected)
    assert chosen.note == (
        f"num_gpus={num_gpus:g} with _fake_gpus: no GPU visible; {len(expected)} tower(s) "
        f"on fake GPUs (logical CPU devices {', '.join(expected)})"
    )


@pytest.mark.parametrize("num_gpus, towers", [(0.5, 1), (1, 1), (2, 2), (4, 4)])
def test_gpus_asked_for_without_fake_gpus_that_are_not_there_give_one_cpu_tower_and_say_so(
    num_gpus, towers
):
    chosen = choose_tower_devices(num_gpus, False, visible_gpus=0)
    assert chosen.devices == ("/CPU:0",) and chosen.kind == CPU
    assert chosen.note == (
        f"num_gpus={num_gpus:g} asks for {towers} GPU(s) but TensorFlow sees no GPU in this "
        "process (is the CUDA build of TensorFlow installed, extra 'gpu'?); training on one "
        f"CPU tower instead (_fake_gpus: true gives {towers} tower(s) on logical CPU devices)"
    )


@pytest.mark.parametrize("num_gpus, visible", [(2, 1), (4, 2), (3, 2), (2.0, 1)])
def test_more_gpus_requested_than_found_names_both_numbers(num_gpus, visible):
    with pytest.raises(ValueError) as err:
        choose_tower_devices(num_gpus, False, visible_gpus=visible)
    assert f"num_gpus={num_gpus}" in str(err.value)
    assert f"only {visible} GPU(s) found" in str(err.value)


def test_ray_assigned_gpus_are_renumbered_from_zero():
    # Inside a Ray actor CUDA_VISIBLE_DEVICES holds Ray's ids, TF numbers them 0..k-1.
    chosen = choose_tower_devices(2, False, visible_gpus=2, ray_gpu_ids=[3, 5])
    assert chosen.devices == ("/GPU:0", "/GPU:1") and chosen.kind == GPU
    chosen = choose_tower_devices(0.5, False, visible_gpus=1, ray_gpu_ids=[7])
    assert chosen.devices == ("/GPU:0",) and chosen.kind == GPU


def test_ray_assignment_bounds_the_gpus_used():
    # TF may list more GPUs than Ray gave this actor; only Ray's count is usable.
    with pytest.raises(ValueError, match=r"only 1 GPU\(s\) found"):
        choose_tower_devices(2, False, visible_gpus=4, ray_gpu_ids=[2])
    assert choose_tower_devices(1, False, visible_gpus=4, ray_gpu_ids=[2]).devices == ("/GPU:0",)


def test_ray_gpus_that_tensorflow_cannot_see_is_an_error_naming_them():
    with pytest.raises(ValueError) as err:
        choose_tower_devices(1, False, visible_gpus=0, ray_gpu_ids=[0, 1])
    assert "Ray assigned GPUs [0, 1] but TensorFlow sees no GPU" in str(err.value)


def test_ray_gpus_invisible_to_tensorflow_with_fake_gpus_uses_fake_gpus():
    chosen = choose_tower_devices(2, True, visible_gpus=0, ray_gpu_ids=[0, 1])
    assert chosen.devices == ("/CPU:0", "/CPU:1") and chosen.kind == FAKE_GPU


def test_an_empty_ray_assignment_is_like_none():
    assert choose_tower_devices(1, False, visible_gpus=0, ray_gpu_ids=[]).kind == CPU
    assert choose_tower_devices(1, False, visible_gpus=1, ray_gpu_ids=[]).devices == ("/GPU:0",)


@pytest.mark.parametrize(
    "num_gpus, message",
    [
        (-1, "num_gpus must be >= 0, got -1"),
        (-0.5, "num_gpus must be >= 0"),
        (1.5, "num_gpus above 1 must be a whole number, got 1.5"),
        (2.25, "whole number"),
    ],
)
def test_invalid_num_gpus_is_an_error_naming_the_value(num_gpus, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        choose_tower_devices(num_gpus, True, visible_gpus=0)


@pytest.mark.parametrize(
    "chosen, reduction",
    [
        (TowerDevices(("/GPU:0", "/GPU:1"), GPU), "nccl"),
        (TowerDevices(("/GPU:0", "/GPU:1", "/GPU:2", "/GPU:3"), GPU), "nccl"),
        (TowerDevices(("/GPU:0",), GPU), "sum_on_variable_device"),
        (TowerDevices(("/CPU:0", "/CPU:1"), FAKE_GPU), "sum_on_variable_device"),
        (TowerDevices(("/CPU:0",), FAKE_GPU), "sum_on_variable_device"),
        (TowerDevices(("/CPU:0",), CPU), "sum_on_variable_device"),
    ],
)
def test_nccl_only_between_more_than_one_real_gpu(chosen, reduction):
    assert chosen.gradient_reduction == reduction


def test_resolve_devices_in_this_process_uses_the_fake_gpus():
    # conftest made 4 logical CPU devices; this machine has no GPU.
    assert len(tf.config.list_logical_devices("CPU")) >= 4
    chosen = devices.resolve_devices(4, True)
    assert chosen.devices == ("/CPU:0", "/CPU:1", "/CPU:2", "/CPU:3") and chosen.kind == FAKE_GPU
    assert devices.resolve_devices(2, False).devices == ("/CPU:0",)


def test_prepare_process_after_init_asking_for_more_devices_is_an_error():
    devices.prepare_process(2)  # fewer than exist: fine
    with pytest.raises(RuntimeError) as err:
        devices.prepare_process(16)
    assert "16 fake GPUs requested" in str(err.value)
    assert "prepare_process" in str(err.value)


def test_policy_devices_match_the_config():
    assert PGPolicy(OBS_SPACE, ACTION_SPACE, small_config()).devices == ["/CPU:0"]
    policy = PGPolicy(OBS_SPACE, ACTION_SPACE, small_config(**fake_gpus(4)))
    assert policy.devices == ["/CPU:0", "/CPU:1", "/CPU:2", "/CPU:3"]
    # no GPU and no fake GPUs: one CPU tower (the design's contract), with a note
    assert PGPolicy(OBS_SPACE, ACTION_SPACE, small_config(num_gpus=2)).devices == ["/CPU:0"]


def test_loaded_data_sits_on_each_towers_own_device():
    policy = PGPolicy(OBS_SPACE, ACTION_SPACE, small_config(minibatch_size=8, **fake_gpus(4)))
    policy.load_batch_into_buffer(mlp_batch(16))
    placed = policy.towers.buffers[0].towers
    assert len(placed) == 4
    for t, shard in enumerate(placed):
        for name, tensor in shard.items():
            assert tensor.device.endswith(f"/device:CPU:{t}"), (name, tensor.device)


_SUBPROCESS = textwrap.dedent("""
    import os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    sys.path.insert(0, {tests!r})
    from policy_service.engine import devices
    devices.prepare_process(3)
    import tensorflow as tf
    cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
    assert cpus == ["/device:CPU:0", "/device:CPU:1", "/device:CPU:2"], cpus
    cores = os.cpu_count() or 1
    assert tf.config.threading.get_intra_op_parallelism_threads() == max(1, cores // 3)
    from fakes import ACTION_SPACE, OBS_SPACE, PGPolicy, mlp_batch, small_config
    policy = PGPolicy(OBS_SPACE, ACTION_SPACE,
                      small_config(num_gpus=3, _fake_gpus=True, minibatch_size=6))
    assert policy.devices == ["/CPU:0", "/CPU:1", "/CPU:2"], policy.devices
    policy.load_batch_into_buffer(mlp_batch(12))
    for t, shard in enumerate(policy.towers.buffers[0].towers):
        for tensor in shard.values():
            assert tensor.device.endswith("/device:CPU:%d" % t), tensor.device
    policy.learn_on_loaded_batch(0)
    policy.learn_on_batch(mlp_batch(7))
    try:
        devices.prepare_process(4)
    except RuntimeError as err:
        assert "4 fake GPUs requested" in str(err)
    else:
        raise AssertionError("prepare_process(4) after init with 3 devices did not fail")
    print("OK")
""")


@pytest.mark.slow  # a child process importing TensorFlow: ~13 s beside a busy job
def test_prepare_process_in_a_fresh_process_gives_three_fake_gpus_with_towers_on_them():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, "-c", _SUBPROCESS.format(tests=str(TESTS_DIR))],
        cwd=REPO_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("OK")

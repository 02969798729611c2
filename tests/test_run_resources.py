"""policy_service/distributed/run_resources.py: the resources each role of a real
`policy-service train` run held, as result.json records them (the driver's own
learner: test_training.py, beside its run)."""

from __future__ import annotations

import json

import pytest
from cli_processes import TINY, finish, ray_token, start  # noqa: F401


@pytest.mark.slow  # a run with a learner actor and the inference actor: ~50 s here
def test_result_records_the_learner_actor_and_inference_actor_resources(tmp_path):
    """One learner actor on 2 fake GPUs, sampling in the driver through a PolicyActor;
    beside it, a PolicyActor asking for a GPU this machine's Ray lacks fails at once."""
    run_dir = tmp_path / "actors"
    run = start(
        "train",
        "ppo",
        "--env",
        "CartPole-v1",
        "--stop-iters",
        "1",
        "--fake-gpus",
        "--set",
        "num_learners=1",
        "--set",
        "num_gpus_per_learner=2",
        "--set",
        "num_cpus_per_learner=0.5",
        "--set",
        "remote_inference=true",
        "--seed",
        "0",
        "--output-dir",
        str(run_dir),
        *TINY,
    )
    too_big = start(
        "train",
        "ppo",
        "--env",
        "CartPole-v1",
        "--stop-iters",
        "1",
        "--set",
        "remote_inference=true",
        "--set",
        "num_gpus_per_policy_actor=1",
        "--output-dir",
        str(tmp_path / "too_big"),
        *TINY,
    )
    code, _, err = finish(run)
    assert code == 0, err
    code_too_big, _, err_too_big = finish(too_big)
    assert code_too_big == 2, err_too_big
    assert err_too_big.strip().splitlines()[-1] == (
        "policy-service: error: resources: 1 policy actor x 1 GPU = 1 GPU, the cluster has "
        "0 GPUs (num_gpus_per_policy_actor)"
    )
    resources = json.loads((run_dir / "result.json").read_text())["resources"]
    assert not resources["driver"]["holds_learner"] and resources["driver"]["devices"] is None
    [learner] = resources["learners"]
    assert (learner["CPU"], learner["GPU"], learner["gpu_ids"]) == (0.5, 0.0, [])
    assert learner["devices"] == ["/CPU:0", "/CPU:1"]  # the actor's two fake-GPU towers
    assert learner["device_note"] == (
        "num_gpus=2 with _fake_gpus: no GPU visible; 2 tower(s) on fake GPUs "
        "(logical CPU devices /CPU:0, /CPU:1)"
    )
    assert resources["driver"]["device_note"] is None
    inference = resources["inference_actor"]
    assert (inference["CPU"], inference["GPU"], inference["devices"]) == (1.0, 0.0, ["/CPU:0"])
    assert inference["device_note"] is None  # asked for no GPU, acting on the CPU
    [runner] = resources["env_runners"]  # the driver's own sampler, acting remotely
    assert runner["in_driver"] and runner["devices"] is None
    assert len({learner["pid"], inference["pid"], resources["driver"]["pid"]}) == 3


@pytest.mark.slow  # a one-iteration run: ~15 s here
def test_gpus_asked_for_where_none_are_visible_train_on_one_cpu_tower_and_say_so_once(tmp_path):
    """num_gpus=2 without --fake-gpus on a machine whose TensorFlow sees no GPU: the run
    goes on, on one CPU tower, and says so in one log line and in result.json."""
    run = start(
        "train",
        "ppo",
        "--env",
        "CartPole-v1",
        "--stop-iters",
        "1",
        "--num-gpus",
        "2",
        "--output-dir",
        str(tmp_path),
        *TINY,
    )
    code, _, err = finish(run)
    assert code == 0, err
    note = (
        "num_gpus=2 asks for 2 GPU(s) but TensorFlow sees no GPU in this process (is the "
        "CUDA build of TensorFlow installed, extra 'gpu'?); training on one CPU tower "
        "instead (_fake_gpus: true gives 2 tower(s) on logical CPU devices)"
    )
    said = [line for line in err.splitlines() if "towers: " in line]
    assert len(said) == 1 and said[0].endswith(note), err
    driver = json.loads((tmp_path / "result.json").read_text())["resources"]["driver"]
    assert driver["devices"] == ["/CPU:0"] and driver["device_note"] == note

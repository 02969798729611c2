"""The runner type "offline": `input` instead of env runners. Rows come from the
files (spaces from the manifest, no env), in passes, shuffled, held-out episodes kept
out; bad data is one line naming the file and the column before anything trains."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from offline_datasets import CARTPOLE, RLLIB_WRITER, SPACES, episodes, write
from offline_runs import LoggedReturnsPolicy, OfflinePG, offline_config

from algorithms.algorithm import AlgorithmConfig
from policy_service.data.sample_batch import SampleBatch
from policy_service.distributed.runner_types import RUNNER_TYPES, runner_type
from policy_service.offline import WRITERS, OfflineDataError
from policy_service.offline.held_out import held_out
from policy_service.offline.offline_runner_type import OfflineRunners


@pytest.fixture(scope="module")
def logged(tmp_path_factory) -> Path:
    return write(tmp_path_factory.mktemp("logged"), [episodes(10, 0), episodes(10, 1)])


def runners(input, **extra) -> OfflineRunners:
    from policy_service.config import from_dict
    from policy_service.offline.offline_runner_type import build

    config = from_dict(
        AlgorithmConfig, offline_config(input, **{"postprocess_inputs": True, **extra})
    )
    return build(config, LoggedReturnsPolicy, 0, env=None)


def rows(batch: SampleBatch) -> set:
    return set(zip(batch[SampleBatch.EPS_ID].tolist(), batch[SampleBatch.T].tolist()))


def test_input_picks_the_offline_runner_type():
    assert "offline" in RUNNER_TYPES

    assert runner_type(AlgorithmConfig(input="logs/")) == "offline"
    assert runner_type(AlgorithmConfig(env="CartPole-v1")) == "env"


def test_a_pass_hands_out_every_row_once_in_a_new_order(logged):
    group = runners(logged, shuffle_buffer_size=150)
    assert group.observation_space == CARTPOLE.observation_space  # from the manifest
    seen: list = []
    while len(seen) < 400:
        batch, metrics = group.sample()
        assert metrics["env_steps"] == batch.count <= 100
        assert SampleBatch.INFOS not in batch  # kept in the files, not trained on
        seen += sorted(rows(batch))
    assert len(set(seen)) == 400 == len(seen)
    assert seen[:100] != sorted(seen)[:100]  # shuffled
    assert group.passes == 0
    next_pass = rows(group.sample()[0])  # the next pass starts, in another order
    assert group.passes == 1 and next_pass <= set(seen)
    group.stop()


def test_held_out_episodes_never_reach_training(logged):
    group = runners(
        logged,
        off_policy_estimation_methods=["ImportanceSampling"],
        off_policy_estimation_held_out=0.3,
    )
    trained: set = set()
    for _ in range(8):
        trained |= rows(group.sample()[0])
    eps = np.array(sorted({e for e, _ in trained}))
    assert not held_out(eps, 0.3).any()
    all_eps = np.arange(10, dtype=np.int64).tolist() + (np.arange(10) + 1000).tolist()
    kept = [e for e in all_eps if not held_out(np.array([e]), 0.3)[0]]
    assert set(eps.tolist()) == set(kept) and 0 < len(kept) < 20


def test_an_algorithm_trains_from_input_without_env(logged):
    algo = OfflinePG(offline_config(logged, postprocess_inputs=True))
    try:
        assert algo.config.env is None
        first = algo.train()
        second = algo.train()
        assert second["timesteps_total"] == 200 and first["env_steps_this_iter"] == 100
        assert second["num_samples_trained_total"] == 200
        assert np.isnan(second["episode_return_mean"])  # no episode is played
    finally:
        algo.stop()


def test_json_lines_train_the_same_way(tmp_path):
    write(tmp_path, [episodes(6)], fmt="json")
    algo = OfflinePG(offline_config(tmp_path, postprocess_inputs=True))
    try:
        assert algo.train()["env_steps_this_iter"] == 100
    finally:
        algo.stop()


# ----- bad input: one line naming the file and the column, nothing trained ------------------


def one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message, message
    return message


def test_input_naming_nothing_is_one_line(tmp_path):
    with pytest.raises(OfflineDataError) as err:
        OfflinePG(offline_config(tmp_path / "missing"))
    assert one_line(err).startswith(f"config.input {tmp_path / 'missing'}: no such file")


def test_manifest_spaces_that_disagree_with_env(logged):
    with pytest.raises(OfflineDataError) as err:
        OfflinePG(offline_config(logged, env="MountainCar-v0"))
    message = one_line(err)
    assert "_manifest.json" in message and "observation_space" in message


def test_actions_outside_the_space(tmp_path):
    batch = episodes(2)
    batch[SampleBatch.ACTIONS][7] = 5
    write(tmp_path, [batch])
    with pytest.raises(OfflineDataError) as err:
        OfflinePG(offline_config(tmp_path))
    message = one_line(err)
    assert ".parquet" in message and "column 'actions': row 7 holds 5" in message


def test_a_truncated_parquet_file(tmp_path, logged):
    shutil.copytree(logged, tmp_path / "data")
    victim = sorted((tmp_path / "data").rglob("*.parquet"))[0]
    victim.write_bytes(victim.read_bytes()[:-100])
    with pytest.raises(OfflineDataError) as err:
        OfflinePG(offline_config(tmp_path / "data"))
    assert one_line(err).startswith(f"{victim}: not a readable Parquet file")


def test_a_corrupt_page_names_its_column(tmp_path):
    """Under an intact footer a corrupt page shows when its rows are read (the first
    ones already when the run starts: the postprocessing check reads them): the file
    and the column, in one line."""
    import pyarrow.parquet as pq

    write(tmp_path, [episodes(10)])
    path = sorted(tmp_path.rglob("*.parquet"))[0]
    column = pq.ParquetFile(path).metadata.row_group(0).column(0)  # obs
    assert column.path_in_schema.startswith("obs")
    data = bytearray(path.read_bytes())
    start = column.data_page_offset + 20
    data[start : start + 40] = b"\xff" * 40
    path.write_bytes(bytes(data))
    with pytest.raises(OfflineDataError) as err:
        runners(tmp_path)
    assert one_line(err).startswith(f"{path}: column 'obs")


def test_a_json_line_missing_a_column(tmp_path):
    with WRITERS["json"](tmp_path, SPACES) as writer:
        writer.write(episodes(2))
        writer.write(episodes(2, seed=1))
    (path,) = tmp_path.glob("output-*.json")
    lines = path.read_text().splitlines()
    line = json.loads(lines[1])
    del line["rewards"]
    lines[1] = json.dumps(line)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(OfflineDataError) as err:
        OfflinePG(offline_config(tmp_path))
    assert one_line(err) == f"{path} line 2: column 'rewards' missing (required)"


def test_a_column_the_policy_postprocessing_adds_without_postprocess_inputs(logged):
    with pytest.raises(OfflineDataError) as err:
        OfflinePG(offline_config(logged))
    assert (
        "column 'advantages' missing, which LoggedReturnsPolicy.postprocess_trajectory "
        "adds: set config.postprocess_inputs to true" in one_line(err)
    )


def test_a_column_the_policy_reads_offline(tmp_path):
    batch = episodes(4)
    del batch[SampleBatch.NEXT_OBS]
    write(tmp_path, [batch])
    with pytest.raises(OfflineDataError) as err:
        OfflinePG(offline_config(tmp_path))
    assert one_line(err).endswith("column 'new_obs' missing (required)")


def test_estimators_need_the_behaviour_logp(tmp_path):
    batch = episodes(4)
    del batch[SampleBatch.ACTION_LOGP]
    write(tmp_path, [batch])
    with pytest.raises(OfflineDataError) as err:
        OfflinePG(
            offline_config(tmp_path, off_policy_estimation_methods=["WeightedImportanceSampling"])
        )
    assert "column 'action_logp' missing" in one_line(err)


@pytest.mark.slow  # ~5 s: the command line's imports and a run directory
def test_the_cli_trains_with_input_and_no_env(tmp_path, logged, capsys):
    from policy_service.cli.commands import main

    out = tmp_path / "run"
    code = main(
        ["train", "ppo", "--input", str(logged), "--stop-iters", "1", "--output-dir", str(out)]
        + ["--set", "train_batch_size=100", "--set", "minibatch_size=50"]
        + ["--set", "postprocess_inputs=true", "--set", "model.fcnet_hiddens=[8]"]
    )
    assert code == 0, capsys.readouterr().err
    assert (out / "checkpoints").is_dir()
    # the run resumes without env too (its config and checkpoints name none)
    assert main(["train", "--resume", str(out), "--stop-iters", "2"]) == 0
    assert json.loads((out / "result.json").read_text())["timesteps_total"] == 200
    capsys.readouterr()
    code = main(["train", "ppo", "--input", str(tmp_path / "none"), "--stop-iters", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [
        f"policy-service: error: config.input {tmp_path / 'none'}: no such file or directory"
    ]


def test_every_sample_is_whole_across_passes(tmp_path):
    """60 rows in batches of 40: a pass's last 20 rows go out with the next pass's first."""
    write(tmp_path, [episodes(3)])
    group = runners(tmp_path, train_batch_size=40, minibatch_size=20)
    counts, seen = [], []
    for _ in range(6):
        batch = group.sample()[0]
        counts.append(batch.count)
        seen += sorted(rows(batch))
    assert counts == [40] * 6 and group.passes == 3  # the 4th pass is read, not left
    assert all(seen.count(row) == 4 for row in set(seen)) and len(set(seen)) == 60


@pytest.mark.slow  # ~20 s: Ray and its Data read tasks
def test_ray_data_readers_hand_out_the_same_rows(logged, ray_local):
    """With Ray running and input_num_readers > 1 the rows come through Ray Data's read
    tasks: the same rows, the same checks; with 1 reader, in this process."""
    one = runners(logged, input_num_readers=1)
    two = runners(logged, input_num_readers=2, shuffle_buffer_size=100)
    assert (one.num_readers, two.num_readers) == (0, 2)
    seen = set()
    for _ in range(4):
        seen |= rows(two.sample()[0])
    assert len(seen) == 400 and seen == {r for _ in range(4) for r in rows(one.sample()[0])}
    for group in (one, two):
        group.stop()


@pytest.mark.slow  # Ray and its Data read tasks
def test_stop_leaves_no_read_running(logged, ray_local):
    """Through Ray Data the next pass's read starts as a pass begins (iter_passes):
    stopped mid-pass, both reads are ended, no reader thread left and the CPUs free."""
    import threading

    import ray

    group = runners(logged, input_num_readers=2, shuffle_buffer_size=100)
    group.sample()
    reads = [group._pass._read, group._passes.gi_frame.f_locals["ahead"][2]]
    assert all(read._blocks.gi_frame is not None for read in reads)  # both executions open
    group.stop()
    for read in reads:
        assert not read._thread.is_alive() and read._blocks.gi_frame is None  # ended
    assert not [t for t in threading.enumerate() if t.name == "StartedRead"]
    cpus = ray.cluster_resources()["CPU"]
    deadline = time.monotonic() + 60  # cancelled tasks give their CPUs back
    while ray.available_resources().get("CPU", 0) < cpus and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ray.available_resources().get("CPU", 0) == cpus


@pytest.mark.rllib
@pytest.mark.slow  # RLlib's virtualenv (built when missing), then a run
def test_a_run_trains_on_files_rllibs_json_writer_wrote(tmp_path):
    """RLlib's own files hold no manifest: env names the spaces (without it, one line)."""
    import subprocess

    from benchmark_runs import peer_venv

    from benchmarks.harness import child_env
    from benchmarks.rllib_env import RLLIB_ENV

    out = subprocess.run(
        [peer_venv(".venv-rllib"), "-c", RLLIB_WRITER, str(tmp_path)],
        env=child_env(RLLIB_ENV),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    with pytest.raises(OfflineDataError) as err:
        OfflinePG(offline_config(tmp_path))
    assert one_line(err).endswith("give config.env, whose spaces they are")
    algo = OfflinePG(offline_config(tmp_path, env="CartPole-v1", postprocess_inputs=True))
    try:
        assert algo.env_runners.policy_id == "default_policy"  # beside "pole"'s rows
        assert algo.train()["env_steps_this_iter"] == 100  # 12 rows, read pass after pass
    finally:
        algo.stop()

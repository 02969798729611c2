"""Offline experiences: Parquet and RLlib's JSON lines written and read back with the
same columns, dtypes and values; RLlib's packed format by hand; files that a killed
writer leaves; shuffling; and each bad input refused in one line naming file and column."""

import base64
import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import lz4.frame
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from offline_datasets import RLLIB_WRITER

from policy_service.data.sample_batch import SampleBatch, concat_samples
from policy_service.multi_agent.batch import MultiAgentBatch
from policy_service.offline.columns import OfflineDataError
from policy_service.offline.manifest import MANIFEST, read_manifest
from policy_service.offline.parquet_writer import ParquetExperienceWriter
from policy_service.offline.reader import open_experiences
from policy_service.offline.rllib_json import JsonExperienceWriter

REPO = Path(__file__).resolve().parents[1]
OBS_SPACE = gym.spaces.Box(-10.0, 10.0, (4,), np.float32)
ACTION_SPACE = gym.spaces.Discrete(2)
SPACES = {"default_policy": (OBS_SPACE, ACTION_SPACE)}


def cartpole_rows(n, start=0, seed=0):
    """n rows shaped like CartPole's, episode ids and t counting from `start`."""
    rng = np.random.default_rng(seed)
    t = np.arange(start, start + n)
    return SampleBatch(
        {
            "obs": rng.uniform(-1, 1, (n, 4)).astype(np.float32),
            "new_obs": rng.uniform(-1, 1, (n, 4)).astype(np.float32),
            "actions": rng.integers(0, 2, n),
            "rewards": np.ones(n, np.float32),
            "terminateds": t % 10 == 9,
            "truncateds": np.zeros(n, bool),
            "eps_id": (t // 10).astype(np.int64),
            "t": (t % 10).astype(np.int32),
            "action_logp": np.log(rng.uniform(0.1, 1, n)).astype(np.float32),
            "action_prob": rng.uniform(0.1, 1, n).astype(np.float32),
            "infos": [{"step": int(i), "x": np.float32(0.5)} for i in t],
        }
    )


def assert_same_rows(got, want):
    assert sorted(got.keys()) == sorted(want.keys())
    for key in want:
        if key == "infos":
            assert got[key] == [json.loads(json.dumps(i, default=float)) for i in want[key]]
            continue
        g, w = got[key], want[key]
        if isinstance(w, dict):
            assert_same_rows(g, w)
            continue
        if isinstance(w, tuple):
            assert isinstance(g, tuple) and len(g) == len(w), key
            for i, (gi, wi) in enumerate(zip(g, w)):
                assert_same_rows({i: gi}, {i: wi})
            continue
        assert g.dtype == w.dtype, key
        assert g.shape == w.shape, key
        np.testing.assert_array_equal(g, w, err_msg=key)


def read_all(input, policy_id="default_policy", **kwargs):
    experiences = open_experiences(input, spaces=kwargs.pop("spaces", None))
    batches = list(experiences.iter_batches(1000, policy_id=policy_id, **kwargs))
    return concat_samples(batches)


# --------------------------------------------------------------------------------------
# Parquet
# --------------------------------------------------------------------------------------


def test_parquet_round_trip(tmp_path):
    batches = [cartpole_rows(30, 0), cartpole_rows(25, 30, seed=1), cartpole_rows(7, 55, 2)]
    with ParquetExperienceWriter(tmp_path, SPACES, row_group_rows=40, weights_version=3) as w:
        for batch in batches:
            w.write(batch)
    got = read_all(tmp_path)
    assert_same_rows(got, concat_samples(batches))
    manifest = read_manifest(tmp_path / "default_policy" / MANIFEST)
    data = manifest.policies["default_policy"]
    assert (data.observation_space, data.action_space) == (OBS_SPACE, ACTION_SPACE)
    assert data.weights_version == 3
    obs_spec = next(c for c in data.columns if c.name == "obs")
    assert (obs_spec.dtype, obs_spec.shape) == ("<f4", (4,))


def test_parquet_keeps_nested_and_multi_dim_columns(tmp_path):
    obs_space = gym.spaces.Dict(
        {
            "image": gym.spaces.Box(0, 255, (3, 2, 2), np.uint8),
            "pos": gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.Box(-1, 1, (2,)))),
        }
    )
    action_space = gym.spaces.Box(-1.0, 1.0, (2, 3), np.float64)
    n, rng = 12, np.random.default_rng(3)
    batch = SampleBatch(
        {
            "obs": {
                "image": rng.integers(0, 255, (n, 3, 2, 2), dtype=np.uint8),
                "pos": (rng.integers(0, 3, n), rng.uniform(-1, 1, (n, 2)).astype(np.float32)),
            },
            "actions": rng.uniform(-1, 1, (n, 2, 3)),
            "rewards": rng.standard_normal(n).astype(np.float16),
            "eps_id": np.full(n, 7, np.uint64),
        }
    )
    with ParquetExperienceWriter(tmp_path, {"default_policy": (obs_space, action_space)}) as w:
        w.write(batch)
    got = read_all(tmp_path)
    assert isinstance(got["obs"]["pos"], tuple)
    assert_same_rows(got, batch)
    table = pq.read_table(tmp_path / "default_policy")  # plain pyarrow reads the directory
    assert table.num_rows == n and "obs/image" in table.column_names


def test_rotation_gives_complete_files(tmp_path):
    with ParquetExperienceWriter(tmp_path, SPACES, max_file_size=4000, row_group_rows=50) as w:
        for i in range(8):
            w.write(cartpole_rows(50, 50 * i, seed=i))
    files = sorted((tmp_path / "default_policy").glob("*.parquet"))
    assert len(files) >= 3
    assert sum(pq.ParquetFile(f).metadata.num_rows for f in files) == 400
    assert not list(tmp_path.rglob(".*"))  # no temp file left
    got = read_all(tmp_path)
    assert sorted(got["eps_id"] * 10 + got["t"]) == list(range(400))


def test_multi_agent_datasets_are_keyed_by_policy_id(tmp_path):
    other = (gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.Discrete(5))
    spaces = {**SPACES, "runner": other}
    runner_rows = SampleBatch(
        {
            "obs": np.zeros((6, 2), np.float32),
            "actions": np.arange(6) % 5,
            "rewards": np.arange(6, dtype=np.float32),
        }
    )
    batch = MultiAgentBatch({"default_policy": cartpole_rows(9), "runner": runner_rows}, 9)
    with ParquetExperienceWriter(tmp_path, spaces) as w:
        w.write(batch)
    experiences = open_experiences(tmp_path)
    assert sorted(experiences.policy_ids) == ["default_policy", "runner"]
    assert experiences["runner"].action_space == gym.spaces.Discrete(5)
    assert experiences["runner"].num_rows == 6
    assert_same_rows(read_all(tmp_path, "runner"), runner_rows)
    assert_same_rows(read_all(tmp_path), cartpole_rows(9))


def test_shuffle_buffer_mixes_rows_and_keeps_every_row(tmp_path):
    with ParquetExperienceWriter(tmp_path, SPACES, row_group_rows=100) as w:
        for i in range(5):
            w.write(cartpole_rows(100, 100 * i, seed=i))
    experiences = open_experiences(tmp_path)
    batches = list(experiences.iter_batches(64, shuffle_buffer_size=150, seed=4))
    assert [b.count for b in batches] == [64] * 7 + [500 - 7 * 64]
    keys = np.concatenate([b["eps_id"] * 10 + b["t"] for b in batches])
    assert sorted(keys) == list(range(500))
    assert not np.array_equal(keys, np.arange(500))
    again = list(experiences.iter_batches(64, shuffle_buffer_size=150, seed=4))
    np.testing.assert_array_equal(keys, np.concatenate([b["eps_id"] * 10 + b["t"] for b in again]))
    for batch in batches:  # columns stay aligned: each row's infos step is its key
        np.testing.assert_array_equal(
            [i["step"] for i in batch["infos"]], batch["eps_id"] * 10 + batch["t"]
        )


def keys_of(batches):
    return [(b["eps_id"] * 10 + b["t"]).tolist() for b in batches]


def test_passes_are_iter_batches_passes_and_resume_the_first(tmp_path):
    """iter_passes gives, seed by seed, the batches iter_batches gives; a position taken
    in a pass resumes there, the next passes following."""
    with ParquetExperienceWriter(tmp_path, SPACES, row_group_rows=100) as w:
        for i in range(5):
            w.write(cartpole_rows(100, 100 * i, seed=i))
            w.flush()  # a file each: the file order is shuffled too
    experiences = open_experiences(tmp_path)
    kwargs = {"shuffle_buffer_size": 150}
    want = [keys_of(experiences.iter_batches(64, seed=s, **kwargs)) for s in (1, 2, 3)]
    assert want[0] != want[1] and sorted(sum(want[0], [])) == list(range(500))
    passes = experiences.iter_passes(64, seeds=[1, 2, 3], **kwargs)
    assert [keys_of(stream) for stream in passes] == want
    first = next(experiences.iter_passes(64, seeds=[1, 2, 3], **kwargs))  # the caller's
    head = keys_of([next(first), next(first), next(first)])
    position = first.position()
    first.close()
    resumed = experiences.iter_passes(64, seeds=[1, 2, 3], resume=position, **kwargs)
    got = [keys_of(stream) for stream in resumed]
    assert [head + got[0], *got[1:]] == want
    assert list(experiences.iter_passes(64, seeds=[])) == []


def test_a_batch_with_other_columns_is_refused(tmp_path):
    with ParquetExperienceWriter(tmp_path, SPACES) as w:
        w.write(cartpole_rows(5))
        wrong = cartpole_rows(5)
        wrong["obs"] = wrong["obs"].astype(np.float64)
        with pytest.raises(OfflineDataError, match="column 'obs' is <f4\\[4\\] there, <f8"):
            w.write(wrong)
    assert read_all(tmp_path).count == 5


# --------------------------------------------------------------------------------------
# RLlib's JSON lines
# --------------------------------------------------------------------------------------


def rllib_pack(array):
    """RLlib's compression.pack, as ray/rllib/utils/compression.py does it."""
    return base64.b64encode(lz4.frame.compress(pickle.dumps(array))).decode("ascii")


def test_json_round_trip(tmp_path):
    batches = [cartpole_rows(20, 0), cartpole_rows(13, 20, seed=5)]
    with JsonExperienceWriter(tmp_path, SPACES) as w:
        for batch in batches:
            w.write(batch)
    (path,) = tmp_path.glob("output-*.json")
    line = json.loads(path.read_text().splitlines()[0])
    assert line["type"] == "SampleBatch" and isinstance(line["obs"], str)  # packed
    assert isinstance(line["actions"], list)  # plain
    assert_same_rows(read_all(tmp_path), concat_samples(batches))


def rllib_sample_batch_line(batch):
    """A SampleBatch line as RLlib 2.x's JsonWriter writes it: obs and new_obs packed,
    the other arrays as lists, infos as they are."""
    plain = {k: batch[k].tolist() for k in batch if k not in ("obs", "new_obs", "infos")}
    infos = [{"step": i["step"], "x": 0.5} for i in batch["infos"]]
    line = {"type": "SampleBatch", **plain, "infos": infos}
    return {**line, "obs": rllib_pack(batch["obs"]), "new_obs": rllib_pack(batch["new_obs"])}


def test_a_hand_made_rllib_file_reads_back(tmp_path):
    """Lines built as RLlib's JsonWriter builds them, read with no manifest."""
    batches = [cartpole_rows(8), cartpole_rows(5, 8, seed=9)]
    path = tmp_path / "output-2024-01-01_worker-0_0.json"
    path.write_text("".join(json.dumps(rllib_sample_batch_line(b)) + "\n" for b in batches))
    got = read_all(path, spaces=SPACES)
    want = concat_samples(batches)
    assert sorted(got.keys()) == sorted(want.keys())
    for key in ("obs", "new_obs", "action_logp"):  # float32: packed, or listed (as float64)
        np.testing.assert_array_equal(got[key], want[key].astype(got[key].dtype))
    assert got["obs"].dtype == np.float32  # packed: the array's own dtype
    for key in ("actions", "eps_id", "t", "terminateds"):
        np.testing.assert_array_equal(got[key], want[key])
    assert got["infos"][11] == {"step": 11, "x": 0.5}


def test_a_hand_made_multi_agent_line_reads_back(tmp_path):
    rows = cartpole_rows(5, seed=9)
    line = {
        "type": "MultiAgentBatch",
        "count": 5,
        "policy_batches": {
            "pole": {
                "obs": rllib_pack(rows["obs"]),
                "actions": rows["actions"].tolist(),
                "rewards": rows["rewards"].tolist(),
                "dones": rows["terminateds"].tolist(),  # RLlib before 2.3
            }
        },
    }
    path = tmp_path / "output.json"
    path.write_text(json.dumps(line) + "\n")
    got = read_all(path, policy_id="pole")
    np.testing.assert_array_equal(got["obs"], rows["obs"])
    np.testing.assert_array_equal(got["terminateds"], rows["terminateds"])
    np.testing.assert_array_equal(got["rewards"], rows["rewards"])


def test_a_packed_column_that_calls_a_function_is_refused(tmp_path):
    marker = tmp_path / "MARKER"

    class Payload:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    evil = base64.b64encode(lz4.frame.compress(pickle.dumps(Payload()))).decode("ascii")
    path = tmp_path / "data.json"
    line = {"type": "SampleBatch", "obs": evil, "actions": [0], "rewards": [1.0]}
    path.write_text(json.dumps(line) + "\n")
    with pytest.raises(OfflineDataError) as err:
        open_experiences(path)
    message = str(err.value)
    assert "\n" not in message
    assert f"{path} line 1: column 'obs'" in message
    assert f"calling {os.system.__module__}.system" in message
    assert not marker.exists()


# --------------------------------------------------------------------------------------
# A writer killed mid-file
# --------------------------------------------------------------------------------------


def test_a_file_being_written_is_not_read(tmp_path):
    writer = ParquetExperienceWriter(tmp_path, SPACES, row_group_rows=10)
    writer.write(cartpole_rows(10))  # one row group in the open (temp) file
    (temp,) = (tmp_path / "default_policy").glob(".part-*")
    with pytest.raises(pa.ArrowInvalid):  # no footer yet
        pq.ParquetFile(temp)
    one_line_error("no Parquet .* files found", open_experiences, tmp_path)
    writer.close()
    assert not temp.exists()
    assert read_all(tmp_path).count == 10


KILLED_WRITER = """
import sys
sys.path.insert(0, "tests")  # as pytest runs this file: its helper modules import
from test_offline_io import SPACES, cartpole_rows
from policy_service.offline.parquet_writer import ParquetExperienceWriter
writer = ParquetExperienceWriter(sys.argv[1], SPACES, max_file_size=20000, row_group_rows=64)
i = 0
while True:
    writer.write(cartpole_rows(64, 64 * i, seed=i))
    i += 1
"""


@pytest.mark.slow
def test_a_killed_writer_leaves_no_file_a_reader_takes_as_whole(tmp_path):
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(tmp_path)], cwd=REPO, stderr=subprocess.PIPE
    )
    directory = tmp_path / "default_policy"
    try:  # stop it, with two files complete and a third being written, then kill it
        while True:
            assert child.poll() is None, child.stderr.read().decode()[-2000:]
            if len(list(directory.glob("part-*.parquet"))) >= 2:
                child.send_signal(signal.SIGSTOP)
                if list(directory.glob(".part-*.tmp-*")):
                    break
                child.send_signal(signal.SIGCONT)
            time.sleep(0.01)  # polling only: no outcome depends on it
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    complete = sorted(directory.glob("part-*.parquet"))
    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in complete)
    # the file it was writing: mostly without its footer (a stop between its footer and
    # its rename leaves it whole); a reader takes neither
    assert len(list(directory.glob(".part-*.tmp-*"))) == 1
    got = read_all(tmp_path)
    assert got.count == rows
    keys = np.sort(got["eps_id"] * 10 + got["t"])
    np.testing.assert_array_equal(keys, np.arange(rows))  # whole row groups, in order


# --------------------------------------------------------------------------------------
# Bad input: one line naming the file and the column
# --------------------------------------------------------------------------------------


def one_line_error(match, call, *args, **kwargs):
    with pytest.raises(OfflineDataError, match=match) as err:
        call(*args, **kwargs)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_a_corrupt_parquet_file_is_refused(tmp_path):
    with ParquetExperienceWriter(tmp_path, SPACES) as w:
        w.write(cartpole_rows(50))
    (path,) = (tmp_path / "default_policy").glob("*.parquet")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # truncated: no footer
    one_line_error(f"{path}: not a readable Parquet file", open_experiences, tmp_path)
    path.write_bytes(b"not parquet at all" * 10)
    one_line_error(f"{path}: not a readable Parquet file", open_experiences, tmp_path)


def test_a_json_line_missing_a_column_is_refused(tmp_path):
    path = tmp_path / "data.json"
    lines = [
        {"type": "SampleBatch", "obs": [[0.0] * 4], "actions": [1], "rewards": [1.0]},
        {"type": "SampleBatch", "obs": [[0.0] * 4], "rewards": [1.0]},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    one_line_error(f"{path} line 2: column 'actions' missing", open_experiences, path)
    lines[1]["actions"] = [0]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    open_experiences(path)  # complete now
    one_line_error(
        f"{path} line 1: column 'action_logp' missing",
        open_experiences,
        path,
        require=["action_logp"],
    )


def test_a_parquet_dataset_without_a_needed_column_is_refused(tmp_path):
    batch = cartpole_rows(5)
    del batch["action_logp"]
    with ParquetExperienceWriter(tmp_path, SPACES) as w:
        w.write(batch)
    open_experiences(tmp_path)
    one_line_error(
        "parquet: column 'action_logp' missing", open_experiences, tmp_path, require=["action_logp"]
    )


def test_manifest_spaces_that_disagree_are_refused(tmp_path):
    with ParquetExperienceWriter(tmp_path, SPACES) as w:
        w.write(cartpole_rows(5))
    given = {"default_policy": (OBS_SPACE, gym.spaces.Discrete(3))}
    one_line_error(
        f"{tmp_path / 'default_policy' / MANIFEST}: policy 'default_policy': action_space "
        "is Discrete\\(2\\) there, Discrete\\(3\\) given",
        open_experiences,
        tmp_path,
        spaces=given,
    )


def test_actions_outside_the_space_are_refused(tmp_path):
    big = cartpole_rows(20_000)
    big["actions"][12_345] = -1  # in the file's second chunk of rows
    with ParquetExperienceWriter(tmp_path / "big", SPACES) as w:
        w.write(big)
    one_line_error(
        "parquet: column 'actions': row 12345 holds -1, outside Discrete\\(2\\)",
        open_experiences,
        tmp_path / "big",
    )
    batch = cartpole_rows(40)
    batch["actions"][17] = 2
    with ParquetExperienceWriter(tmp_path / "pq", SPACES) as w:
        w.write(batch)
    one_line_error(
        "parquet: column 'actions': row 17 holds 2, outside Discrete\\(2\\)",
        open_experiences,
        tmp_path / "pq",
    )
    with JsonExperienceWriter(tmp_path / "json", SPACES) as w:
        w.write(batch)
    one_line_error(
        "json line 1: column 'actions': row 17 holds 2, outside Discrete",
        open_experiences,
        tmp_path / "json",
    )


def test_observations_of_another_shape_are_refused(tmp_path):
    path = tmp_path / "data.json"  # RLlib's, no manifest: the given spaces are checked
    line = {"type": "SampleBatch", "obs": rllib_pack(np.zeros((2, 3), np.float32)),
            "actions": [0, 1], "rewards": [1.0, 1.0]}  # fmt: skip
    path.write_text(json.dumps(line) + "\n")
    one_line_error(
        f"{path}: column 'obs': rows of shape \\[3\\], observation_space .* shape \\[4\\]",
        open_experiences,
        path,
        spaces=SPACES,
    )


def test_input_pointing_at_nothing_is_refused(tmp_path):
    one_line_error("no such file or directory", open_experiences, tmp_path / "missing")
    one_line_error("no Parquet .* files found", open_experiences, tmp_path)
    one_line_error("no Parquet .* files found", open_experiences, str(tmp_path / "*.parquet"))
    (tmp_path / "notes.txt").write_text("x")
    one_line_error("expected a .parquet or .json file", open_experiences, tmp_path / "notes.txt")


def test_a_glob_and_a_list_name_the_same_files(tmp_path):
    with ParquetExperienceWriter(tmp_path, SPACES, max_file_size=3000, row_group_rows=30) as w:
        for i in range(4):
            w.write(cartpole_rows(30, 30 * i, seed=i))
    files = sorted((tmp_path / "default_policy").glob("*.parquet"))
    assert len(files) >= 2
    by_glob = read_all(str(tmp_path / "*" / "*.parquet"))
    by_list = read_all(files)
    assert_same_rows(by_glob, by_list)
    assert by_list.count == 120


# --------------------------------------------------------------------------------------
# Through Ray Data
# --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_ray_data_reads_the_same_rows(tmp_path, ray_local):
    with ParquetExperienceWriter(tmp_path / "pq", SPACES, max_file_size=5000) as w:
        for i in range(4):
            w.write(cartpole_rows(100, 100 * i, seed=i))
            w.flush()
    with JsonExperienceWriter(tmp_path / "json", SPACES) as w:
        w.write(cartpole_rows(60))
    for directory, rows in ((tmp_path / "pq", 400), (tmp_path / "json", 60)):
        local = read_all(directory)
        remote = read_all(directory, num_readers=2)
        assert remote.count == rows
        order = np.argsort(remote["eps_id"] * 10 + remote["t"])
        in_order = {k: remote[k][order] for k in remote if k != "infos"}
        in_order["infos"] = [remote["infos"][i] for i in order]
        assert_same_rows(SampleBatch(in_order), local)


@pytest.mark.slow
def test_ray_data_passes_read_ahead_and_stop_their_reads(tmp_path, ray_local):
    """Through Ray Data, each pass of iter_passes holds every row once (its read started
    during the pass before); a pass closed mid-way and the iterator closed, the pass's
    read and the one read ahead are stopped: no thread left waiting, the CPUs free."""
    import threading

    import ray

    with ParquetExperienceWriter(tmp_path, SPACES, row_group_rows=50) as w:
        for i in range(4):
            w.write(cartpole_rows(100, 100 * i, seed=i))
            w.flush()
    experiences = open_experiences(tmp_path)
    keys = []
    for stream in experiences.iter_passes(64, seeds=[5, 6, 7], num_readers=2,
                                          shuffle_buffer_size=100):  # fmt: skip
        keys.append(sorted(sum(keys_of(stream), [])))
    assert keys == [list(range(400))] * 3
    passes = experiences.iter_passes(64, seeds=[None] * 3, num_readers=2)
    stream = next(passes)
    next(stream)
    reads = [stream._read, passes.gi_frame.f_locals["ahead"][2]]
    assert all(read._blocks.gi_frame is not None for read in reads)  # both executions open
    stream.close()
    passes.close()
    for read in reads:
        assert not read._thread.is_alive() and read._blocks.gi_frame is None  # closed
    assert not [t for t in threading.enumerate() if t.name == "StartedRead"]
    deadline = time.monotonic() + 60  # cancelled tasks give their CPUs back
    while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ray.available_resources().get("CPU", 0) == 2


# --------------------------------------------------------------------------------------
# A file RLlib's own JsonWriter wrote (in RLlib's virtualenv)
# --------------------------------------------------------------------------------------


@pytest.mark.rllib
@pytest.mark.slow
def test_a_file_written_by_rllibs_json_writer_reads_back(tmp_path):
    from benchmark_runs import peer_venv

    from benchmarks.harness import child_env
    from benchmarks.rllib_env import RLLIB_ENV

    python = peer_venv(".venv-rllib")
    out = subprocess.run(
        [python, "-c", RLLIB_WRITER, str(tmp_path)],
        env=child_env(RLLIB_ENV),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    written = json.loads(out.stdout.strip().splitlines()[-1])
    (path,) = tmp_path.glob("output-*.json")
    assert isinstance(json.loads(path.read_text().splitlines()[0])["obs"], str)  # packed
    experiences = open_experiences(path, spaces=SPACES, require=["action_logp"])
    for policy_id, name in (("default_policy", "single"), ("pole", "multi")):
        got = concat_samples(list(experiences.iter_batches(100, policy_id=policy_id)))
        want = written[name]
        assert sorted(got.keys()) == sorted(want.keys())
        assert got["infos"] == want["infos"]
        for key in ("obs", "new_obs"):  # packed: the very arrays, dtype and all
            assert got[key].dtype == np.dtype(want[key][1])
            np.testing.assert_array_equal(got[key], np.array(want[key][0], want[key][1]))
        for key in set(want) - {"obs", "new_obs", "infos"}:  # lists: the same values
            np.testing.assert_array_equal(got[key], np.array(want[key][0], want[key][1]))


# --------------------------------------------------------------------------------------
# The pieces: action checks and the shuffle buffer
# --------------------------------------------------------------------------------------


def test_actions_are_checked_against_each_kind_of_space():
    from policy_service.offline.space_checks import first_outside

    box = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    assert first_outside(box, np.array([[0, 1], [-1, 0.5]])) is None
    row, action = first_outside(box, np.array([[0, 1], [0, np.nan], [2, 0]]))
    assert row == 1 and np.isnan(action[1])  # NaN is outside any bound
    assert first_outside(box, np.zeros((3, 3)))[0] == 0  # wrong shape
    assert first_outside(gym.spaces.Discrete(3, start=1), np.array([1, 3, 0]))[0] == 2
    assert first_outside(gym.spaces.Discrete(3), np.array([0.0, 1.5]))[0] == 1
    assert first_outside(gym.spaces.MultiDiscrete([2, 3]), np.array([[1, 2], [1, 3]]))[0] == 1
    assert first_outside(gym.spaces.MultiBinary(2), np.array([[0, 1], [1, 1]])) is None
    nested = gym.spaces.Dict({"a": gym.spaces.Discrete(2), "b": box})
    actions = {"a": np.array([0, 1, 1]), "b": np.array([[0, 0], [0, 0], [5, 0]])}
    assert first_outside(nested, actions)[0] == 2


def rebatch(chunks, batch_size: int, shuffle_buffer_size: int = 0, rng=None):
    """The batches a ShuffleBuffer makes of `chunks`, as a reader takes them."""
    from policy_service.offline.shuffle import ShuffleBuffer

    buffer = ShuffleBuffer(batch_size, shuffle_buffer_size, rng)
    for chunk in chunks:
        buffer.add(chunk)
        while buffer.ready:
            yield buffer.ready.pop(0)
    buffer.drain()
    yield from buffer.ready


def test_the_shuffle_buffer_holds_a_bounded_number_of_rows():
    read = [0]

    def chunks():
        for start in range(0, 10_000, 700):
            chunk = {"x": np.arange(start, min(start + 700, 10_000))}
            read[0] += len(chunk["x"])
            yield chunk

    emitted, behind, xs = 0, [], []
    for batch in rebatch(chunks(), 100, shuffle_buffer_size=1000, rng=np.random.default_rng(0)):
        emitted += len(batch["x"])
        behind.append(read[0] - emitted)  # rows held: read but not yet handed out
        xs.append(batch["x"])
    assert max(behind) <= 1000 + 700 + 100
    assert sorted(np.concatenate(xs)) == list(range(10_000))
    assert emitted == 10_000 and all(len(x) == 100 for x in xs)
    in_order = list(rebatch(chunks(), 300))
    np.testing.assert_array_equal(np.concatenate([b["x"] for b in in_order]), np.arange(10_000))
    assert [len(b["x"]) for b in in_order][-1] == 10_000 % 300


def test_batches_in_order_copy_only_rows_that_span_chunks():
    """Without a shuffle buffer, a batch inside one chunk is a view of it, however the
    chunks before ended (a short chunk once made every later batch a copy)."""
    sizes = [8, 3, 8, 8, 5]
    starts = np.cumsum([0, *sizes])
    chunks = [{"x": np.arange(a, b)} for a, b in zip(starts, starts[1:])]
    batches = [b["x"] for b in rebatch(chunks, 4)]
    np.testing.assert_array_equal(np.concatenate(batches), np.arange(starts[-1]))
    assert [len(b) for b in batches] == [4] * 8
    views = [any(np.shares_memory(b, c["x"]) for c in chunks) for b in batches]
    # chunks hold rows 0-7, 8-10, 11-18, 19-26, 27-31: batches 8-11, 16-19, 24-27 span two
    spans = [len({int(np.searchsorted(starts, v, "right")) for v in b}) > 1 for b in batches]
    assert views == [not s for s in spans] and sum(spans) == 3


RLLIB_READER = """
import json, os, sys
os.environ["RLLIB_TEST_NO_TF_IMPORT"] = "1"
os.environ["RLLIB_TEST_NO_TORCH_IMPORT"] = "1"
from ray.rllib.offline.json_reader import JsonReader

out = []
for batch in JsonReader(sys.argv[1]).read_all_files():
    out.append({k: (v if k == "infos" else [v.tolist(), str(v.dtype)]) for k, v in batch.items()})
print(json.dumps(out))
"""


@pytest.mark.rllib
@pytest.mark.slow
def test_rllibs_json_reader_reads_our_json_files(tmp_path):
    from benchmark_runs import peer_venv

    from benchmarks.harness import child_env
    from benchmarks.rllib_env import RLLIB_ENV

    batches = [cartpole_rows(6), cartpole_rows(4, 6, seed=2)]
    with JsonExperienceWriter(tmp_path, SPACES) as w:
        for batch in batches:
            w.write(batch)
    (path,) = tmp_path.glob("output-*.json")
    out = subprocess.run(
        [peer_venv(".venv-rllib"), "-c", RLLIB_READER, str(path)],
        env=child_env(RLLIB_ENV),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    read = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(read) == 2
    for got, want in zip(read, batches):
        assert sorted(got) == sorted(want)
        for key in ("obs", "new_obs"):  # packed by us, unpacked by RLlib: same dtype
            assert got[key][1] == "float32"
        for key in set(want) - {"infos"}:
            np.testing.assert_array_equal(np.array(got[key][0], want[key].dtype), want[key])
        assert got["infos"] == [{"step": i["step"], "x": 0.5} for i in want["infos"]]


def test_a_packed_column_of_anything_but_arrays_is_refused(tmp_path):
    path = tmp_path / "data.json"
    for value, what in (({"a": [1]}, "a pickle of dict"), ("text", "a pickle of str")):
        line = {"type": "SampleBatch", "obs": rllib_pack(value), "actions": [0], "rewards": [1]}
        path.write_text(json.dumps(line) + "\n")
        one_line_error(f"column 'obs': the packed value is {what}", open_experiences, path)
    line = {"type": "SampleBatch", "obs": "bm90IGx6NA==", "actions": [0], "rewards": [1]}
    path.write_text(json.dumps(line) + "\n")  # base64, but not an LZ4 frame
    one_line_error("column 'obs': not a packed numpy array", open_experiences, path)


def test_offline_data_names_the_default_policy_as_the_multi_agent_package_does():
    """policy_service.offline sits below the multi-agent package (env runners write
    through it), so it keeps its own copy of the id."""
    from policy_service.multi_agent import policies
    from policy_service.offline import batches

    assert batches.DEFAULT_POLICY_ID == policies.DEFAULT_POLICY_ID

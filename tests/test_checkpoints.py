"""policy_service/io/checkpoints.py: atomic directories, policy state files,
the run's checkpoint listing and allow-listed class names."""

import json
import os

import gymnasium as gym
import numpy as np
import pytest

from policy_service import TFPolicy
from policy_service.io import checkpoints
from policy_service.io.space_codec import space_to_json

SPACES = {
    "observation_space": space_to_json(gym.spaces.Box(-1.0, 1.0, (3,))),
    "action_space": space_to_json(gym.spaces.Discrete(2)),
}


def test_atomic_directory_replaces_the_old_one_only_on_success(tmp_path):
    target = tmp_path / "ckpt"
    with checkpoints.atomic_directory(target) as tmp:
        (tmp / "a.txt").write_text("first")
    with pytest.raises(RuntimeError):
        with checkpoints.atomic_directory(target) as tmp:
            (tmp / "a.txt").write_text("second")
            raise RuntimeError("killed mid-write")
    assert (target / "a.txt").read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temp dir left


def test_policy_state_round_trips_arrays_and_json(tmp_path):
    state = {
        "weights": {"dense/kernel": np.arange(6, dtype=np.float32).reshape(2, 3)},
        "optimizer_variables": {"optimizer_0/0": np.array(3, np.int64)},
        "rng": {"action": np.array([1, 2, 3], np.int64)},
        "global_timestep": 7,
        "config": {"lr": 0.1},
        **SPACES,
    }
    checkpoints.write_policy_state(tmp_path / "p", dict(state))
    read = checkpoints.read_policy_state(tmp_path / "p")
    assert read["global_timestep"] == 7 and read["config"] == {"lr": 0.1}
    for group in checkpoints.ARRAY_GROUPS:
        assert list(read[group]) == list(state[group])
        for name, value in state[group].items():
            np.testing.assert_array_equal(read[group][name], value)
            assert read[group][name].dtype == value.dtype


def test_reading_never_unpickles(tmp_path):
    directory = tmp_path / "p"
    checkpoints.write_policy_state(
        directory,
        {
            "weights": {},
            "optimizer_variables": {},
            "rng": {},
            "global_timestep": 0,
            "config": {},
            **SPACES,
        },
    )
    np.savez(directory / checkpoints.POLICY_ARRAYS, **{"weights/x": np.array([object()])})
    with pytest.raises(ValueError, match="allow_pickle=False"):
        checkpoints.read_policy_state(directory)


def test_a_directory_without_a_policy_is_a_clear_error(tmp_path):
    with pytest.raises(checkpoints.CheckpointFileError, match="policy_state.json: missing"):
        checkpoints.read_policy_state(tmp_path)


def make_checkpoint(checkpoints_dir, iteration, complete=True):
    path = checkpoints.checkpoint_dir(checkpoints_dir, iteration)
    path.mkdir(parents=True)
    if complete:
        (path / checkpoints.ALGORITHM_STATE).write_text("{}")
    return path


def test_checkpoints_are_listed_by_iteration_and_only_when_complete(tmp_path):
    for iteration in (999_999, 1_000_000, 20):  # a name sort would put 1000000 first
        make_checkpoint(tmp_path, iteration)
    make_checkpoint(tmp_path, 2_000_000, complete=False)  # written halfway
    (tmp_path / ".checkpoint_000030.tmp-1").mkdir()  # a killed save's temp dir
    (tmp_path / "notes").mkdir()
    names = [p.name for p in checkpoints.list_checkpoints(tmp_path)]
    assert names == ["checkpoint_000020", "checkpoint_999999", "checkpoint_1000000"]
    assert checkpoints.latest_checkpoint(tmp_path).name == "checkpoint_1000000"
    assert checkpoints.latest_checkpoint(tmp_path / "missing") is None


class Saved(TFPolicy):
    """A policy class defined in this process."""


def test_class_paths_resolve_only_against_the_allow_list():
    assert checkpoints.class_path(Saved) == "test_checkpoints:Saved"
    assert checkpoints.resolve_class("test_checkpoints:Saved", TFPolicy) is Saved
    assert (
        checkpoints.resolve_class("policy_service.policy.tf_policy:TFPolicy", TFPolicy) is TFPolicy
    )
    # this package's classes load even when their module was not imported yet
    ppo_policy = checkpoints.resolve_class("algorithms.ppo:PPOPolicy", TFPolicy)
    assert issubclass(ppo_policy, TFPolicy) and ppo_policy.__name__ == "PPOPolicy"
    for bad in ("os:system", "json:JSONDecoder", "no_colon", 42):
        with pytest.raises(ValueError):
            checkpoints.resolve_class(bad, TFPolicy)


def test_file_names_come_from_one_place(tmp_path):
    assert checkpoints.checkpoint_dir(tmp_path, 7) == tmp_path / "checkpoint_000007"
    assert os.path.basename(checkpoints.POLICY_STATE) == "policy_state.json"


def _algorithm_state(**changes) -> dict:
    state = {
        "algorithm_class": "algorithms.ppo:PPO",
        "config": {},
        "iteration": 2,
        "timesteps_total": 10,
        "time_total_s": 1.5,
        "num_worker_restarts": 0,
        "episode_returns": [1.0, 2.5],
        "episode_lengths": [3, 4],
    }
    state.update(changes)
    return {k: v for k, v in state.items() if v is not None}


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "algorithm_state.json: not valid JSON"),
        ("[1]", "algorithm_state.json: expected a JSON object, got an array"),
        (json.dumps(_algorithm_state(iteration=None)), "key 'iteration' missing"),
        (
            json.dumps(_algorithm_state(iteration="2")),
            "'iteration' must be a number, got a string \"2\"",
        ),
        (json.dumps(_algorithm_state(iteration=True)), "'iteration' must be a number"),
        (json.dumps(_algorithm_state(iteration=-1)), "'iteration' must be >= 0, got -1"),
        (
            json.dumps(_algorithm_state(time_total_s=float("inf"))),
            "'time_total_s' must be a finite",
        ),
        (json.dumps(_algorithm_state(episode_lengths=[3, "x"])), "'episode_lengths' must hold"),
    ],
)
def test_a_broken_algorithm_state_is_one_line_naming_the_file(tmp_path, text, message):
    (tmp_path / checkpoints.ALGORITHM_STATE).write_text(text)
    with pytest.raises(checkpoints.CheckpointFileError) as err:
        checkpoints.read_algorithm_state(tmp_path)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).startswith(str(tmp_path / checkpoints.ALGORITHM_STATE))


def test_a_well_formed_algorithm_state_reads_back(tmp_path):
    (tmp_path / checkpoints.ALGORITHM_STATE).write_text(json.dumps(_algorithm_state()))
    assert checkpoints.read_algorithm_state(tmp_path) == _algorithm_state()


def test_policy_arrays_are_checked_as_they_are_read(tmp_path):
    directory = tmp_path / "p"
    state = {
        "weights": {"w": np.ones(2, np.float32)},
        "optimizer_variables": {},
        "rng": {},
        "global_timestep": 0,
        "config": {},
        **SPACES,
    }
    checkpoints.write_policy_state(directory, dict(state))
    arrays = directory / checkpoints.POLICY_ARRAYS
    np.savez(arrays, **{"weights/w": np.array([1.0, np.inf], np.float32)})
    with pytest.raises(checkpoints.CheckpointFileError, match="'weights/w' contains NaN or inf"):
        checkpoints.read_policy_state(directory)
    np.savez(arrays, **{"weights/w": np.ones(2), "stray": np.ones(1)})
    with pytest.raises(checkpoints.CheckpointFileError, match="array 'stray' is in no group"):
        checkpoints.read_policy_state(directory)
    arrays.write_bytes(arrays.read_bytes()[:40])
    with pytest.raises(checkpoints.CheckpointFileError, match="not a readable npz archive"):
        checkpoints.read_policy_state(directory)
    (directory / checkpoints.POLICY_STATE).unlink()
    with pytest.raises(FileNotFoundError, match="policy_state.json: missing"):
        checkpoints.read_policy_state(directory)  # still a FileNotFoundError, as before


# ----- the newest checkpoint that loads, and whose it is ------------------------------------


class _Mismatch(Exception):
    """A request no checkpoint could fit (evaluate --env with other spaces)."""


def _loader(errors: dict):
    """load(checkpoint): raises errors[checkpoint.name] if there is one, else its name."""

    def load(checkpoint):
        if checkpoint.name in errors:
            raise errors[checkpoint.name]
        return checkpoint.name.upper()

    return load


def test_newest_loadable_names_each_checkpoint_it_skips_and_why(tmp_path, capsys):
    found = [
        tmp_path / "checkpoint_000003",
        tmp_path / "checkpoint_000002",
        tmp_path / "checkpoint_000001",
    ]
    load = _loader(
        {
            "checkpoint_000003": checkpoints.CheckpointFileError("a.json: missing"),
            "checkpoint_000002": KeyError("other"),
        }
    )
    assert checkpoints.newest_loadable(found, load, "run", skipped=(KeyError,)) == (
        found[2],
        "CHECKPOINT_000001",
    )
    assert capsys.readouterr().err.splitlines() == [
        "policy-service: skipped checkpoint_000003: a.json: missing; trying checkpoint_000002",
        "policy-service: skipped checkpoint_000002: 'other'; trying checkpoint_000001",
    ]
    with pytest.raises(KeyError):  # not skipped unless asked
        checkpoints.newest_loadable(found[1:], load, "run")


def test_newest_loadable_gives_up_in_one_line_or_at_a_fatal_error(tmp_path, capsys):
    found = [tmp_path / "checkpoint_000002", tmp_path / "checkpoint_000001"]
    broken = _loader(
        {
            name: checkpoints.CheckpointFileError(f"{name}/x.npz: empty file")
            for name in ("checkpoint_000002", "checkpoint_000001")
        }
    )
    with pytest.raises(
        checkpoints.CheckpointFileError,
        match=(
            r"^--resume run: no checkpoint loads; checkpoint_000001: "
            r"checkpoint_000001/x.npz: empty file$"
        ),
    ):
        checkpoints.newest_loadable(found, broken, "--resume run")
    with pytest.raises(checkpoints.CheckpointFileError, match=r"^checkpoint_000001/x.npz: empty"):
        checkpoints.newest_loadable(found[1:], broken, "run")  # a lone one: its own error
    with pytest.raises(checkpoints.MissingCheckpointFile, match=r"^run: no checkpoint$"):
        checkpoints.newest_loadable([], broken, "run")
    capsys.readouterr()
    mismatch = _loader({"checkpoint_000002": _Mismatch("env 'X' does not fit")})
    with pytest.raises(_Mismatch):
        checkpoints.newest_loadable(
            found, mismatch, "run", skipped=(Exception,), fatal=(_Mismatch,)
        )
    assert capsys.readouterr().err == ""


class Writer:
    """An algorithm class that wrote a checkpoint (only its class path is read)."""


class Other:
    """Another algorithm class."""


def test_an_algorithm_state_written_by_another_class_is_refused_naming_both(tmp_path):
    state = _algorithm_state(algorithm_class="test_checkpoints:Writer")
    (tmp_path / checkpoints.ALGORITHM_STATE).write_text(json.dumps(state))
    assert checkpoints.read_algorithm_state(tmp_path, Writer) == state
    with pytest.raises(checkpoints.CheckpointFileError) as err:
        checkpoints.read_algorithm_state(tmp_path, Other)
    assert str(err.value) == (
        f"{tmp_path / checkpoints.ALGORITHM_STATE}: written by "
        "test_checkpoints:Writer, not test_checkpoints:Other"
    )

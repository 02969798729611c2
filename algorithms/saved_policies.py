"""A checkpoint's saved policies, read: where they are, their state checked file by
file, rebuilt on one CPU tower, and the environment the checkpoint names (never
imported because a file said so). What evaluate, export and serve load from; the
single- and multi-agent paths both build on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from policy_service.errors import UserError, one_line
from policy_service.io.checkpoints import (
    ALGORITHM_STATE,
    POLICY_STATE,
    POLICY_SUBDIR,
    CheckpointFileError,
    list_checkpoints,
    policy_state_dir,
    read_algorithm_state,
    read_policy_state,
)


class CheckpointError(UserError):
    """The checkpoint cannot be found or read, or the request does not fit it."""


class EnvironmentMismatch(CheckpointError):
    """The environment asked for does not fit the policy (not the checkpoint's fault)."""


class EnvironmentNotAllowed(CheckpointError):
    """The checkpoint names an environment that would need a module imported for it."""


class PolicyChoiceError(CheckpointError):
    """--policy is missing or unknown for a multi-agent checkpoint (or given for a
    single-agent one): the request, not the checkpoint, is wrong."""


@dataclass
class LoadedCheckpoint:
    """Where a policy was found, and the training config it came with (if any)."""

    policy_dir: Path
    algorithm_config: dict | None  # from algorithm_state.json; None for a bare policy
    config_file: Path | None = None  # the algorithm_state.json it came from
    policy_id: str | None = None  # a multi-agent checkpoint's policy, chosen by --policy
    agent_policy_ids: dict | None = None  # a multi-agent checkpoint's: agent -> policy id


def checkpoint_candidates(path: str) -> list[Path]:
    """The checkpoints `path` points to, newest first: one for a checkpoint or policy
    directory, every complete one for a run directory or its checkpoints/."""
    directory = Path(path)
    if not directory.is_dir():
        raise CheckpointError(f"no checkpoint at {path}: not a directory")
    if (directory / POLICY_STATE).exists() or (directory / ALGORITHM_STATE).exists():
        return [directory]
    for checkpoints in (directory / "checkpoints", directory):
        found = list_checkpoints(checkpoints)
        if found:
            return found[::-1]
    raise CheckpointError(
        f"no checkpoint at {path}: expected a run directory, a checkpoint "
        f"({ALGORITHM_STATE}) or a policy directory ({POLICY_STATE})"
    )


def locate(path: str) -> LoadedCheckpoint:
    """Find the policy directory (and the algorithm config) of the newest checkpoint."""
    return locate_one(checkpoint_candidates(path)[0])


def locate_one(directory: Path, policy_id: str | None = None) -> LoadedCheckpoint:
    """The policy directory and algorithm config of one checkpoint or policy directory;
    `policy_id` chooses a multi-agent checkpoint's policy (and only there)."""
    if (directory / ALGORITHM_STATE).exists():
        saved = _read_state(directory)
        ids = saved.get("policy_ids")
        if ids is None and policy_id is None:
            return LoadedCheckpoint(
                directory / POLICY_SUBDIR, saved["config"], directory / ALGORITHM_STATE
            )
        choose_policy(directory, ids, policy_id)
        assert policy_id is not None
        return LoadedCheckpoint(
            policy_state_dir(directory, policy_id),
            saved["config"],
            directory / ALGORITHM_STATE,
            policy_id,
            saved.get("agent_policy_ids", {}),
        )
    choose_policy(directory, None, policy_id)
    parent_state = directory.parent / ALGORITHM_STATE
    if not parent_state.exists():
        return LoadedCheckpoint(directory, None)
    return LoadedCheckpoint(directory, _read_state(directory.parent)["config"], parent_state)


def choose_policy(checkpoint: Path, ids: list | None, policy_id: str | None) -> None:
    """`policy_id` is one of a multi-agent checkpoint's `ids`, or None for a
    single-agent one (ids None); else PolicyChoiceError listing the ids."""
    if ids is None and policy_id is not None:
        raise PolicyChoiceError(
            f"--policy {policy_id}: {checkpoint} holds one policy (no policy ids); drop --policy"
        )
    if ids is not None and policy_id not in ids:
        asked = "no --policy" if policy_id is None else f"--policy {policy_id} is not one of them"
        raise PolicyChoiceError(
            f"{checkpoint} is a multi-agent checkpoint of policies {sorted(ids)}: {asked}; "
            f"pass --policy ID"
        )


def load_policy(checkpoint: LoadedCheckpoint):
    """The saved policy, weights and all, on one CPU tower."""
    return policy_from_state(saved_policy_state(checkpoint), checkpoint.policy_dir)


def saved_policy_state(checkpoint: LoadedCheckpoint) -> dict:
    """The saved policy state (config, spaces, arrays), every file checked, nothing built."""
    try:
        return read_policy_state(checkpoint.policy_dir)
    except (OSError, ValueError, KeyError) as err:
        raise CheckpointError(
            one_line(err)
            if isinstance(err, CheckpointFileError)
            else f"cannot read the policy in {checkpoint.policy_dir}: {one_line(err)}"
        ) from None


def policy_from_state(state: dict, policy_dir: Path | None = None):
    """A policy state rebuilt on one CPU tower; a state that does not fit its own
    config or spaces (an unknown config key, arrays of another shape) is a
    CheckpointError naming the policy directory."""
    from policy_service.config import on_cpu
    from policy_service.policy.tf_policy import TFPolicy

    try:
        state = {**state, "config": on_cpu(state["config"])}
        return TFPolicy.from_state(state)
    except (ValueError, KeyError, TypeError) as err:
        where = policy_dir or "the saved policy"
        raise CheckpointError(
            f"{where} ({POLICY_STATE}, policy_arrays.npz) does not load: {one_line(err)}"
        ) from None


def environment_of(checkpoint: LoadedCheckpoint, env: str | None) -> tuple[str, dict]:
    config = checkpoint.algorithm_config or {}
    env_id = env or config.get("env")
    if not env_id:
        raise CheckpointError(
            f"{checkpoint.policy_dir} does not say which environment it was trained on: pass --env"
        )
    if env is None:  # named by the checkpoint's file, not by the user
        from algorithms import environments

        try:
            environments.check_env_from_file(env_id, checkpoint.config_file)
        except environments.EnvironmentSetupError as err:
            raise EnvironmentNotAllowed(str(err)) from None
    env_config = (config.get("env_config") or {}) if env_id == config.get("env") else {}
    return env_id, env_config


def _read_state(checkpoint: Path) -> dict:
    try:
        return read_algorithm_state(checkpoint)
    except CheckpointFileError as err:
        raise CheckpointError(one_line(err)) from None

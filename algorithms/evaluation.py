"""Evaluate or export the policy of a training checkpoint, in this process.

    evaluate("runs/ppo-CartPole-v1-.../", episodes=10)   # prints one JSON line
    export("runs/.../checkpoints/checkpoint_000020", "exported/")  # a SavedModel

CHECKPOINT may be a run directory (its newest checkpoint that loads is used:
each newer one that does not is named on stderr with the reason), its
checkpoints/ directory, one checkpoint (what Algorithm.save writes:
algorithm_state.json and the policy/ sub-dir), or a policy directory written
by TFPolicy.export_checkpoint. The policy is rebuilt on one CPU tower: acting
needs no towers, and a checkpoint trained on GPUs must load where there are none.
A multi-agent checkpoint (policies/<policy id>/) needs `policy_id` (--policy).
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np

if TYPE_CHECKING:  # imported where used: evaluating needs TensorFlow, checking does not
    import gymnasium as gym

    from policy_service.multi_agent.env import MultiAgentEnv
    from policy_service.policy.tf_policy import TFPolicy

from algorithms import multi_agent_evaluation
from algorithms.saved_policies import (
    CheckpointError,
    EnvironmentMismatch,
    EnvironmentNotAllowed,
    LoadedCheckpoint,
    PolicyChoiceError,
    checkpoint_candidates,
    environment_of,
    locate_one,
    policy_from_state,
    saved_policy_state,
)
from policy_service.data import env_actions
from policy_service.envs.atari import SCREEN_SIZE
from policy_service.errors import UserError, one_line
from policy_service.io.checkpoints import (
    ALGORITHM_STATE,
    POLICY_STATE,
    CheckpointFileError,
    is_checkpoint_name,
    newest_loadable,
    refuse_links_out_of,
)


class ExportTargetError(UserError):
    """`export --out` names something that must not be replaced, or cannot be."""


@dataclass
class ReadyPolicy:
    """A checkpoint's policy, rebuilt, with the environment it will act in (if any)."""

    checkpoint: LoadedCheckpoint
    policy: TFPolicy
    environment: gym.Env | MultiAgentEnv | None = None
    env_id: str | None = None
    policies: dict | None = None  # a multi-agent checkpoint's: id -> policy its agents act with


def load_newest_valid(
    path: str,
    env: str | None = None,
    with_env: bool = True,
    policy_id: str | None = None,
) -> ReadyPolicy:
    """The newest checkpoint under `path` that loads (`policy_id`'s policy, of a
    multi-agent one); each one skipped is named on stderr with the reason. A request
    that fits none (--env, --policy) is not a reason to skip."""
    root = Path(path).absolute()
    if (root / POLICY_STATE).exists() and (root.parent / ALGORITHM_STATE).exists():
        root = root.parent  # a checkpoint's policy/ directory: its checkpoint is read too
    if root.parent.name == "checkpoints" and is_checkpoint_name(root.name):
        root = root.parent.parent  # one checkpoint of a run: the run's files only
    return newest_loadable(
        checkpoint_candidates(path),
        lambda directory: _load(directory, env, with_env, root, policy_id),
        path,
        skipped=(CheckpointError,),
        fatal=(EnvironmentMismatch, EnvironmentNotAllowed, PolicyChoiceError),
    )[1]


def _load(
    directory: Path, env: str | None, with_env: bool, root: Path, policy_id: str | None
) -> ReadyPolicy:
    try:  # symlinks out of what was named would mix in another run's files
        refuse_links_out_of(directory, root)
    except CheckpointFileError as err:
        raise CheckpointError(one_line(err)) from None
    checkpoint = locate_one(directory, policy_id)
    state = saved_policy_state(checkpoint)
    if not with_env:
        return ReadyPolicy(checkpoint, policy_from_state(state, checkpoint.policy_dir))
    if checkpoint.agent_policy_ids is not None:
        multi_env, policies = multi_agent_evaluation.load_multi_agent(checkpoint, env)
        assert checkpoint.policy_id is not None
        chosen = policies.get(checkpoint.policy_id) or policy_from_state(state)
        env_name = env or (checkpoint.algorithm_config or {}).get("env")
        return ReadyPolicy(checkpoint, chosen, multi_env, env_name, policies)
    env_id, env_config = environment_of(checkpoint, env)
    trained_with = checkpoint.algorithm_config or {}
    environment = make_env(
        env_id,
        env_config,
        trained_with.get("preprocessor_pref", "deepmind"),
        (trained_with.get("model") or {}).get("dim", SCREEN_SIZE),
    )
    try:
        trained_on = (checkpoint.algorithm_config or {}).get("env")
        check_spaces_fit(
            state, environment, env_id, asked_for=env is not None and env != trained_on
        )
        policy = policy_from_state(state, checkpoint.policy_dir)
    except BaseException:
        environment.close()
        raise
    return ReadyPolicy(checkpoint, policy, environment, env_id)


def check_spaces_fit(state: dict, environment, env_id: str, asked_for: bool = True) -> None:
    """The env's observation and action spaces are the ones the policy was built for.
    A mismatch is EnvironmentMismatch when the env was `asked_for` (--env), else the
    checkpoint's own spaces changed: a CheckpointError."""
    from policy_service.io.space_codec import space_from_json

    mismatches = []
    for name, env_space in (
        ("observation_space", environment.observation_space),
        ("action_space", environment.action_space),
    ):
        try:
            policy_space = space_from_json(state[name])
        except (KeyError, ValueError, TypeError) as err:
            raise CheckpointError(
                f"cannot read {name} of the saved policy: {one_line(err)}"
            ) from None
        if env_space != policy_space:
            mismatches.append(f"{name} {env_space} (the policy's: {policy_space})")
    if mismatches:
        error = EnvironmentMismatch if asked_for else CheckpointError
        raise error(
            one_line(
                f"environment {env_id!r} does not fit the saved policy: {'; '.join(mismatches)}"
            )
        )


def run_episodes(policy, env, episodes: int, explore: bool, seed: int) -> dict:
    """Play `episodes` episodes (env seeded seed, seed+1, ...) -> returns and lengths."""
    returns, lengths = [], []
    # the env gets what env runners send (normalize_actions, clip_actions)
    env_action_rule = env_actions.EnvActionRule.of(policy.action_space, policy.config)
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        state = policy.get_initial_state() if policy.is_recurrent() else None
        prev_action, prev_reward = None, 0.0
        total, steps, done = 0.0, 0, False
        while not done:
            if policy.is_recurrent():
                if prev_action is None:
                    prev_action = np.zeros_like(np.asarray(env.action_space.sample()))
                action, state, _ = policy.compute_single_action(
                    obs, state, explore=explore, prev_action=prev_action, prev_reward=prev_reward
                )
            else:
                action, _, _ = policy.compute_single_action(obs, explore=explore)
            obs, reward, terminated, truncated, _ = env.step(env_action_rule.single_to_env(action))
            total += float(reward)
            steps += 1
            prev_action, prev_reward = action, float(reward)
            done = terminated or truncated
        returns.append(total)
        lengths.append(steps)
    return {"episode_returns": returns, "episode_lengths": lengths}


def evaluation_seed(run_seed: int | None) -> int:
    """The seed of episode 0 of a run's evaluations (algorithms/periodic_evaluation.py)
    and of evaluate's without --seed: the run's seed, else 0."""
    return 0 if run_seed is None else int(run_seed)


def evaluate(
    path: str,
    episodes: int = 10,
    env: str | None = None,
    explore: bool = False,
    seed: int | None = None,
    policy_id: str | None = None,
) -> int:
    """Run episodes with the checkpoint's policy; print one JSON line of statistics.
    Episode i is seeded seed + i; without `seed`, the seed the run's evaluations used
    (evaluation_seed), so a greedy evaluate of an evaluated iteration's checkpoint gives
    that evaluation's returns. A multi-agent checkpoint plays every agent with its
    policy; `policy_id` (required there) is the one reported, beside each policy's mean
    return (policy_reward_mean)."""
    if episodes < 1:
        raise CheckpointError(f"--episodes must be >= 1, got {episodes}")
    if env is not None:  # named once here, not blamed on each checkpoint in turn
        from algorithms import environments

        environments.check_env_id(env)
    ready = load_newest_valid(path, env, policy_id=policy_id)
    checkpoint, env_id, environment = ready.checkpoint, ready.env_id, ready.environment
    assert environment is not None  # loaded with_env
    if seed is None:
        seed = evaluation_seed((checkpoint.algorithm_config or {}).get("seed"))
    multi_agent = {}
    try:
        if ready.policies is not None:
            assert checkpoint.agent_policy_ids is not None
            played = multi_agent_evaluation.run_multi_agent_episodes(
                ready.policies,
                multi_agent_evaluation.recorded_mapping(checkpoint.agent_policy_ids),
                cast("MultiAgentEnv", environment),
                episodes,
                explore,
                seed,
            )
            multi_agent = {
                "policy": policy_id,
                "policy_reward_mean": {
                    p: float(np.mean(r)) for p, r in played["policy_episode_returns"].items()
                },
            }
        else:
            played = run_episodes(ready.policy, environment, episodes, explore, seed)
    finally:
        environment.close()
    returns = np.asarray(played["episode_returns"])
    lengths = np.asarray(played["episode_lengths"])
    print(
        json.dumps(
            {
                "checkpoint": str(
                    checkpoint.policy_dir.parent
                    if checkpoint.algorithm_config
                    else checkpoint.policy_dir
                ),
                "env": env_id,
                "episodes": episodes,
                "explore": explore,
                "seed": seed,
                "episode_return_mean": float(returns.mean()),
                "episode_return_min": float(returns.min()),
                "episode_return_max": float(returns.max()),
                "episode_len_mean": float(lengths.mean()),
                "episode_lengths": [int(n) for n in lengths],
                "episode_returns": [float(r) for r in returns],
                **multi_agent,
            }
        ),
        flush=True,
    )
    return 0


def export(
    path: str,
    out: str,
    onnx_opset: int | None = None,
    force: bool = False,
    policy_id: str | None = None,
) -> int:
    """Write the checkpoint's policy (`policy_id`'s, of a multi-agent one) as a
    SavedModel in `out` (and model.onnx with an opset). Something already at `out` is
    replaced only with `force`, and then whole: the export is written beside it and
    renamed over it, so a failed export leaves it."""
    if onnx_opset is not None and importlib.util.find_spec("tf2onnx") is None:
        raise CheckpointError("ONNX export needs tf2onnx: pip install 'policy-service[onnx]'")
    if onnx_opset is not None:
        from policy_service.io.export import check_onnx_opset

        try:
            check_onnx_opset(onnx_opset)
        except ValueError as err:
            raise ExportTargetError(f"--onnx {onnx_opset}: {err}") from None
    check_export_target(out, force)
    policy = load_newest_valid(path, with_env=False, policy_id=policy_id).policy
    policy.export_model(out, onnx=onnx_opset)
    print(
        f"SavedModel: {Path(out).absolute()}"
        + (f" (with model.onnx, opset {onnx_opset})" if onnx_opset is not None else "")
    )
    return 0


def check_export_target(out: str, force: bool) -> None:
    """`out` is free for an export: missing or an empty directory, or anything with
    `force`; its parent, when it exists, is a directory."""
    target = Path(out)
    if target.is_symlink() or target.exists():
        if target.is_dir() and not target.is_symlink():
            if force or not any(target.iterdir()):
                return
            found = "a non-empty directory"
        else:
            found = "a symlink" if target.is_symlink() else "a file"
            if force:
                return
        raise ExportTargetError(
            f"--out {out}: expected a new or empty directory, found "
            f"{found}; pass --force to replace it"
        )
    parent = target.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ExportTargetError(f"--out {out}: {parent} is a file, expected a directory")


def make_env(env_id: str, env_config: dict, preprocessor_pref: str | None, dim: int = SCREEN_SIZE):
    """The env the checkpoint's policy plays, preprocessed as it was in training."""
    import gymnasium as gym

    from algorithms import environments

    try:
        maker = environments.env_maker(env_id, preprocessor_pref, dim)
        return gym.make(maker, **env_config) if isinstance(maker, str) else maker(env_config)
    except (gym.error.Error, ImportError, ModuleNotFoundError) as err:
        raise CheckpointError(f"unknown environment {env_id!r}: {one_line(err)}") from None

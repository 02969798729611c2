"""`policy-service import-rllib CHECKPOINT --algo ALGO --env ENV --out DIR`: an RLlib
old-stack checkpoint as a run directory here.

DIR gets what `train` would have written after the checkpoint's iteration: config.json
and run.json, and checkpoints/checkpoint_NNNNNN/ with the policy (RLlib's weights mapped
onto the model here, its global timestep and observation filter) and
algorithm_state.json (iteration and env steps as RLlib counted them). So `evaluate`,
`export`, `serve` and `train --resume DIR` take it. The config is RLlib's model and
training keys that ALGO has here, over ALGO's defaults. RLlib's pickles are read as data
(io/safe_pickle.py): nothing of RLlib's is imported, nothing in a file is run. The
optimizer starts afresh: RLlib's Adam slots are not carried over.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from algorithms.evaluation import make_env
from policy_service.cli.run_config import algorithm_class, validate_config
from policy_service.cli.training import DEFAULT_CHECKPOINT_EVERY, DEFAULT_KEEP_CHECKPOINTS
from policy_service.envs.atari import SCREEN_SIZE
from policy_service.errors import UserError, one_line
from policy_service.io import checkpoints
from policy_service.io.rllib_checkpoint import read_rllib_checkpoint
from policy_service.policy.rllib_import import config_from_rllib
from policy_service.runs.run_directory import RunDirectory, json_safe


class ImportSetupError(UserError):
    """The import's arguments do not fit (--out taken, a weight map unreadable)."""


def import_rllib(
    checkpoint: str,
    *,
    algo: str,
    env: str,
    out: str,
    policy_id: str | None = None,
    weight_map_file: str | None = None,
) -> int:
    """Write the run directory `out` from the RLlib checkpoint -> exit status 0."""
    algo_cls = algorithm_class(algo)
    run_dir = RunDirectory(out)
    if run_dir.exists() or run_dir.checkpoints.exists():
        raise ImportSetupError(f"--out {out} already holds a run; choose another directory")
    run_dir.check_writable()
    weight_map = read_weight_map(weight_map_file)
    rllib = read_rllib_checkpoint(checkpoint, policy_id)
    defaults = validate_config(algo_cls, {"env": env})
    rllib_model = rllib.config.get("model")
    dim = rllib_model.get("dim") if isinstance(rllib_model, dict) else None
    environment = make_env(env, {}, defaults.get("preprocessor_pref"), dim or SCREEN_SIZE)
    obs_space, act_space = environment.observation_space, environment.action_space
    environment.close()
    derived = config_from_rllib(rllib, set(defaults), tuple(obs_space.shape or ()))
    config = validate_config(algo_cls, {**derived, "env": env})
    policy = algo_cls.policy_class.from_rllib_checkpoint(
        checkpoint,
        rllib.policy_id if policy_id is None else policy_id,
        config=config,
        weight_map=weight_map,
        observation_space=obs_space,
        action_space=act_space,
    )
    state = policy.get_state()
    target = run_dir.checkpoint_path(rllib.iteration)
    with checkpoints.atomic_directory(target) as tmp:
        checkpoints.write_policy_state(tmp / checkpoints.POLICY_SUBDIR, state)
        checkpoints.save_json(
            tmp / checkpoints.ALGORITHM_STATE,
            {
                "algorithm_class": checkpoints.class_path(algo_cls),
                "config": config,
                "iteration": rllib.iteration,
                "timesteps_total": rllib.timesteps_total or rllib.global_timestep,
                "num_samples_trained_total": 0,
                "time_total_s": 0.0,
                "num_worker_restarts": 0,
                "episode_returns": [],
                "episode_lengths": [],
                "algorithm_values": {},
                "algorithm_arrays": {},
            },
        )
    run_dir.create(
        json_safe(config),
        {
            "algorithm": algo.lower(),
            "stop": {},
            "checkpoint_every": DEFAULT_CHECKPOINT_EVERY,
            "keep_checkpoints": DEFAULT_KEEP_CHECKPOINTS,
            "imported_from": str(Path(checkpoint).absolute()),
        },
    )
    count = len(rllib.weights) or len(rllib.ordered_weights or [])
    print(
        f"imported {rllib.policy_id} of {checkpoint} (iteration {rllib.iteration}, "
        f"{count} weights, global timestep {rllib.global_timestep}) into {target}",
        file=sys.stderr,
    )
    print(target)
    return 0


def read_weight_map(path: str | None) -> dict[str, str | None] | None:
    """--weight-map FILE: a JSON object {RLlib variable name: ours, or null to leave it}."""
    if path is None:
        return None
    try:
        value = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ImportSetupError(
            f"--weight-map {path}: not readable JSON ({one_line(err)})"
        ) from None
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in value.items()
    ):
        raise ImportSetupError(
            f"--weight-map {path}: expected a JSON object of RLlib name -> our name or null"
        )
    return value

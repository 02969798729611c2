"""RLlib's old-stack TF PPO policy behind a pipe, for tests/test_ppo_rllib.py.

Runs in RLlib's own virtualenv (never in ours), with Keras 2 (tf_keras), as RLlib's
TF stack requires. Reads one JSON request per line on stdin (rllib_wire), answers
one JSON line on stdout, until stdin closes.

    {"op": "build", "model": {...}, "training": {...}}  -> RLlib's weight names and shapes
    {"op": "set_weights", "weights": {name: array}}     -> RLlib's names echoed
    {"op": "loss", "batch": {...}}       -> {"stats": learner stats, "grads": {name: array}}
                                            (compute_gradients: nothing is applied)
    {"op": "postprocess", "batch": {...}} -> the trajectory after postprocess_trajectory
    {"op": "standardize", "batch": {...}} -> advantages after PPO's standardize_fields
    {"op": "update_kl", "kls": [...]}    -> the coefficient after each update_kl call
    answer: {"ok": result} or {"error": "ExceptionType: message"}

One policy lives at a time; "build" replaces it.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gymnasium as gym
import numpy as np
import rllib_wire
import tensorflow as tf
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.algorithms.ppo.ppo_tf_policy import PPOTF1Policy
from ray.rllib.execution.rollout_ops import standardize_fields
from ray.rllib.policy.sample_batch import SampleBatch

tf.compat.v1.disable_eager_execution()  # RLlib's "tf" framework: static graphs

STATE = {}


def op_build(request: dict):
    config = (
        PPOConfig()
        .api_stack(enable_rl_module_and_learner=False, enable_env_runner_and_connector_v2=False)
        .framework("tf")
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0)
        .training(model=request["model"], **request.get("training", {}))
    )
    STATE.pop("policy", None)
    tf.compat.v1.reset_default_graph()  # a rebuilt policy reuses RLlib's variable names
    obs_space = gym.spaces.Box(-np.inf, np.inf, tuple(request["obs_shape"]), np.float32)
    policy = PPOTF1Policy(obs_space, gym.spaces.Discrete(request["num_actions"]), config.to_dict())
    STATE["policy"] = policy
    return {name: list(value.shape) for name, value in policy.get_weights().items()}


def op_set_weights(request: dict):
    policy = STATE["policy"]
    current = policy.get_weights()
    missing = sorted(set(current) - set(request["weights"]))
    if missing:
        raise KeyError(f"weights for {missing} missing")
    policy.set_weights({k: np.asarray(request["weights"][k], np.float32) for k in current})
    return sorted(current)


def op_loss(request: dict):
    policy = STATE["policy"]
    grads, info = policy.compute_gradients(SampleBatch(request["batch"]))
    names = [v.name.split(":")[0] for g, v in policy._grads_and_vars if g is not None]
    return {
        "stats": {
            k: float(v)
            for k, v in info["learner_stats"].items()
            if np.ndim(v) == 0 and not isinstance(v, dict)
        },
        "grads": dict(zip(names, grads)),
    }


def op_postprocess(request: dict):
    batch = STATE["policy"].postprocess_trajectory(SampleBatch(request["batch"]))
    return {k: np.asarray(batch[k]) for k in ("advantages", "value_targets")}


def op_standardize(request: dict):
    batch = standardize_fields(SampleBatch(request["batch"]), ["advantages"])
    return np.asarray(batch["advantages"])


def op_update_kl(request: dict):
    policy = STATE["policy"]
    return [float(policy.update_kl(kl)) for kl in request["kls"]]


OPS = {
    "build": op_build,
    "set_weights": op_set_weights,
    "loss": op_loss,
    "postprocess": op_postprocess,
    "standardize": op_standardize,
    "update_kl": op_update_kl,
}


def main() -> None:
    rllib_wire.serve(OPS)


if __name__ == "__main__":
    main()

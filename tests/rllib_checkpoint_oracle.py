"""RLlib's old-stack PPO (TF) trained one iteration and saved, with what its policy
then does on 1,000 observations: for tests/test_rllib_import.py.

Runs in RLlib's own virtualenv (never in ours), with Keras 2 (tf_keras), as RLlib's
TF stack requires:

    python rllib_checkpoint_oracle.py OUT FRAMEWORK:KIND [FRAMEWORK:KIND ...]

For each FRAMEWORK ("tf": static graph, "tf2": eager) and KIND (mlp, mlp_shared, lstm,
cnn; mlp_box: Pendulum, free_log_std) it writes OUT/FRAMEWORK/KIND/checkpoint
(algo.save) and OUT/FRAMEWORK/KIND/expected.npz: the observations (raw, as
the env gives them; cnn's as uint8, each divided by 255 on both sides), the greedy
actions and action distribution inputs of RLlib's policy on them (after its
observation filter, as its env runner applies it), and for the LSTM the states,
previous actions and rewards fed in and the states given back; and RLlib's Adam state
for the first layer's kernel (its two moments, in expected.npz; its step, in
expected.json). The "tf2" policies are built first: once a "tf" policy has built its
graph, tf_keras can no longer build an eager one in the same process.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import json

import numpy as np
import rllib_image_env
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.policy.sample_batch import SampleBatch
from ray.tune.registry import register_env

ROWS = 1000
CELL = 32
KINDS = {
    "mlp": ("CartPole-v1", {"fcnet_hiddens": [32, 32]}, "MeanStdFilter"),
    "mlp_shared": ("CartPole-v1", {"fcnet_hiddens": [32, 32], "vf_share_layers": True}, None),
    "lstm": (
        "CartPole-v1",
        {
            "fcnet_hiddens": [32],
            "use_lstm": True,
            "lstm_cell_size": CELL,
            "lstm_use_prev_action": True,
            "lstm_use_prev_reward": True,
            "max_seq_len": 10,
        },
        None,
    ),
    "cnn": ("ImageTarget", {}, None),
    "mlp_box": ("Pendulum-v1", {"fcnet_hiddens": [32], "free_log_std": True}, None),
}


def observations(kind: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(what is stored, what the policy sees before its filter)."""
    if kind == "cnn":
        raw = rng.integers(0, 256, (ROWS, *rllib_image_env.SHAPE), dtype=np.uint8)
        return raw, raw.astype(np.float32) / np.float32(255)
    if kind == "mlp_box":  # Pendulum: cos, sin, angular velocity
        angle = rng.uniform(-np.pi, np.pi, ROWS)
        speed = rng.uniform(-8.0, 8.0, ROWS)
        raw = np.stack([np.cos(angle), np.sin(angle), speed], axis=1).astype(np.float32)
        return raw, raw
    raw = (rng.standard_normal((ROWS, 4)) * [0.1, 1.0, 0.05, 1.0]).astype(np.float32)
    return raw, raw


def adam_state(policy, framework: str, variable: str) -> tuple[int, np.ndarray, np.ndarray]:
    """(step, first moment, second moment) of RLlib's Adam for `variable`."""
    if framework == "tf2":
        slots = {v.name.split(":")[0]: v.numpy() for v in policy._optimizer.variables()}
        step = int(slots["default_policy/iteration"])
        return step, slots[f"Adam/m/{variable}"], slots[f"Adam/v/{variable}"]
    slots = policy.get_state()["_optimizer_variables"]
    prefix = "default_policy/default_policy/"
    step = int(round(np.log(slots["default_policy/beta1_power"]) / np.log(0.9))) - 1
    return step, slots[f"{prefix}{variable}/Adam"], slots[f"{prefix}{variable}/Adam_1"]


def save_one(out: str, framework: str, kind: str) -> None:
    env, model, obs_filter = KINDS[kind]
    config = (
        PPOConfig()
        .api_stack(enable_rl_module_and_learner=False, enable_env_runner_and_connector_v2=False)
        .framework(framework)
        .environment(env)
        .env_runners(num_env_runners=0, observation_filter=obs_filter or "NoFilter")
        .training(train_batch_size=200, minibatch_size=100, num_epochs=1, model=model)
        .debugging(seed=0)
    )
    algo = config.build()
    algo.train()
    directory = os.path.join(out, framework, kind)
    algo.save(os.path.join(directory, "checkpoint"))
    policy = algo.get_policy()
    rng = np.random.default_rng(1)
    stored, obs = observations(kind, rng)
    if obs_filter:
        obs = algo.env_runner.filters["default_policy"](obs, update=False)
    expected = {"obs": stored}
    if kind == "lstm":
        states = [(rng.standard_normal((ROWS, CELL)) * 0.5).astype(np.float32) for _ in range(2)]
        prev_actions = rng.integers(0, 2, ROWS)
        prev_rewards = rng.uniform(0, 1, ROWS).astype(np.float32)
        if framework == "tf2":  # its compute_actions hands the LSTM a scalar state
            batch = SampleBatch(
                obs=obs,
                state_in_0=states[0],
                state_in_1=states[1],
                prev_actions=prev_actions,
                prev_rewards=prev_rewards,
                seq_lens=np.ones(ROWS, np.int32),
            )
            actions, state_out, extra = policy.compute_actions_from_input_dict(batch, explore=False)
        else:
            actions, state_out, extra = policy.compute_actions(
                obs,
                state_batches=states,
                prev_action_batch=prev_actions,
                prev_reward_batch=prev_rewards,
                explore=False,
            )
        expected.update(
            state_in_0=states[0],
            state_in_1=states[1],
            prev_actions=prev_actions,
            prev_rewards=prev_rewards,
            state_out_0=state_out[0],
            state_out_1=state_out[1],
        )
    else:
        actions, _, extra = policy.compute_actions(obs, explore=False)
    expected.update(actions=np.asarray(actions), dist_inputs=extra["action_dist_inputs"])
    step, first, second = adam_state(
        policy, framework, "conv1/kernel" if kind == "cnn" else "fc_1/kernel"
    )
    expected.update(adam_first=first, adam_second=second)
    np.savez(os.path.join(directory, "expected.npz"), **expected)
    with open(os.path.join(directory, "expected.json"), "w") as f:
        json.dump(
            {"global_timestep": int(np.asarray(policy.global_timestep)), "adam_step": step}, f
        )
    algo.stop()


def main() -> None:
    register_env("ImageTarget", lambda _: rllib_image_env.ImageTarget())
    out, runs = sys.argv[1], [arg.split(":") for arg in sys.argv[2:]]
    for framework, kind in sorted(runs, key=lambda run: run[0] != "tf2"):  # tf2 first
        save_one(out, framework, kind)


if __name__ == "__main__":
    main()

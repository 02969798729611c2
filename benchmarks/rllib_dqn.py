"""RLlib's old-stack TF DQN run with our DQN's hyperparameters, for compare_rllib.py.

The parent (our venv) translates a resolved DQNConfig into RLlib's settings with
`rllib_settings`; the child (RLlib's venv, which cannot import our package) builds
RLlib's DQN from them with `run_to_target`. Translated: target_network_update_freq
(ours counts SGD steps, RLlib env steps), training_intensity (RLlib's round-robin
weights, recorded), the replay buffer, exploration and model. Not translatable:
RLlib's n-step targets bootstrap with gamma^n where ours use gamma^k.

Each setting and where the meanings differ: benchmarks/history/off_policy.md, "DQN beside RLlib's
old-stack TF DQN".
"""

from __future__ import annotations

import time

# Our DQNConfig keys RLlib's DQNConfig.training() takes under the same name and meaning.
SAME_TRAINING_KEYS = (
    "lr",
    "gamma",
    "adam_epsilon",
    "grad_clip",
    "train_batch_size",
    "n_step",
    "double_q",
    "dueling",
    "hiddens",
    "tau",
    "training_intensity",
    "num_steps_sampled_before_learning_starts",
)
RLLIB_MIN_SAMPLE_TIMESTEPS = 1000  # RLlib's DQN default, used when our config has no such key


def round_robin_weights(ours: dict, fragment: int) -> tuple[int, int]:
    """(sample rounds, SGD steps) per RLlib iteration round for our training_intensity,
    as RLlib 2.60's dqn.calculate_rr_weights computes them (its native ratio counts
    the local worker beside remote ones)."""
    intensity = ours.get("training_intensity")
    if not intensity:
        return 1, 1
    native = ours["train_batch_size"] / (
        fragment * ours["num_envs_per_env_runner"] * max(ours["num_env_runners"] + 1, 1)
    )
    weight = intensity / native
    return (int(round(1 / weight)), 1) if weight < 1 else (1, int(round(weight)))


def rllib_settings(ours: dict, fragment: int) -> dict:
    """Our resolved DQNConfig (its to_dict()) and sampling fragment -> RLlib's DQN
    settings as JSON: {"training", "env_runners", "reporting", "notes"} (the seed is
    the run's, given to build_dqn)."""
    missing = [
        k
        for k in SAME_TRAINING_KEYS
        + (
            "target_network_update_freq",
            "replay_buffer_capacity",
            "prioritized_replay",
            "exploration_config",
            "model",
        )
        if k not in ours
    ]
    if missing:
        raise KeyError(f"DQN config keys {missing} missing; have {sorted(ours)}")
    sample_rounds, sgd_steps = round_robin_weights(ours, fragment)
    steps_per_round = fragment * ours["num_envs_per_env_runner"] * max(1, ours["num_env_runners"])
    env_steps_per_sgd_step = sample_rounds * steps_per_round / sgd_steps
    training = {key: ours[key] for key in SAME_TRAINING_KEYS}
    training["target_network_update_freq"] = int(
        round(ours["target_network_update_freq"] * env_steps_per_sgd_step)
    )
    buffer = {
        "type": (
            "MultiAgentPrioritizedReplayBuffer"
            if ours["prioritized_replay"]
            else "MultiAgentReplayBuffer"
        ),
        "capacity": ours["replay_buffer_capacity"],
    }
    if ours["prioritized_replay"]:
        buffer.update(
            {
                key: ours[key]
                for key in (
                    "prioritized_replay_alpha",
                    "prioritized_replay_beta",
                    "prioritized_replay_eps",
                )
            }
        )
    training["replay_buffer_config"] = buffer
    training["model"] = {key: ours["model"][key] for key in ("fcnet_hiddens", "fcnet_activation")}
    return {
        "training": training,
        "env_runners": {
            "num_env_runners": ours["num_env_runners"],
            "num_envs_per_env_runner": ours["num_envs_per_env_runner"],
            "rollout_fragment_length": fragment,
            "explore": True,
            "exploration_config": dict(ours["exploration_config"]),
        },
        "reporting": {
            "metrics_num_episodes_for_smoothing": ours["metrics_num_episodes_for_smoothing"],
            "min_sample_timesteps_per_iteration": ours.get(
                "min_sample_timesteps_per_iteration", RLLIB_MIN_SAMPLE_TIMESTEPS
            ),
        },
        "notes": {
            "round_robin_weights": [sample_rounds, sgd_steps],
            "env_steps_per_sgd_step": env_steps_per_sgd_step,
            "ours_target_network_update_freq_sgd_steps": ours["target_network_update_freq"],
        },
    }


# ----- in RLlib's venv ------------------------------------------------------------------------


def patch_replay_buffer_creation() -> None:
    """Let RLlib 2.60's old-stack DQN build. Its config.validate() turns
    replay_buffer_config["type"] into a class (validate_buffer_config), then
    Algorithm._create_local_replay_buffer_if_necessary tests a substring of that
    type ("EpisodeReplayBuffer" in type: TypeError on a class), so no old-stack DQN
    builds as shipped. This replacement builds the buffer from the class directly;
    the substring test only serves the new stack's episode buffers, which the old
    stack's validate() refuses anyway. The config is left as validate() made it: a
    type turned back into a string would break the next validate() (of the evaluation
    config's copy), whose issubclass test needs the class."""
    from ray.rllib.algorithms.algorithm import Algorithm
    from ray.rllib.utils.from_config import from_config
    from ray.rllib.utils.replay_buffers import ReplayBuffer

    def create_local_replay_buffer(self, config):
        buffer_config = config.get("replay_buffer_config")
        if not buffer_config or buffer_config.get("no_local_replay_buffer"):
            return None
        return from_config(ReplayBuffer, buffer_config)

    Algorithm._create_local_replay_buffer_if_necessary = create_local_replay_buffer


def build_dqn(settings: dict, seed):
    """RLlib's old-API-stack, static-graph TF DQN on CartPole-v1 from rllib_settings()."""
    from ray.rllib.algorithms.dqn import DQNConfig

    patch_replay_buffer_creation()
    config = (
        DQNConfig()
        .api_stack(enable_rl_module_and_learner=False, enable_env_runner_and_connector_v2=False)
        .framework("tf")
        .environment("CartPole-v1")
        .env_runners(**settings["env_runners"])
        .training(**settings["training"])
        .reporting(**settings["reporting"])
        .debugging(seed=seed)
    )
    return config.build_algo()


def run_to_target(
    settings: dict, seed, target: float, max_env_steps: int, max_seconds: float
) -> dict:
    """RLlib's DQN trained by to_target.train_to_target (the rule our side stops by)
    -> the outcome, with wall_s from the start of the build to the last train()
    (Ray is started and stopped by the caller, outside it)."""
    from benchmarks.to_target import train_to_target

    start = time.perf_counter()
    algo = build_dqn(settings, seed)
    built = time.perf_counter()

    def train():
        result = algo.train()
        return (
            result.get("num_env_steps_sampled_lifetime") or 0,
            result.get("env_runners", {}).get("episode_return_mean"),
        )

    try:
        outcome = train_to_target(train, target, max_env_steps, max_seconds, start)
    finally:
        algo.stop()
    return dict(outcome, build_s=built - start, train_s=outcome["wall_s"] - (built - start))

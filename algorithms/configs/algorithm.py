"""The keys of every algorithm's config (AlgorithmConfig: the loop's keys on top of the
policy's) and of the asynchronous ones (AsyncConfig), without TensorFlow: what
algorithms/algorithm.py's loop reads, and what each config in algorithms/configs/
extends."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from algorithms.config_builder import ConfigBuilder
from policy_service.config import ConfigError, setting
from policy_service.config_rules import MIN_ROW_BYTES, Rule, finite, integer, one_of
from policy_service.envs import atari
from policy_service.multi_agent import pettingzoo_env
from policy_service.multi_agent.policies import check_policies_config
from policy_service.multi_agent.self_play import check_frozen_copies
from policy_service.offline import config_keys as offline_keys
from policy_service.policy.policy_config import PolicyConfig
from policy_service.runs.callbacks import callbacks_config_error

# the registered algorithms whose config takes external episodes, for the refusal's hint
# (written out: the registry imports this module; tests/test_external_episodes.py checks it)
EXTERNAL_ENV_RUNS = ("PPO", "DQN", "SAC", "TD3")

FRAGMENT_LENGTH = Rule(
    "'auto' or an integer >= 1", lambda v: v == "auto" if isinstance(v, str) else v >= 1
)

EVALUATION_OVERRIDES = ("explore", "env_config")  # the keys evaluation_config may change


def evaluation_config_error(overrides: Any) -> str | None:
    """The rule of `evaluation_config`: a dict of keys that change how evaluation plays."""
    unknown = sorted(set(overrides) - set(EVALUATION_OVERRIDES))
    if unknown:
        return (
            f"a dict of {', '.join(EVALUATION_OVERRIDES)} (what changes how evaluation "
            f"plays), not {unknown[0]!r}"
        )
    if "explore" in overrides and not isinstance(overrides["explore"], bool):
        return f"explore: a bool, got {overrides['explore']!r}"
    if "env_config" in overrides and not isinstance(overrides["env_config"], dict):
        return f"env_config: a dict, got {overrides['env_config']!r}"
    return None


@dataclass
class AlgorithmConfig(PolicyConfig, ConfigBuilder):
    """The loop's keys on top of the policy's (RLlib's names where RLlib has one), and
    RLlib's builder methods (`PPOConfig().environment(...).training(...)`,
    algorithms/config_builder.py)."""

    # RLlib's flat key "callbacks" is the field callbacks_class (the builder's method
    # `callbacks()` takes the name)
    KEY_ALIASES: ClassVar[dict[str, str]] = {"callbacks": "callbacks_class"}

    # the algorithm's training_step can learn from external_env clients' episodes
    # (the external_env runner type standing in for env runners); False: refused in one line
    takes_external_episodes: ClassVar[bool] = True

    env: str | None = setting(
        None, doc='Gymnasium id, "module:EnvId", or a name given to register_env.'
    )
    env_config: dict = setting(doc="Keyword arguments of the env.", factory=dict)
    preprocessor_pref: str | None = setting(
        "deepmind",
        doc='"deepmind": Atari envs ("ALE/...") get DeepMind\'s preprocessing (4-frame '
        "skip, 84x84 grayscale, no-op starts, 4 frames stacked: policy_service/envs/atari.py); "
        "None: the env as gym.make gives it. Other envs are never changed.",
        check=Rule("'deepmind' or None", lambda v: v in ("deepmind", None)),
    )
    num_env_runners: int = setting(
        0, doc="Rollout worker actors; 0 samples in this process.", check=integer(ge=0)
    )
    num_envs_per_env_runner: int = setting(
        1, doc="Sub-envs stepped as one vector env per worker.", check=integer(ge=1)
    )
    num_cpus_per_env_runner: float = setting(
        0.5, doc="Ray CPUs reserved per worker actor.", check=finite(ge=0)
    )
    rollout_fragment_length: int | str = setting(
        "auto",
        doc='Steps per sub-env per sample(); "auto": train_batch_size / '
        "(workers * envs), so one sample() makes a train batch.",
        check=FRAGMENT_LENGTH,
    )
    vectorize_mode: str = setting(
        "sync", doc='"sync", or "async" (a subprocess per sub-env).', check=one_of("sync", "async")
    )
    remote_inference: bool = setting(
        False, doc="Workers act through one PolicyActor (central inference)."
    )
    max_num_env_runner_restarts: int = setting(
        100,
        doc="Env runners replaced (a death each, those that die starting too) over the "
        "env runner group's life before the run ends in one line naming the runner "
        "(RLlib's key); 0: the first death ends it.",
        check=integer(ge=0),
    )
    max_policy_actor_restarts: int = setting(
        3,
        doc="Times Ray restarts the PolicyActor (remote_inference, inference: "
        '"policy_actors"), with its latest weights, before a death ends the run in one '
        "line naming this key; a budget per PolicyActor (a seeded restore or a change of "
        "policies builds a new one), while num_policy_actor_restarts counts over the run "
        "(no RLlib analogue: its env runners act themselves); 0: the first death ends it.",
        check=integer(ge=0),
    )
    sample_while_env_runners_start: bool = setting(
        True,
        doc="Until the remote env runners are up (at the start, and when a seeded restore "
        "rebuilds them), the driver samples with its own copy of their envs and policy "
        "instead of waiting; how many iterations it samples depends on their start-up "
        "time. False: wait for them (a seeded run is then the same every time). Runners "
        "acting through a PolicyActor or the learners always wait.",
    )
    train_batch_size: int = setting(
        4000, doc="Env steps sampled per training iteration.", check=integer(ge=1)
    )
    metrics_num_episodes_for_smoothing: int = setting(
        100, doc="Episodes in the return/length window.", check=integer(ge=1)
    )
    ray_num_cpus: int | None = setting(
        None, doc="CPUs of the Ray started here when none runs.", check=integer(ge=1)
    )
    callbacks_class: type | str | list | None = setting(
        None,
        doc="The user's hooks (policy_service.Callbacks): a subclass, 'module.Class' of a "
        "module given to --import, or a list of them; episode and sample hooks run in the "
        "env runners, the others in the driver.",
        check=callbacks_config_error,
    )
    evaluation_interval: int | None = setting(
        None,
        doc="Evaluate every this many iterations (results under evaluation/); None: never "
        "during training (algo.evaluate() still runs one).",
        check=integer(ge=1),
    )
    evaluation_duration: int = setting(
        10, doc="Episodes (or timesteps) an evaluation plays.", check=integer(ge=1)
    )
    evaluation_duration_unit: str = setting(
        "episodes",
        doc='What evaluation_duration counts: "episodes", or "timesteps" (whole episodes '
        "until that many steps).",
        check=one_of("episodes", "timesteps"),
    )
    evaluation_num_env_runners: int = setting(
        0, doc="Evaluation runner actors; 0: evaluation plays in the driver.", check=integer(ge=0)
    )
    evaluation_parallel_to_training: bool = setting(
        False,
        doc="Evaluate in the runner actors while the iteration trains, with the weights it "
        "started with (needs evaluation_num_env_runners >= 1).",
    )
    evaluation_config: dict | None = setting(
        None,
        doc='Overrides for evaluation: "explore" (e.g. False: greedy actions), "env_config".',
        check=evaluation_config_error,
    )
    evaluation_sample_timeout_s: float = setting(
        120.0,
        doc="Seconds an evaluation waits for its runner actors, all together, from when it "
        "starts waiting: a runner that has not answered by then is counted out (its episodes "
        "missing; evaluation/timed_out) and replaced; evaluation in the driver "
        "(evaluation_num_env_runners 0) has no timeout.",
        check=finite(gt=0),
    )
    custom_evaluation_function: Callable | None = setting(
        None,
        doc="(algorithm, evaluation) -> metrics dict, instead of the built-in evaluation "
        "(`evaluation.run()` plays it); its keys go under evaluation/.",
    )
    tensorboard_histograms_every: int = setting(
        10,
        doc="Iterations between TensorBoard histograms (with mean, stddev, min, max) of "
        "every weight, its gradient and the episode returns, in `policy-service train`; "
        "0: none.",
        check=integer(ge=0),
    )

    external_env: bool = setting(
        False,
        doc="Episodes come from clients outside Ray over HTTP (policy_service.client); "
        "`env` only gives the spaces.",
    )
    external_env_host: str = setting(
        "127.0.0.1", doc="Address the external-env server listens on (loopback unless told)."
    )
    external_env_port: int = setting(
        9900, doc="Port of the external-env server.", check=integer(ge=1, le=65535)
    )
    external_env_token_file: str | None = setting(
        None, doc="File holding the clients' bearer token (else $POLICY_SERVICE_TOKEN)."
    )
    episode_timeout_s: float = setting(
        60.0,
        doc="An external episode with no call for this long is closed as truncated.",
        check=finite(gt=0),
    )

    # offline data (policy_service/offline/config_keys.py has the rules; docs/offline.md)
    input: str | list = setting(
        offline_keys.SAMPLER,
        doc="Where samples come from: 'sampler' (env runners), or logged experiences: a "
        "directory, a glob, or a list of files, directories and globs (Parquet, or RLlib's "
        "JSON lines); their manifest gives the spaces, so `env` is only for evaluation.",
        check=offline_keys.INPUT,
    )
    shuffle_buffer_size: int = setting(
        0,
        doc="input: rows each batch is drawn from at random (0: in file order).",
        check=integer(ge=0),
    )
    input_num_readers: int = setting(
        0,
        doc="input: Ray Data read tasks when Ray runs and this is > 1; else read here.",
        check=integer(ge=0),
    )
    postprocess_inputs: bool = setting(
        False,
        doc="input: each episode's rows go through the policy's postprocess_trajectory "
        "(e.g. advantages from the rewards read) before the shuffle buffer (RLlib's key).",
    )
    output: str | None = setting(
        None,
        doc="A directory env runners and the external-env server write what they act "
        "on to (each runner its own files), with the behaviour policy's action_logp.",
        check=offline_keys.OUTPUT,
    )
    output_format: str = setting(
        "parquet",
        doc="output: 'parquet', or 'json' (RLlib's JSON lines).",
        check=one_of(*offline_keys.OUTPUT_FORMATS),
    )
    output_max_file_size: int = setting(
        offline_keys.DEFAULT_MAX_FILE_SIZE,
        doc="output: bytes after which the next file starts (each renamed in when complete).",
        check=integer(ge=1),
    )
    off_policy_estimation_methods: dict | list | None = setting(
        None,
        doc="Estimators of the trained policy's value on held-out episodes of input, at "
        "each evaluation (evaluation/off_policy_estimation/<name>/...): {name: {'type': "
        "'ImportanceSampling' | 'WeightedImportanceSampling' | 'DirectMethod' | "
        "'DoublyRobust', options}} or a list of types.",
        check=offline_keys.estimation_methods_error,
    )
    off_policy_estimation_held_out: float = setting(
        offline_keys.DEFAULT_HELD_OUT,
        doc="With off_policy_estimation_methods: the episodes of input kept out of training "
        "for the estimators (chosen by a hash of eps_id).",
        check=offline_keys.HELD_OUT,
    )

    policies: dict | None = setting(
        None,
        doc="Multi-agent: policy id -> None (the algorithm's policy, spaces from its agents) "
        "or a policy_service.PolicySpec; None: one policy, a single-agent env.",
    )
    policy_mapping_fn: Callable | dict | str | None = setting(
        None,
        doc="Multi-agent: (agent_id, episode, **kwargs) -> policy id, a dict of agent-id "
        "prefix -> policy id (the longest prefix matching wins), or the name of a mapping "
        "registered with policy_service.register_policy_mapping_fn (by a module given to "
        '--import); None: "default_policy".',
    )
    policies_to_train: list | None = setting(
        None, doc="Multi-agent: the policy ids trained (the others keep their weights); None: all."
    )
    count_steps_by: str = setting(
        "env_steps",
        doc='Multi-agent: what train_batch_size counts, "env_steps" or "agent_steps".',
        check=one_of("env_steps", "agent_steps"),
    )
    frozen_copies: dict | None = setting(
        None,
        doc="Multi-agent self-play: frozen policy id -> the policy id whose weights it takes "
        "every frozen_copies_every iterations (at the start, too); a frozen policy is never "
        "trained, so a learner plays a past self that moves in steps.",
    )
    frozen_copies_every: int = setting(
        1, doc="Iterations between the copies of frozen_copies.", check=integer(ge=1)
    )

    def __post_init__(self):
        super().__post_init__()
        if self.external_env and not self.takes_external_episodes:
            name, runs = type(self).__name__.removesuffix("Config"), ", ".join(EXTERNAL_ENV_RUNS)
            raise ConfigError(
                f"{self.key_prefix}.external_env: {name} does not take external episodes "
                f"(external_env runs: {runs})"
            )
        check_policies_config(
            self.policies, self.policy_mapping_fn, self.policies_to_train, self.key_prefix
        )
        check_frozen_copies(
            self.frozen_copies, self.policies, self.policies_to_train, self.key_prefix
        )
        offline_keys.check_offline_config(self)
        if self.policies is None and pettingzoo_env.is_pettingzoo_name(self.env):
            raise ConfigError(
                f"{self.key_prefix}.env {self.env!r} is a multi-agent env: set "
                f"{self.key_prefix}.policies, e.g. one policy shared by every agent: "
                f"--set 'policies={{default_policy: null}}' (docs/multi_agent.md)"
            )
        if self.policies is not None:
            for key, single_agent_only in (
                ("external_env", self.external_env),
                ("observation_filter", self.observation_filter != "NoFilter"),
                ("vectorize_mode", self.vectorize_mode != "sync"),
            ):
                if single_agent_only:
                    raise ConfigError(
                        f"{self.key_prefix}.{key} must keep its default with policies set "
                        f"(not in multi-agent runs yet), got {getattr(self, key)!r}"
                    )
        if self.preprocessor_pref == "deepmind" and atari.is_atari_id(self.env):
            try:
                atari.check_env_config(self.env, self.env_config)
            except atari.AtariSetupError as err:
                raise ConfigError(str(err)) from None
        self.check_fits_in_memory(
            "train_batch_size",
            self.train_batch_size * MIN_ROW_BYTES,
            f"{MIN_ROW_BYTES} bytes a row",
        )
        if self.evaluation_parallel_to_training and self.evaluation_num_env_runners < 1:
            raise ConfigError(
                f"{self.key_prefix}.evaluation_parallel_to_training needs evaluation runner "
                "actors: set evaluation_num_env_runners >= 1, got "
                f"{self.evaluation_num_env_runners}"
            )
        if self.external_env and self.observation_filter != "NoFilter":
            raise ConfigError(
                f"{self.key_prefix}.observation_filter must be 'NoFilter' with external_env: "
                "true (the server acts on the clients' observations as they come), got "
                f"{self.observation_filter!r}"
            )

    def fragment_length(self) -> int:
        """Steps per sub-env per sample()."""
        if self.rollout_fragment_length != "auto":
            return int(self.rollout_fragment_length)
        envs = max(1, self.num_env_runners) * self.num_envs_per_env_runner
        return max(1, math.ceil(self.train_batch_size / envs))

    def env_runner_settings(self, seed: int | None) -> dict:
        """The keyword arguments of the run's env runner group, single- or multi-agent
        (`seed`: the episodes' and acting copies' seed, e.g. an iteration's)."""
        return {
            "num_env_runners": self.num_env_runners,
            "num_envs_per_env_runner": self.num_envs_per_env_runner,
            "num_cpus_per_env_runner": self.num_cpus_per_env_runner,
            "rollout_fragment_length": self.fragment_length(),
            "vectorize_mode": self.vectorize_mode,
            "seed": seed,
            "env_config": dict(self.env_config),
            "remote_inference": self.remote_inference,
            "sample_while_starting": self.sample_while_env_runners_start,
            "max_restarts": self.max_num_env_runner_restarts,
            "max_policy_actor_restarts": self.max_policy_actor_restarts,
        }


@dataclass
class AsyncConfig(AlgorithmConfig):
    """The rules of an AsyncAlgorithm's config (IMPALA, A3C): its env runner actors
    sample fragments of a fixed length while it learns."""

    takes_external_episodes: ClassVar[bool] = False  # asynchronous sampling: env runner actors
    takes_input: ClassVar[bool] = False  # the same: no offline runner stands in for them

    def __post_init__(self):
        super().__post_init__()
        if self.rollout_fragment_length == "auto":
            raise ConfigError(
                f"{self.key_prefix}.rollout_fragment_length must be an integer >= 1, got 'auto'"
            )

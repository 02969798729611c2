"""RLlib's config builder on every algorithm's config class (`PPOConfig()` and the rest).

    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=2)
        .training(lr=3e-4, train_batch_size=4000, model={"fcnet_hiddens": [64, 64]})
        .debugging(seed=0)
    )
    algo = config.build_algo()            # or RLlib's .build()

Each method takes RLlib's keyword names for the keys of its group, checks the whole
config at once (an unknown keyword, a bad value: one line naming the method and the
key), changes nothing when a check fails, and returns the config. The flat dict
(`to_dict()`, `from_dict()`, YAML files) stays the config's other spelling.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
from typing import TYPE_CHECKING, Any, ClassVar

from algorithms.registry import CONFIGS, get_algorithm_class
from policy_service.config import ConfigError, from_dict, user_key

# The keys each method sets (by their flat names); `training` takes every key of the
# algorithm's config that no other method claims.
GROUPS: dict[str, tuple[str, ...]] = {
    "environment": ("env", "env_config", "preprocessor_pref"),
    "env_runners": (
        "num_env_runners",
        "num_envs_per_env_runner",
        "num_cpus_per_env_runner",
        "custom_resources_per_env_runner",
        "rollout_fragment_length",
        "vectorize_mode",
        "remote_inference",
        "custom_resources_per_policy_actor",
        "sample_while_env_runners_start",
        "observation_filter",
        "explore",
        "exploration_config",
    ),
    "resources": ("num_gpus", "_fake_gpus", "ray_num_cpus"),
    "learners": (
        "num_learners",
        "num_gpus_per_learner",
        "num_cpus_per_learner",
        "custom_resources_per_learner",
        "num_grad_accumulation_steps",
        "learner_placement_strategy",
    ),
    "multi_agent": (
        "policies",
        "policy_mapping_fn",
        "policies_to_train",
        "count_steps_by",
        "frozen_copies",
        "frozen_copies_every",
    ),
    "debugging": ("seed",),
    "reporting": ("metrics_num_episodes_for_smoothing", "tensorboard_histograms_every"),
    "evaluation": (
        "evaluation_interval",
        "evaluation_duration",
        "evaluation_duration_unit",
        "evaluation_num_env_runners",
        "evaluation_parallel_to_training",
        "evaluation_config",
        "evaluation_sample_timeout_s",
        "custom_evaluation_function",
        "off_policy_estimation_methods",
        "off_policy_estimation_held_out",
    ),
    "offline_data": (
        "input",
        "shuffle_buffer_size",
        "input_num_readers",
        "postprocess_inputs",
        "output",
        "output_format",
        "output_max_file_size",
    ),
    "external_env": (
        "external_env",
        "external_env_host",
        "external_env_port",
        "external_env_token_file",
        "episode_timeout_s",
    ),
}
# keywords RLlib spells otherwise (`input` is a Python builtin there): taken as the key
KEYWORD_SPELLINGS = {"offline_data": {"input_": "input"}}
# RLlib's names for the API stacks: this project is RLlib's old stack (TFPolicy,
# RolloutWorker) rebuilt, so only the old stack's settings are accepted
OLD_API_STACK = {"enable_rl_module_and_learner": False, "enable_env_runner_and_connector_v2": False}
# callbacks() without a class changes nothing (RLlib's NotProvided)
_NOT_GIVEN: Any = object()


class ConfigBuilder:
    """RLlib's AlgorithmConfig methods, for a config dataclass (AlgorithmConfig)."""

    KEY_ALIASES: ClassVar[dict[str, str]] = {}
    # the Algorithm subclass whose config_class this is (Algorithm.__init_subclass__)
    algorithm_class: ClassVar[Any] = None

    if TYPE_CHECKING:  # the config dataclass's (policy_service.config.Config)

        def to_dict(self) -> dict: ...

    # ----- the groups ------------------------------------------------------------------

    def environment(self, env: Any = None, **kwargs):
        """env (a gymnasium id, "module:EnvId" or a registered name), env_config, ..."""
        return self._set("environment", {"env": env, **kwargs} if env is not None else kwargs)

    def env_runners(self, **kwargs):
        """num_env_runners, num_envs_per_env_runner, rollout_fragment_length, explore, ..."""
        return self._set("env_runners", kwargs)

    def training(self, **kwargs):
        """lr, gamma, train_batch_size, model, grad_clip and the algorithm's own keys."""
        return self._set("training", kwargs)

    def resources(self, **kwargs):
        """num_gpus, _fake_gpus (towers of the learner in this process), ray_num_cpus."""
        return self._set("resources", kwargs)

    def learners(self, **kwargs):
        """num_learners, num_gpus_per_learner, num_cpus_per_learner, ..."""
        return self._set("learners", kwargs)

    def evaluation(self, **kwargs):
        """evaluation_interval, evaluation_duration, evaluation_config, ..."""
        return self._set("evaluation", kwargs)

    def multi_agent(self, **kwargs):
        """policies (ids, or id -> PolicySpec/None), policy_mapping_fn, policies_to_train."""
        policies = kwargs.get("policies")
        if isinstance(policies, (set, frozenset, list, tuple)):  # RLlib takes a set of ids
            kwargs["policies"] = {policy_id: None for policy_id in policies}
        return self._set("multi_agent", kwargs)

    def callbacks(self, callbacks_class: Any = _NOT_GIVEN, **kwargs):
        """The user's hooks: a policy_service.Callbacks subclass (or a list of them).
        RLlib's new stack's on_* keywords are refused like any unknown keyword."""
        if kwargs:
            known = sorted(self._group_keys("callbacks", set()))
            raise ConfigError(self._unknown("callbacks", sorted(kwargs)[0], known))
        if callbacks_class is _NOT_GIVEN:
            return self
        return self._set("callbacks", {"callbacks": callbacks_class})

    def debugging(self, **kwargs):
        """seed."""
        return self._set("debugging", kwargs)

    def reporting(self, **kwargs):
        """metrics_num_episodes_for_smoothing, tensorboard_histograms_every."""
        return self._set("reporting", kwargs)

    def offline_data(self, **kwargs):
        """input_ (RLlib's spelling of input), output, output_max_file_size."""
        return self._set("offline_data", kwargs)

    def framework(self, framework: str = "tf2", **kwargs):
        """Only "tf2" ("tf" too, RLlib's TF1 name: both run TF2 here), with eager_tracing
        accepted (steps are always compiled)."""
        unknown = sorted(set(kwargs) - {"eager_tracing"})
        if unknown:
            raise ConfigError(
                self._unknown("framework", unknown[0], ["framework", "eager_tracing"])
            )
        if framework not in ("tf2", "tf"):
            raise ConfigError(
                f"{type(self).__name__}.framework(): this project runs TensorFlow 2 only "
                f"('tf2'), got {framework!r}"
            )
        return self

    def api_stack(self, **kwargs):
        """RLlib's API-stack switches; this project is the old stack's successor, so only
        enable_rl_module_and_learner=False, enable_env_runner_and_connector_v2=False."""
        for key, value in kwargs.items():
            if key not in OLD_API_STACK:
                raise ConfigError(self._unknown("api_stack", key, sorted(OLD_API_STACK)))
            if value is not OLD_API_STACK[key]:
                raise ConfigError(
                    f"{type(self).__name__}.api_stack(): {key}={value!r} asks for RLlib's new "
                    "API stack; this project runs the old stack's TFPolicy API (False)"
                )
        return self

    # ----- the config as a whole -------------------------------------------------------

    @classmethod
    def from_dict(cls, config_dict: dict):
        """A config of this class from a flat dict (every key checked)."""
        config_class: Any = cls
        return from_dict(config_class, dict(config_dict))

    def update_from_dict(self, config_dict: dict):
        """Set the keys of a flat dict, all checked before any is set."""
        self._assign(from_dict(self._config_class(), {**self.to_dict(), **config_dict}))
        return self

    def copy(self, copy_frozen: bool | None = None):
        """A deep copy (RLlib's copy_frozen is accepted; configs here never freeze)."""
        return copy.deepcopy(self)

    def build_algo(self, env: Any = None):
        """The algorithm this config class configures, built from a copy of this config
        (`configured_algorithm`)."""
        algo_cls = configured_algorithm(type(self))
        config = self.copy()
        if env is not None:
            config.environment(env)
        return algo_cls(config)

    def build(self, env: Any = None):
        """RLlib's older name of build_algo."""
        return self.build_algo(env)

    # ----- the checks ------------------------------------------------------------------

    def _set(self, method: str, kwargs: dict):
        fields = {f.name for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        allowed = self._group_keys(method, fields)
        spellings = KEYWORD_SPELLINGS.get(method, {})
        named = {user_key(type(self), name) for name in allowed} | set(spellings)
        kwargs = {spellings.get(key, key): value for key, value in kwargs.items()}
        for key in kwargs:
            if key not in named and key not in allowed:
                raise ConfigError(self._unknown(method, key, sorted(named)))
        try:
            self._assign(from_dict(self._config_class(), {**self.to_dict(), **kwargs}))
        except (ValueError, TypeError) as err:  # ConfigError, ConfigTypeError: one line each
            raise type(err)(f"{type(self).__name__}.{method}(): {err}") from None
        return self

    def _group_keys(self, method: str, fields: set[str]) -> set[str]:
        if method == "callbacks":
            return {"callbacks_class"}
        if method != "training":
            return {name for name in GROUPS[method] if name in fields}
        claimed = {name for group in GROUPS.values() for name in group} | {"callbacks_class"}
        return fields - claimed

    def _unknown(self, method: str, key: str, known: list[str]) -> str:
        close = difflib.get_close_matches(key, known, n=3)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        return (
            f"{type(self).__name__}.{method}(): unknown keyword {key!r}{hint} "
            f"(its keywords: {', '.join(known) or 'none in this algorithm'})"
        )

    def _config_class(self) -> Any:
        return type(self)

    def _assign(self, checked) -> None:
        """Every field of `checked` (a config of this class, fully checked) into self."""
        for f in dataclasses.fields(checked):
            setattr(self, f.name, getattr(checked, f.name))


def configured_algorithm(config_cls: type) -> Any:
    """The algorithm a config class configures: the nearest class in its MRO that
    either names its own `algorithm_class` (set when that algorithm is defined) or is
    a registered config class, whose algorithm the registry then loads. A config class
    loads without its algorithm (`from algorithms import PPOConfig` imports no
    TensorFlow), so an inherited `algorithm_class` could name a parent's algorithm
    (APPOConfig's IMPALA) or none yet."""
    registered = {path: name for name, path in CONFIGS.items()}
    for cls in config_cls.__mro__:
        own = cls.__dict__.get("algorithm_class")
        if own is not None:
            return own
        name = registered.get(f"{cls.__module__}:{cls.__qualname__}")
        if name is not None:
            return get_algorithm_class(name)
    raise TypeError(f"no algorithm is configured by {config_cls.__name__}")

"""What `policy-service train` was asked to do: the options, the stop criteria, and
the error that ends a run before it starts."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from policy_service.errors import UserError

STOP_REWARD, STOP_TIMESTEPS, STOP_ITERS, INTERRUPTED = (
    "stop_reward",
    "stop_timesteps",
    "stop_iters",
    "interrupted",
)


class TrainingSetupError(UserError):
    """The run cannot start: a bad flag, config key or value, file or run directory."""


@dataclass
class StopCriteria:
    """When a run ends; None means no such limit (no limit at all: until Ctrl-C)."""

    reward: float | None = None  # episode_return_mean at which to stop
    timesteps: int | None = None  # env steps (timesteps_total) after which to stop
    iters: int | None = None  # iterations after which to stop

    def reason(self, metrics: dict) -> str | None:
        """The first criterion `metrics` meets, or None."""
        ret = metrics.get("episode_return_mean")
        if self.reward is not None and ret is not None and ret >= self.reward:
            return STOP_REWARD
        if self.timesteps is not None and metrics.get("timesteps_total", 0) >= self.timesteps:
            return STOP_TIMESTEPS
        if self.iters is not None and metrics.get("iteration", 0) >= self.iters:
            return STOP_ITERS
        return None

    def updated(self, other: StopCriteria) -> StopCriteria:
        """These criteria with every limit `other` sets replaced by its value."""
        return StopCriteria(
            **{
                k: v if v is not None else getattr(self, k)
                for k, v in dataclasses.asdict(other).items()
            }
        )


@dataclass
class RunOptions:
    """Everything `policy-service train` takes; None means "not given"."""

    algorithm: str | None = None  # registered algorithm name, e.g. "ppo"
    env: str | None = None  # gymnasium id or "module:EnvId"
    config_file: str | None = None  # YAML or JSON mapping of config keys
    overrides: list = field(default_factory=list)  # "key=value" strings; dotted keys nest
    num_gpus: float | None = None  # -> config "num_gpus"
    fake_gpus: bool | None = None  # -> config "_fake_gpus"
    num_env_runners: int | None = None  # -> config "num_env_runners"
    num_learners: int | None = None  # -> config "num_learners"
    gpus_per_learner: float | None = None  # -> config "num_gpus_per_learner"
    seed: int | None = None  # -> config "seed"
    stop: StopCriteria = field(default_factory=StopCriteria)
    output_dir: str | None = None  # run directory (default runs/ALGO-ENV-TIME)
    resume: str | None = None  # run directory to continue from its latest checkpoint
    address: str | None = None  # Ray cluster to join (default: $RAY_ADDRESS, else local)
    checkpoint_every: int | None = None  # iterations between checkpoints; 0: at the end only
    keep_checkpoints: int | None = None  # latest checkpoints kept
    external_env: bool | None = None  # -> config "external_env": episodes from HTTP clients
    host: str | None = None  # -> config "external_env_host"
    port: int | None = None  # -> config "external_env_port"
    token_file: str | None = None  # -> config "external_env_token_file"

    def config_flags(self) -> dict:
        """The config keys set by their own flags (they win over the file and --set)."""
        flags = {
            "env": self.env,
            "num_gpus": self.num_gpus,
            "_fake_gpus": self.fake_gpus,
            "num_env_runners": self.num_env_runners,
            "num_learners": self.num_learners,
            "num_gpus_per_learner": self.gpus_per_learner,
            "seed": self.seed,
            "external_env": self.external_env,
            "external_env_host": self.host,
            "external_env_port": self.port,
            "external_env_token_file": self.token_file,
        }
        return {k: v for k, v in flags.items() if v is not None}

    def sets_config(self) -> bool:
        return bool(self.config_file or self.overrides or self.config_flags())

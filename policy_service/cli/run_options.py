"""What `policy-service train` was asked to do: its options (the stop criteria and the
error that ends a run before it starts are the library's, re-exported here)."""

from __future__ import annotations

from dataclasses import dataclass, field

from policy_service.errors import TrainingSetupError
from policy_service.runs.stop_criteria import StopCriteria

__all__ = ["RunOptions", "StopCriteria", "TrainingSetupError"]


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
    input: str | None = None  # -> config "input": logged experiences instead of env runners

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
            "input": self.input,
        }
        return {k: v for k, v in flags.items() if v is not None}

    def sets_config(self) -> bool:
        return bool(self.config_file or self.overrides or self.config_flags())

"""`policy-service serve CHECKPOINT --log-experiences DIR`: the checkpoint's policy
behind the serving API and the episode API (RLlib's PolicyClient protocol,
serving/episode_api.py), every step its clients complete written to DIR.

    app = logging_app(policy_state, digest, settings, LogSettings("logs/"), "default_policy")
    run_server(policy_state, address, settings, token, app=app, before_stop=close_log)

One replica (the episodes live in it): LoggingDeployment is the training server's
replica (TrainingDeployment) with the checkpoint's weights, never changed, and a task
that takes the completed steps every second (EpisodeRecorder.take) and writes them
(ExperienceOutput: rotated files renamed into place when complete, the manifest naming
the spaces, the policy id and the weights version, i.e. the checkpoint's
num_grad_updates). Rows carry the acting policy's action_logp and action_prob (for a
log_action step, the policy's likelihood of the client's action), eps_id, t, new_obs.
At SIGTERM/SIGINT `close_log` writes the rest and completes the open file before Serve
stops; the files a killed server had completed stay whole (its open one is a hidden
temp file readers skip).
"""

from __future__ import annotations

import asyncio
import os
import secrets
from typing import Any, NamedTuple

from policy_service.offline.config_keys import DEFAULT_MAX_FILE_SIZE
from policy_service.offline.output import ExperienceOutput
from policy_service.serving.deployment import (
    APP_NAME,
    DEPLOYMENT_NAME,
    PolicyDeployment,
    ServingSettings,
    deployment_options,
)
from policy_service.serving.episodes import EpisodeRecorder
from policy_service.serving.training_deployment import TrainingDeployment

TAKE_WAIT_S = 1.0  # the longest a completed step waits before it is written
CLOSE_TIMEOUT_S = 60.0


class LogSettings(NamedTuple):
    directory: str
    output_format: str = "parquet"
    max_file_size: int = DEFAULT_MAX_FILE_SIZE
    episode_timeout_s: float = 60.0


def logging_app(
    policy_state: dict,
    token_digest: bytes,
    settings: ServingSettings,
    log: LogSettings,
    policy_id: str,
):
    """The Serve application of a logging server: one replica."""
    from ray import serve

    options = deployment_options(settings)
    options["num_replicas"] = 1
    deployment = serve.deployment(**options)(LoggingDeployment)
    return deployment.bind(policy_state, token_digest, settings, log, policy_id)


class LoggingDeployment(TrainingDeployment):
    """The checkpoint's policy answering actions and episodes; completed steps logged."""

    async def __init__(  # type: ignore[misc]
        self,
        policy_state: dict,
        token_digest: bytes,
        settings: ServingSettings,
        log: LogSettings,
        policy_id: str,
    ):
        await PolicyDeployment.__init__(self, policy_state, token_digest, settings)
        self.replica_id = secrets.token_hex(8)
        self.episodes = EpisodeRecorder(self.host, log.episode_timeout_s)
        self._model_tar = None
        self._export_lock = asyncio.Lock()
        policy = self.host.policy
        self._spaces = {policy_id: (policy.observation_space, policy.action_space)}
        self._version = await self.host.weights_version()
        self._output = ExperienceOutput(log.directory, log.output_format, log.max_file_size)
        self._closing = False
        self._writing = asyncio.get_running_loop().create_task(self._write_completed())

    async def set_weights(self, weights: dict, version: int) -> int:
        raise ValueError("a logging server serves its checkpoint's weights; they never change")

    async def _write_completed(self) -> None:
        while not self._closing:
            taken = await self.episodes.take(1, TAKE_WAIT_S)
            if taken is not None:
                self._output.write(taken[0], self._spaces, self._version)

    async def close_log(self) -> dict:
        """Write every completed step (open episodes' too), complete the open file ->
        {"rows": rows written, "files": every file written}."""
        self._closing = True
        await self._writing
        taken = await self.episodes.take(1, 0.0)
        if taken is not None:
            self._output.write(taken[0], self._spaces, self._version)
        files = self._output.close()
        return {"rows": self._output.rows_written, "files": [os.fspath(f) for f in files]}


def close_log() -> dict:
    """Ask the logging replica to write the rest and complete its files (before Serve
    stops) -> its answer; prints where the rows went."""
    from ray import serve

    handle: Any = serve.get_deployment_handle(DEPLOYMENT_NAME, app_name=APP_NAME)
    done = handle.close_log.remote().result(timeout_s=CLOSE_TIMEOUT_S)
    print(f"logged {done['rows']} steps in {len(done['files'])} file(s)", flush=True)
    return done


def from_arguments(args: Any, policy_state: dict, token: str, settings: ServingSettings):
    """`serve --log-experiences DIR [--log-format F] [--log-max-file-size N]` -> (the
    Serve app, the call that completes the files); a bad flag is one line naming it."""
    from policy_service.multi_agent.policies import DEFAULT_POLICY_ID
    from policy_service.offline.config_keys import OUTPUT_FORMATS
    from policy_service.serving.http_api import token_digest
    from policy_service.serving.server import ServeSetupError

    if settings.num_replicas != 1:
        raise ServeSetupError(
            "--log-experiences: one replica holds the clients' episodes; drop "
            f"--num-replicas or make it 1, got {settings.num_replicas}"
        )
    if args.log_format not in OUTPUT_FORMATS:
        raise ServeSetupError(
            f"--log-format must be one of {list(OUTPUT_FORMATS)}, got {args.log_format!r}"
        )
    size = DEFAULT_MAX_FILE_SIZE if args.log_max_file_size is None else args.log_max_file_size
    if size < 1:
        raise ServeSetupError(f"--log-max-file-size must be >= 1, got {size}")
    log = LogSettings(args.log_experiences, args.log_format, size)
    policy_id = args.policy or DEFAULT_POLICY_ID
    return logging_app(policy_state, token_digest(token), settings, log, policy_id), close_log

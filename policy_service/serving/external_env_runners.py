"""ExternalEnvRunners: a run's env runners when the episodes come from clients outside Ray.

The loop it lives in (what `Algorithm` does with an EnvRunnerGroup, unchanged):

    runners = ExternalEnvRunners(PPOPolicy, obs_space, action_space, config,
                                 address=ServerAddress("127.0.0.1", 9900), token=token,
                                 rollout_fragment_length=4000)
    runners.sync_weights(learner.get_weights(), version=0)
    while True:
        batch, metrics = runners.sample()       # >= 4000 steps from the clients' episodes
        learner.learn_on_batch(batch)
        runners.sync_weights(learner.get_weights())   # clients are served these at once
    runners.stop()

It starts the training server (TrainingDeployment on Ray Serve, its one replica
answering the clients on `address` itself: direct_ingress.py) and talks to that
replica through a deployment handle. A replica Serve replaced is given the latest
weights when the driver next asks it for steps (its open episodes are lost: their
clients get 404). Clients: policy_service.client.policy_client.PolicyClient.
"""

from __future__ import annotations

import time

import gymnasium as gym

from policy_service.data.sample_batch import SampleBatch
from policy_service.distributed.actor_pool import call_while_restarted
from policy_service.distributed.weight_sync import WeightSync
from policy_service.errors import RunFailure
from policy_service.offline.output import ExperienceOutput
from policy_service.serving import direct_ingress
from policy_service.serving.deployment import APP_NAME, DEPLOYMENT_NAME, ServingSettings
from policy_service.serving.http_api import token_digest
from policy_service.serving.server import ServerAddress, check_port_free
from policy_service.serving.training_deployment import training_app

TAKE_WAIT_S = 1.0  # one handle call waits this long for steps, then the driver asks again
REPLICA_RESTART_ATTEMPTS = 20  # ~1 min of backoff while Serve replaces a dead replica


class ExternalEnvFailure(RunFailure, RuntimeError):
    """The training server's replica is gone and Serve did not replace it in time."""


class ExternalEnvRunners:
    """The EnvRunnerGroup of an external-env run: sample, sync_weights, stop."""

    num_env_runners = 0  # no env runs in Ray: the clients own theirs
    local_worker = None
    policy_actor = None

    def __init__(
        self,
        policy_cls: type,
        observation_space: gym.Space,
        action_space: gym.Space,
        policy_config,
        *,
        address: ServerAddress,
        token: str,
        rollout_fragment_length: int,
        episode_timeout_s: float = 60.0,
        settings: ServingSettings | None = None,
        output: ExperienceOutput | None = None,
    ):
        from ray import serve

        self.observation_space, self.action_space = observation_space, action_space
        self.workers: list = []
        self.num_restarts = 0  # replicas Serve replaced (seen by a new replica id)
        self.address = address
        self.rollout_fragment_length = int(rollout_fragment_length)
        # the latest weights and their version, for a replica Serve replaced (a Serve
        # handle call, not an actor's: they go as they are, to the one replica)
        self.weight_sync = WeightSync()
        self._replica_id: str | None = None
        self._output = output  # config.output: the clients' steps, written here
        check_port_free(address)
        direct_ingress.start(
            address,
            training_app(
                policy_cls,
                observation_space,
                action_space,
                policy_config,
                token_digest(token),
                settings or ServingSettings(),
                episode_timeout_s,
                address,
            ),
            APP_NAME,
        )
        self._replica = serve.get_deployment_handle(DEPLOYMENT_NAME, app_name=APP_NAME)

    # ----- sampling ----------------------------------------------------------------

    def sample(self) -> tuple[SampleBatch, dict]:
        """>= rollout_fragment_length completed steps -> (batch, metrics), waiting for them."""
        while True:
            result = self._take(TAKE_WAIT_S)
            if result is not None:
                return result

    def sample_async(self, timeout_s: float | None = None) -> list[tuple[SampleBatch, dict]]:
        """[(batch, metrics)] once rollout_fragment_length steps are ready; [] after timeout_s."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            wait = (
                TAKE_WAIT_S if deadline is None else min(TAKE_WAIT_S, deadline - time.monotonic())
            )
            result = self._take(max(0.0, wait))
            if result is not None:
                return [result]
            if deadline is not None and time.monotonic() >= deadline:
                return []

    def _take(self, wait_s: float) -> tuple[SampleBatch, dict] | None:
        replica_id, result = self._call("take", self.rollout_fragment_length, wait_s)
        if replica_id != self._replica_id:
            if self._replica_id is not None:
                self._replica_replaced()
            self._replica_id = replica_id
        if result is None:
            return None
        batch, metrics = result
        # as RLlib's server-side collector
        batch.num_grad_updates = self.weight_sync.num_grad_updates
        if self._output is not None:
            space = self.observation_space
            self._output.write_one(batch, space, self.action_space, metrics["weights_version"])
        metrics.update(num_worker_restarts=self.num_restarts, num_env_runners=0)
        return batch, metrics

    # ----- weights -----------------------------------------------------------------

    def sync_weights(
        self,
        weights: dict,
        version: int | None = None,
        wait: bool = True,
        num_grad_updates: int | None = None,
    ) -> int:
        """Clients are served these weights from the next action on -> their version.
        num_grad_updates: the SGD steps that made them, named by the batches taken next."""
        version = self.weight_sync.take(weights, version, num_grad_updates)
        if wait:
            self._call("set_weights", weights, version)
        else:
            self._replica.set_weights.remote(weights, version)
        return version

    def set_global_timestep(self, timestep: int) -> None:
        """Where the served policy's exploration schedule stands (the run's env steps)."""
        self._replica.set_global_timestep.remote(int(timestep))

    def weights_versions(self) -> list[int]:
        return [int(self._call("weights_version"))]

    def _replica_replaced(self) -> None:
        """A new replica acts with its initial weights: give it the latest."""
        self.num_restarts += 1
        sync = self.weight_sync
        if sync.weights is not None:
            self._call("set_weights", sync.weights, sync.version)

    def _call(self, method: str, *args):
        """replica.method(*args), sent again while Serve replaces a replica that died
        (the actor pool's backoff, REPLICA_RESTART_ATTEMPTS attempts); then
        ExternalEnvFailure, one line."""

        def failure(error: BaseException) -> ExternalEnvFailure:
            return ExternalEnvFailure(
                f"the training server's replica did not answer {method}() in "
                f"{REPLICA_RESTART_ATTEMPTS} attempts: {type(error).__name__}"
            )

        return call_while_restarted(
            lambda: getattr(self._replica, method).remote(*args).result(),
            REPLICA_RESTART_ATTEMPTS,
            failure,
        )

    def wait_started(self) -> None:
        """Nothing to wait for: the clients run their own envs."""

    def stop(self) -> None:
        """Stop the server (Serve and its proxy); open episodes end with it."""
        from policy_service.serving.serve_shutdown import shutdown_serve

        shutdown_serve()
        if self._output is not None:
            self._output.close()

"""PolicyDeployment: the Ray Serve deployment answering the HTTP API (see http_api).

    app = policy_app(policy_state, token_digest(token), ServingSettings(max_batch_size=32))
    serve.run(app, name=APP_NAME, route_prefix="/")

Each replica hosts one PolicyHost (policy_actor.py): a request is checked in full
(http_api.parse_action_request) before it joins a batch, concurrent requests are
coalesced by the host's RequestBatcher into one forward pass (max_batch_size rows
or batch_wait_timeout_s after the first; no wait after a pass of one request, so a
lone client never pays it), and a batch that fails anyway is rerun
request by request, so one bad request never fails the others. Measured against
Serve's own `@serve.batch` in benchmarks/serve.py (benchmarks/history/serving.md).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from policy_service.errors import one_line
from policy_service.serving.http_api import (
    ACTIONS,
    DEFAULT_MAX_REQUEST_BYTES,
    HEALTH,
    SPEC,
    STATS,
    HttpError,
    RequestSchema,
    action_response,
    api_spec,
    check_authorization,
    check_content_length,
    error_body,
    parse_action_request,
    too_large,
)

logger = logging.getLogger(__name__)

APP_NAME = "policy_service"
DEPLOYMENT_NAME = "PolicyDeployment"
ROUTES = {HEALTH: "GET", SPEC: "GET", STATS: "GET", ACTIONS: "POST"}
JSON = "application/json"
# Serve's default (5) would cap what one replica can batch; batching needs many in flight.
MAX_ONGOING_REQUESTS = 1000
# How often a stopping replica counts its requests in flight: it stops once none are
# left (each is answered first; Serve kills it after graceful_shutdown_timeout_s, 20 s).
# Serve's default (2 s) made every teardown wait 2 s after the last answer.
SHUTDOWN_CHECK_PERIOD_S = 0.05


@dataclass(frozen=True)
class ServingSettings:
    """How replicas batch, what they accept and what Ray reserves for each."""

    max_batch_size: int = 32  # rows that make a forward pass run at once (1: no batching)
    batch_wait_timeout_s: float = 0.001  # longest wait for others to join a pass (0: none)
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES  # larger bodies get 413
    num_replicas: int = 1  # Serve replicas, each with its own policy copy
    num_cpus_per_replica: float = 1.0  # also the replica's TensorFlow threads
    num_gpus_per_replica: float = 0.0  # the replica's policy acts on its GPU(s)
    # Serve's log line per request in the replica's log; off, a server stepping clients'
    # episodes at 1k actions/s neither writes 1k lines a second nor pays for them
    access_log: bool = False


def deployment_options(settings: ServingSettings) -> dict:
    """The `serve.deployment` options of the policy deployment."""
    return {
        "name": DEPLOYMENT_NAME,
        "num_replicas": settings.num_replicas,
        "max_ongoing_requests": MAX_ONGOING_REQUESTS,
        "graceful_shutdown_wait_loop_s": SHUTDOWN_CHECK_PERIOD_S,
        "logging_config": {"enable_access_log": settings.access_log},
        "ray_actor_options": {
            "num_cpus": settings.num_cpus_per_replica,
            "num_gpus": settings.num_gpus_per_replica,
        },
    }


def policy_app(policy_state: dict, token_digest: bytes, settings: ServingSettings):
    """The Serve application: PolicyDeployment bound to a saved policy state."""
    from ray import serve

    deployment = serve.deployment(**deployment_options(settings))(PolicyDeployment)
    return deployment.bind(policy_state, token_digest, settings)


def json_response(body: bytes, status: int = 200) -> Response:
    return Response(body + b"\n", status_code=status, media_type=JSON)


def policy_host(
    policy_cls: type,
    observation_space,
    action_space,
    config,
    settings: ServingSettings,
    custom_models: dict | None = None,
):
    """The replica's PolicyHost: the policy on this replica's devices, batching as set
    (custom_models: the registry of the process that built the app)."""
    from policy_service.config import on_cpu
    from policy_service.distributed.policy_actor import PolicyHost

    return PolicyHost(
        policy_cls,
        observation_space,
        action_space,
        on_cpu(config),
        max_batch_size=settings.max_batch_size,
        batch_wait_timeout_s=settings.batch_wait_timeout_s,
        custom_models=custom_models,
    )


class PolicyDeployment:
    """One Serve replica: a PolicyHost with the checkpoint's policy behind the HTTP API."""

    routes = ROUTES

    # Serve awaits an async constructor; the host's set_state is a coroutine
    async def __init__(  # type: ignore[misc]
        self, policy_state: dict, token_digest: bytes, settings: ServingSettings
    ):
        from policy_service.io.checkpoints import resolve_class
        from policy_service.io.space_codec import space_from_json
        from policy_service.policy.tf_policy import TFPolicy

        self.host = policy_host(
            resolve_class(policy_state["policy_class"], TFPolicy),
            space_from_json(policy_state["observation_space"]),
            space_from_json(policy_state["action_space"]),
            policy_state["config"],
            settings,
        )
        # the version of saved weights is the number of updates that made them
        await self.host.set_state(
            {**policy_state, "weights_version": int(policy_state.get("num_grad_updates", 0))}
        )
        await self._serve_with(token_digest, settings)

    async def _serve_with(self, token_digest: bytes, settings: ServingSettings) -> None:
        """What answering requests needs beside the host: the token, the limits, the spec."""
        self._digest = token_digest
        self._max_request_bytes = int(settings.max_request_bytes)
        self._schema = RequestSchema.of(self.host.policy)
        self._spec = json.dumps(
            api_spec(self.host.policy, await self.host.weights_version(), self._max_request_bytes)
        ).encode()

    async def __call__(self, request: Request) -> Response:
        try:
            return await self._answer(request)
        except HttpError as err:
            return json_response(error_body(err), err.status)
        except Exception as err:  # any other fault is this request's 500 (logged)
            logger.exception("request to %s failed", request.url.path)
            return json_response(error_body(f"server error: {one_line(err)}"), 500)

    async def _answer(self, request: Request) -> Response:
        path = request.url.path.rstrip("/") or "/"
        method = self.routes.get(self.route_of(path))
        if method is None:
            raise HttpError(404, f"path: expected one of {sorted(self.routes)}, got {path[:80]!r}")
        if request.method != method:
            raise HttpError(405, f"method: expected {method} for {path}, got {request.method}")
        if path == HEALTH:
            return json_response(b'{"status": "ok"}')
        check_authorization(request.headers.get("authorization"), self._digest)
        if path == SPEC:
            return json_response(self._spec)
        if path == STATS:
            return json_response(json.dumps(await self.host.stats()).encode())
        if path == ACTIONS:
            return await self._actions(request)
        return await self._answer_more(path, request)

    def route_of(self, path: str) -> str:
        """The key in `routes` of a request's path (a subclass's may hold parameters)."""
        return path

    async def _answer_more(self, path: str, request: Request) -> Response:
        """A route of a subclass's (`routes` lists them), after the token was checked."""
        raise HttpError(404, f"path: expected one of {sorted(self.routes)}, got {path[:80]!r}")

    async def _actions(self, request: Request) -> Response:
        body = await self.read_body(request)
        checked = parse_action_request(body, self._schema)
        try:
            actions, state_out, extra = await self.host.compute_actions(
                checked.obs,
                checked.state,
                explore=checked.explore,
                prev_action_batch=checked.prev_actions,
                prev_reward_batch=checked.prev_rewards,
            )
        except ValueError as err:  # what the host's own check refused
            raise HttpError(400, one_line(err)) from None
        return json_response(action_response(actions, state_out, extra["weights_version"]))

    async def read_body(self, request: Request) -> bytes:
        """The body, refused (413) by its Content-Length before any of it is read, or as
        soon as more than the limit has arrived when no length was declared."""
        limit = self._max_request_bytes
        check_content_length(request.headers.get("content-length"), limit)
        chunks: list[Any] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large(limit, size)
            chunks.append(chunk)
        return b"".join(chunks)

"""TrainingDeployment: the serving API plus external episodes (episode_api), for
`policy-service train --external-env`.

    app = training_app(policy_cls, obs_space, action_space, config, digest, settings, 60.0,
                       ServerAddress("127.0.0.1", 9900))
    direct_ingress.start(ServerAddress("127.0.0.1", 9900), app, APP_NAME)
    replica = serve.get_deployment_handle(DEPLOYMENT_NAME, APP_NAME)
    replica.set_weights.remote(weights, version).result()     # the learner's newest
    replica.take.remote(min_rows, wait_s).result()             # -> (batch, metrics) or None

One replica: the episodes live in it (an EpisodeRecorder beside the PolicyHost), and
the driver's calls reach the same one. /v1/actions answers from the same weights. The
replica answers its clients' HTTP on the address itself (Serve's direct ingress, see
direct_ingress.py), not through Serve's proxy.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response

from policy_service.client.exported_policy import MODEL_DIR, pack_model
from policy_service.errors import json_kind, one_line
from policy_service.serving import direct_ingress, episode_api
from policy_service.serving.deployment import (
    ROUTES,
    PolicyDeployment,
    ServingSettings,
    deployment_options,
    json_response,
    policy_host,
)
from policy_service.serving.episode_api import (
    EPISODES,
    EXPERIENCES,
    MODEL,
    WEIGHTS_VERSION_HEADER,
)
from policy_service.serving.episodes import EpisodeRecorder
from policy_service.serving.http_api import HttpError, read_json_object

if TYPE_CHECKING:
    from policy_service.serving.server import ServerAddress

EPISODE_ROUTE = EPISODES + "/{id}/{verb}"


def training_app(
    policy_cls: type,
    observation_space,
    action_space,
    config,
    token_digest: bytes,
    settings: ServingSettings,
    episode_timeout_s: float,
    address: ServerAddress,
):
    """The Serve application of a training server: one replica, whatever settings say,
    answering HTTP itself (direct_ingress.start serves it)."""
    from ray import serve

    from policy_service.policy import models

    options = deployment_options(settings)
    options.update(
        num_replicas=1,
        ray_actor_options=direct_ingress.replica_options(options["ray_actor_options"]),
    )
    deployment = serve.deployment(**options)(TrainingDeployment)
    policy = (policy_cls, observation_space, action_space, config, models.custom_model_registry())
    return deployment.bind(policy, token_digest, settings, episode_timeout_s, address)


class TrainingDeployment(PolicyDeployment):
    """The replica of a training server: actions for clients, their episodes recorded."""

    routes = {**ROUTES, EPISODES: "POST", EPISODE_ROUTE: "POST", EXPERIENCES: "POST", MODEL: "GET"}

    async def __init__(  # type: ignore[misc]
        self,
        policy: tuple,
        token_digest: bytes,
        settings: ServingSettings,
        episode_timeout_s: float,
        address: ServerAddress,
    ):
        """`address`: where this replica will answer (Serve binds it once this returns)."""
        policy_cls, observation_space, action_space, config, custom_models = policy
        self.host = policy_host(
            policy_cls, observation_space, action_space, config, settings, custom_models
        )
        self.replica_id = secrets.token_hex(8)  # a replica Serve starts anew has another
        await self._serve_with(token_digest, settings)
        self.episodes = EpisodeRecorder(self.host, episode_timeout_s)
        self._model_tar: tuple[int, bytes] | None = None
        self._export_lock = asyncio.Lock()
        direct_ingress.bind_reusing_address()
        await direct_ingress.port_released(address.host, address.port)

    # ----- the driver's calls (a deployment handle) -------------------------------------

    async def set_weights(self, weights: dict, version: int) -> int:
        return await self.host.set_weights(weights, version)

    async def set_global_timestep(self, timestep: int) -> None:
        await self.host.set_global_timestep(timestep)

    async def take(self, min_rows: int, wait_s: float) -> tuple[str, tuple | None]:
        """(replica_id, (batch, metrics) of every completed step once min_rows are
        ready, or None after wait_s)."""
        return self.replica_id, await self.episodes.take(min_rows, wait_s)

    async def weights_version(self) -> int:
        return await self.host.weights_version()

    # ----- the clients' calls -----------------------------------------------------------

    def route_of(self, path: str) -> str:
        return EPISODE_ROUTE if episode_api.episode_route(path) is not None else path

    async def _answer_more(self, path: str, request: Request) -> Response:
        if path == MODEL:
            return await self._model()
        body = await self.read_body(request)
        try:
            if path == EPISODES:
                data = read_json_object(body or b"{}", ("episode_id", "training_enabled"))
                episode_id = self.episodes.start(episode_api.parse_start(data))
                return _json({"episode_id": episode_id})
            if path == EXPERIENCES:
                data = read_json_object(body, ("episodes",))
                await self.episodes.upload(episode_api.parse_experiences(data, self._schema))
                return _json({"weights_version": await self.host.weights_version()})
            route = episode_api.episode_route(path)
            assert route is not None  # route_of let only these through
            return await self._episode_call(route, body)
        except ValueError as err:  # what the host's own check refused
            raise HttpError(400, one_line(err)) from None

    async def _episode_call(self, route: episode_api.EpisodeRoute, body: bytes) -> Response:
        schema, eid = self._schema, route.episode_id
        if route.verb == "log_returns":
            data = read_json_object(body, ("reward", "info"))
            info = data.get("info")  # accepted as RLlib's clients send it; env runners keep none
            if info is not None and not isinstance(info, dict):
                raise HttpError(400, f"info: expected a JSON object or null, got {json_kind(info)}")
            self.episodes.log_returns(
                eid, episode_api.reward(episode_api.required(data, "reward", "a number"))
            )
            return _json({})
        fields = {"action": ("obs",), "log_action": ("obs", "action"), "end": ("obs", "truncated")}
        data = read_json_object(body, (*fields[route.verb], "reward"))
        obs = episode_api.one_obs(episode_api.required(data, "obs", "one observation"), schema)
        action = None
        if route.verb == "log_action":
            logged = episode_api.required(data, "action", "the action taken")
            action = episode_api.actions([logged], schema, 1, "action")
        cut = episode_api.truncated(data)
        if "reward" in data:  # the last action's reward, sent with this call (one request less)
            self.episodes.log_returns(eid, episode_api.reward(data["reward"]))
        if route.verb == "action":
            chosen, version = await self.episodes.act(eid, obs)
            return _json({"action": chosen.tolist(), "weights_version": version})
        if action is not None:
            await self.episodes.log_action(eid, obs, action)
        else:
            await self.episodes.end(eid, obs, cut)
        return _json({})

    async def _model(self) -> Response:
        """The acting SavedModel of the current weights, as a tar (exported once per version)."""
        async with self._export_lock:
            version = await self.host.weights_version()
            if self._model_tar is None or self._model_tar[0] != version:
                with tempfile.TemporaryDirectory() as tmp:
                    exported, timestep = await self.host.export_saved_model(
                        str(Path(tmp) / MODEL_DIR)
                    )
                    self._model_tar = (exported, pack_model(Path(tmp), exported, timestep))
            version, tar_bytes = self._model_tar
        return Response(
            tar_bytes,
            media_type="application/x-tar",
            headers={WEIGHTS_VERSION_HEADER: str(version)},
        )


def _json(value: dict) -> Response:
    return json_response(json.dumps(value).encode())

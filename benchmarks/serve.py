"""HTTP serving: actions/s and latency for 1..64 keep-alive clients, beside Serve's ceiling.

Targets, one after another in one child process (one local Ray, one Serve HTTP proxy
on 127.0.0.1), each a Serve application on one replica (num_cpus=1):
  ceiling          a bare Serve deployment returning a constant body: what Serve's
                   proxy and routing cost alone, the bound on any policy behind them
  ceiling/body     the same, reading the request body first (in a replica that is a
                   call back to the proxy): the bound on any server that reads its input
  policy/batcher   PolicyDeployment, what `policy-service serve` runs: the full API
                   (token, body limit, request checks) and PolicyHost's RequestBatcher
  policy/serve     the same API and checks, batched by Serve's `@serve.batch` instead
                   (same max batch size and wait), the forward pass in an executor thread

The policy is the PPO MLP 4 -> 256x256 (CartPole spaces). Each client is an asyncio
connection kept alive in a closed loop: POST one observation, read the answer, again,
for --duration seconds, all clients together after a warm-up. Latency is the round
trip a client sees; actions/s counts every client's answered requests.

    python -m benchmarks.serve                  # ~3 min
    python -m benchmarks.serve --smoke
    python -m benchmarks.serve --clients 1,16 --duration 5
"""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np

from benchmarks import harness, inference, plots, stats

NAME = "serve"
VALUE = "actions_per_s"
KEYS = ("target", "clients")
WORKLOAD = "PPO MLP 4 -> 256x256, one observation per HTTP request"
TOKEN = "benchmark-token"
TARGETS = ("ceiling", "ceiling/body", "policy/batcher", "policy/serve")
CONSTANT_BODY = b'{"actions": [0], "state_out": [], "weights_version": 0}\n'


# ----- HTTP clients (asyncio, keep-alive) -----------------------------------------------------


def request_bytes(port: int, body: bytes) -> bytes:
    return (
        f"POST /v1/actions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """(status, body) of one HTTP/1.1 response: Content-Length or chunked."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {
        k.strip().lower(): v.strip()
        for k, _, v in (line.partition(":") for line in lines[1:] if line)
    }
    if "content-length" in headers:
        return status, await reader.readexactly(int(headers["content-length"]))
    body = b""
    while True:  # chunked
        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
        chunk = await reader.readexactly(size + 2)
        if size == 0:
            return status, body
        body += chunk[:-2]


async def connect(port: int, request: bytes, warmup: int):
    """A keep-alive connection that has made `warmup` requests."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(warmup):
        writer.write(request)
        await read_response(reader)
    return reader, writer


async def closed_loop(connection, request: bytes, end_at: float) -> tuple[list[float], int]:
    """Request, answer, request again until end_at -> (latencies in s, non-200 answers)."""
    reader, writer = connection
    latencies, failures = [], 0
    try:
        while time.perf_counter() < end_at:
            sent = time.perf_counter()
            writer.write(request)
            status, _ = await read_response(reader)
            latencies.append(time.perf_counter() - sent)
            failures += status != 200
    finally:
        writer.close()
    return latencies, failures


def drive(port: int, body: bytes, clients: int, duration_s: float, warmup: int = 10) -> dict:
    """`clients` keep-alive clients against the server, all warmed up before any is
    measured -> throughput and latency."""
    request = request_bytes(port, body)

    async def run():
        connections = await asyncio.gather(
            *[connect(port, request, warmup) for _ in range(clients)]
        )
        end_at = time.perf_counter() + duration_s
        return await asyncio.gather(*[closed_loop(c, request, end_at) for c in connections])

    results = asyncio.run(run())
    latencies_ms = np.concatenate([np.asarray(r[0]) for r in results]) * 1e3
    return {
        "requests": int(len(latencies_ms)),
        VALUE: len(latencies_ms) / duration_s,
        "failures": int(sum(r[1] for r in results)),
        "p50_ms": stats.percentile(latencies_ms, 50),
        "p99_ms": stats.percentile(latencies_ms, 99),
        "mean_ms": float(latencies_ms.mean()) if len(latencies_ms) else None,
    }


# ----- the Serve applications ----------------------------------------------------------------


def ceiling_app(read_body: bool):
    from ray import serve
    from starlette.responses import Response

    from policy_service.serving.deployment import SHUTDOWN_CHECK_PERIOD_S

    @serve.deployment(
        name="Ceiling",
        num_replicas=1,
        max_ongoing_requests=1000,
        graceful_shutdown_wait_loop_s=SHUTDOWN_CHECK_PERIOD_S,
        ray_actor_options={"num_cpus": 1},
    )
    class Ceiling:
        """Answers every request with the same body, reading nothing else (or its body)."""

        async def __call__(self, request) -> Response:
            if read_body:
                await request.body()
            return Response(CONSTANT_BODY, media_type="application/json")

    return Ceiling.bind()


def serve_batch_app(policy_state: dict, settings):
    """The HTTP API of PolicyDeployment (no stats, no state), batched by `@serve.batch`."""
    from concurrent.futures import ThreadPoolExecutor

    from ray import serve
    from starlette.responses import Response

    from policy_service.serving import http_api
    from policy_service.serving.deployment import SHUTDOWN_CHECK_PERIOD_S

    @serve.deployment(
        name="ServeBatch",
        num_replicas=1,
        max_ongoing_requests=1000,
        graceful_shutdown_wait_loop_s=SHUTDOWN_CHECK_PERIOD_S,
        ray_actor_options={"num_cpus": 1},
    )
    class ServeBatch:
        def __init__(self, state: dict, digest: bytes):
            from policy_service.config import on_cpu
            from policy_service.engine import devices
            from policy_service.policy.tf_policy import TFPolicy

            devices.prepare_process(1, intra_op_threads=devices.assigned_cpu_threads())
            self.policy = TFPolicy.from_state({**state, "config": on_cpu(state["config"])})
            self.schema = http_api.RequestSchema.of(self.policy)
            self.digest = digest
            self.executor = ThreadPoolExecutor(1)
            self.act.set_max_batch_size(settings.max_batch_size)
            self.act.set_batch_wait_timeout_s(settings.batch_wait_timeout_s)

        @serve.batch(batch_size_fn=lambda requests: sum(r.num_rows for r in requests))
        async def act(self, requests: list) -> list:
            obs = np.concatenate([r.obs for r in requests])
            actions, _, _ = await asyncio.get_running_loop().run_in_executor(
                self.executor, lambda: self.policy.compute_actions(obs, explore=False)
            )
            results, start = [], 0
            for r in requests:
                results.append(actions[start : start + r.num_rows])
                start += r.num_rows
            return results

        async def __call__(self, request) -> Response:
            try:
                http_api.check_authorization(request.headers.get("authorization"), self.digest)
                http_api.check_content_length(
                    request.headers.get("content-length"), settings.max_request_bytes
                )
                checked = http_api.parse_action_request(await request.body(), self.schema)
            except http_api.HttpError as err:
                return Response(http_api.error_body(err), status_code=err.status)
            actions = await self.act(checked)
            return Response(http_api.action_response(actions, [], 0), media_type="application/json")

    return ServeBatch.bind(policy_state, http_api.token_digest(TOKEN))


def start_target(target: str, policy_state: dict, settings):
    from policy_service.serving.deployment import policy_app
    from policy_service.serving.http_api import token_digest

    if target.startswith("ceiling"):
        return ceiling_app(read_body=target == "ceiling/body")
    if target == "policy/batcher":
        return policy_app(policy_state, token_digest(TOKEN), settings)
    return serve_batch_app(policy_state, settings)


def server_stats(port: int) -> dict:
    """The replica's PolicyHost statistics (policy/batcher only)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/v1/stats", headers={"Authorization": f"Bearer {TOKEN}"})
    data = json.loads(conn.getresponse().read())
    conn.close()
    return data


# ----- child ---------------------------------------------------------------------------------


def measure(spec: dict):
    import ray
    from ray import serve

    from benchmarks import ppo_shaped
    from policy_service.serving.deployment import ServingSettings

    policy_state = ppo_shaped.make_policy("mlp", 1).get_state()
    settings = ServingSettings(
        max_batch_size=spec["max_batch_size"], batch_wait_timeout_s=spec["wait_ms"] / 1e3
    )
    body = json.dumps({"obs": [[0.01, -0.02, 0.03, -0.04]], "explore": False}).encode()
    port = harness.free_port()
    base = {
        "bench": NAME,
        "round": spec["round"],
        "duration_s": spec["duration"],
        "max_batch_size": settings.max_batch_size,
        "wait_ms": spec["wait_ms"],
    }
    ray.init(**harness.RAY_INIT)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")
        for i, target in enumerate(spec["targets"]):
            serve.run(start_target(target, policy_state, settings), name=NAME, route_prefix="/")
            for clients in spec["clients"]:
                before = server_stats(port) if target == "policy/batcher" else None
                result = drive(port, body, clients, spec["duration"])
                extra = {}
                if before is not None:
                    after = server_stats(port)
                    passes = after["num_forward_passes"] - before["num_forward_passes"]
                    rows = after["num_rows"] - before["num_rows"]
                    extra = {"mean_batch_size": rows / passes if passes else None}
                yield dict(base, target=target, clients=clients, **result, **extra)
            if i < len(spec["targets"]) - 1:  # serve.shutdown deletes the last
                serve.delete(NAME)
        serve.shutdown()
    finally:
        ray.shutdown()


# ----- parent --------------------------------------------------------------------------------


def configurations(args) -> list[dict]:
    clients = [int(c) for c in (args.clients or ("1,16" if args.smoke else "1,16,64")).split(",")]
    return [
        dict(
            target="http",
            targets=list(TARGETS),
            clients=clients,
            duration=0.5 if args.smoke else args.duration,
            max_batch_size=args.max_batch_size,
            wait_ms=args.wait_ms,
            prepare_tf=False,
        )
    ]


def summarize(records: list[dict]) -> list[dict]:
    summary = stats.summarize_each(records, KEYS, (VALUE, "p50_ms", "p99_ms", "mean_batch_size"))
    for row in summary:
        if row["target"].startswith("policy"):
            for ceiling in ("ceiling", "ceiling/body"):
                row["vs_" + ceiling.replace("/", "_")] = stats.ratio(
                    row[VALUE], stats.find(summary, VALUE, target=ceiling, clients=row["clients"])
                )
    return summary


def plot(summary: list[dict], out_dir: str) -> str | None:
    series = {
        "bare Serve deployment (constant)": {"target": "ceiling"},
        "bare, reading the body": {"target": "ceiling/body"},
        "policy-service serve (RequestBatcher)": {"target": "policy/batcher"},
        "same API, @serve.batch": {"target": "policy/serve"},
    }
    title = "HTTP serving, one observation per request, keep-alive clients"
    path = f"{out_dir}/{NAME}.png"
    return plots.count_chart(
        path, title, "actions/s", summary, VALUE, ("clients", "clients"), series
    )


def add_flags(parser) -> None:
    parser.add_argument("--clients", default=None, help="default 1,16,64 (smoke 1,16)")
    inference.add_batching_flags(parser)


if __name__ == "__main__":
    harness.main(__name__, timeout=lambda spec: 1800)

"""Training servers for simulators outside Ray: actions/s and get_action latency for
N client processes, ours beside RLlib's old-stack PolicyServerInput.

Targets, alternating within each round, each in its own child process that starts its
server once and drives it with every client count in turn (at --smoke ours, ceiling and
uvicorn take turns in one child and one Ray: harness.together):
  ours   ExternalEnvRunners on Ray Serve, what `policy-service train ppo --external-env`
         serves (token, JSON, one replica answering HTTP itself: Serve's direct
         ingress); clients: policy_service.client.policy_client.PolicyClient
  ceiling  a bare Serve deployment answering the same protocol with constants (it reads
         each body, as any server must), served as ours is (direct ingress): what
         Serve's request path costs per step, the bound on any server on it; the same
         clients as ours
  uvicorn  not a server we ship: the same TrainingDeployment class, served by uvicorn in
         one process with no Ray (no Serve replica around it), its fragments taken as
         ours: what Serve's replica costs ours
  rllib  PolicyServerInput in an RLlib PPO Algorithm (old API stack, framework "tf",
         connectors off as RLlib's own server example has them), RLlib 2.35 (2.40's
         no longer serves remote clients, 2.60 has no server) in its own virtualenv
         (.venv-rllib-server, made on first use); clients: RLlib's PolicyClient
All in remote inference mode, a PPO MLP 4 -> 256x256 (CartPole spaces) exploring,
fragments of 200 steps postprocessed (GAE) as training would, no SGD: ours and uvicorn
have their fragments taken (a driver thread, a task), RLlib's inference thread queues
its own.

Each client is a process (benchmarks/episode_clients.py) playing CartPole-v1: per step
get_action then log_returns. All clients of a count warm up, then start together and
time their get_action calls for --duration seconds; actions/s is the sum over clients.

    python -m benchmarks.serve_rllib                  # ~23 min (3 rounds, loaded)
    python -m benchmarks.serve_rllib --smoke
    python -m benchmarks.serve_rllib --clients 1,4 --duration 10 --rounds 1
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

from benchmarks import harness, stats

NAME = "serve_rllib"
VALUE = "actions_per_s"
KEYS = ("target", "clients")
TARGETS = ("ours", "ceiling", "uvicorn", "rllib")
WORKLOAD = "PPO MLP 4 -> 256x256, CartPole-v1 episodes from client processes, remote inference"
TOKEN = "benchmark-token"
FRAGMENT = 200
HIDDENS = [256, 256]
READY_TIMEOUT_S = 600  # N client processes importing their libraries on a loaded machine


# ----- the servers (each in its target's child) ----------------------------------------------


def start_ours(port: int):
    """ExternalEnvRunners on this port, and a thread taking its fragments -> stop()."""
    import gymnasium as gym

    from algorithms.ppo import PPOPolicy
    from policy_service.serving.external_env_runners import ExternalEnvRunners
    from policy_service.serving.server import ServerAddress

    harness.ray_init(**harness.RAY_INIT)
    env = gym.make("CartPole-v1")
    config = {"model": {"fcnet_hiddens": HIDDENS, "fcnet_activation": "tanh"}}
    runners = ExternalEnvRunners(
        PPOPolicy,
        env.observation_space,
        env.action_space,
        config,
        address=ServerAddress("127.0.0.1", port),
        token=TOKEN,
        rollout_fragment_length=FRAGMENT,
    )
    done = threading.Event()

    def take_fragments():
        while not done.is_set():
            runners.sample_async(timeout_s=1.0)

    taker = threading.Thread(target=take_fragments, daemon=True)
    taker.start()

    def stop():
        done.set()
        taker.join()
        runners.stop()
        harness.ray_shutdown()

    return stop


def start_ceiling(port: int):
    """The constant-answer Serve deployment on this port -> stop()."""
    import gymnasium as gym
    from ray import serve
    from starlette.responses import Response

    from algorithms.ppo import PPOPolicy
    from policy_service.serving import direct_ingress
    from policy_service.serving.http_api import DEFAULT_MAX_REQUEST_BYTES, api_spec
    from policy_service.serving.server import ServerAddress

    env = gym.make("CartPole-v1")
    policy = PPOPolicy(env.observation_space, env.action_space, {"model": {"fcnet_hiddens": [8]}})
    spec = json.dumps(api_spec(policy, 0, DEFAULT_MAX_REQUEST_BYTES)).encode()
    answers = {"/v1/episodes": b'{"episode_id": "e"}', "action": b'{"action": 0}'}

    @serve.deployment(
        name="EpisodeCeiling",
        max_ongoing_requests=1000,
        ray_actor_options=direct_ingress.replica_options({"num_cpus": 1}),
    )
    class EpisodeCeiling:
        """Each call's answer by its path, after reading its body; GET: the real spec."""

        async def __call__(self, request) -> Response:
            if request.method == "GET":
                return Response(spec, media_type="application/json")
            await request.body()
            path = request.url.path
            body = answers.get(path) or answers.get(path.rsplit("/", 1)[-1], b"{}")
            return Response(body, media_type="application/json")

    harness.ray_init(**harness.RAY_INIT)
    direct_ingress.start(ServerAddress("127.0.0.1", port), EpisodeCeiling.bind(), NAME)

    def stop():
        serve.shutdown()
        harness.ray_shutdown()

    return stop


def start_uvicorn(port: int):
    """TrainingDeployment under uvicorn in a thread of this process, no Ray -> stop()."""
    import asyncio

    import gymnasium as gym
    import uvicorn
    from starlette.requests import Request

    from algorithms.ppo import PPOPolicy
    from policy_service.serving.deployment import ServingSettings
    from policy_service.serving.http_api import token_digest
    from policy_service.serving.server import ServerAddress
    from policy_service.serving.training_deployment import TrainingDeployment

    env = gym.make("CartPole-v1")
    config = {"model": {"fcnet_hiddens": HIDDENS, "fcnet_activation": "tanh"}}
    policy = (PPOPolicy, env.observation_space, env.action_space, config, {})
    started, servers = threading.Event(), []

    async def serve_here():
        deployment = TrainingDeployment.__new__(TrainingDeployment)  # its __init__ is async
        address = ServerAddress("127.0.0.1", port)
        await deployment.__init__(policy, token_digest(TOKEN), ServingSettings(), 60.0, address)

        async def app(scope, receive, send):
            response = await deployment(Request(scope, receive))
            await response(scope, receive, send)

        server = uvicorn.Server(
            uvicorn.Config(app, "127.0.0.1", port, lifespan="off", log_level="warning")
        )
        servers.append(server)

        async def take_fragments():
            while not server.should_exit:
                await deployment.take(FRAGMENT, 1.0)

        taker = asyncio.create_task(take_fragments())
        started.set()
        await server.serve()
        await taker

    thread = threading.Thread(target=lambda: asyncio.run(serve_here()), daemon=True)
    thread.start()
    started.wait(300)

    def stop():
        servers[0].should_exit = True
        thread.join(60)

    return stop


def start_rllib(port: int):
    """RLlib's PPO with PolicyServerInput on this port (its threads serve) -> stop()."""
    import gymnasium as gym
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.env.policy_server_input import PolicyServerInput

    harness.ray_init(**harness.RAY_INIT)
    env = gym.make("CartPole-v1")
    config = (
        PPOConfig()
        .api_stack(enable_rl_module_and_learner=False, enable_env_runner_and_connector_v2=False)
        .framework("tf")
        .environment(
            env=None, observation_space=env.observation_space, action_space=env.action_space
        )
        .offline_data(input_=lambda ioctx: PolicyServerInput(ioctx, "127.0.0.1", port))
        .env_runners(
            num_env_runners=0, rollout_fragment_length=FRAGMENT, enable_connectors=False
        )  # its ExternalEnv takes no connectors (RLlib's own server example sets this)
        .training(
            train_batch_size=FRAGMENT, model={"fcnet_hiddens": HIDDENS, "fcnet_activation": "tanh"}
        )
        .evaluation(off_policy_estimation_methods={})
    )
    algo = config.build()

    def stop():
        algo.stop()
        harness.ray_shutdown()

    return stop


# ----- the clients -----------------------------------------------------------------------------


# At --smoke RLlib's clients skip RLlib's TensorFlow import (RLlib's own switch for its
# tests): a remote-mode PolicyClient sends requests and never runs a model, and each
# client process paid seconds of CPU importing TF before it could connect.
SMOKE_RLLIB_CLIENT_ENV = {"RLLIB_TEST_NO_TF_IMPORT": "1", "RLLIB_TEST_NO_TORCH_IMPORT": "1"}


def drive(
    target: str,
    port: int,
    clients: int,
    duration_s: float,
    lead_s: float = 1.0,
    client_env: dict | None = None,
) -> dict:
    """`clients` processes (client_env added to their environment), started together
    once all are warm, the start time sent lead_s ahead -> throughput and latency."""
    kind = "rllib" if target == "rllib" else "ours"  # the ceiling speaks our protocol
    env = dict(os.environ, POLICY_SERVICE_TOKEN=TOKEN, **(client_env or {}))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "benchmarks.episode_clients", kind, f"http://127.0.0.1:{port}"]
            + ["--duration", str(duration_s), "--seed", str(i)],
            cwd=harness.REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(clients)
    ]
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        for proc in procs:
            line = proc.stdout.readline()
            if line.strip() != "ready" or time.monotonic() > deadline:
                raise RuntimeError(f"client not ready: {line!r} {proc.stderr.read()[-2000:]}")
        start_at = time.time() + lead_s
        for proc in procs:
            proc.stdin.write(f"{start_at}\n")
            proc.stdin.flush()
        results = []
        for proc in procs:
            out, err = proc.communicate(timeout=duration_s + 300)
            if proc.returncode != 0:
                raise RuntimeError(f"client exited {proc.returncode}: {err[-2000:]}")
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    latencies = [x for r in results for x in r["latencies_ms"]]
    return {
        "actions": len(latencies),
        VALUE: len(latencies) / duration_s,
        "p50_ms": stats.percentile(latencies, 50),
        "p90_ms": stats.percentile(latencies, 90),
        "p99_ms": stats.percentile(latencies, 99),
        "per_client_min": min(r["actions"] for r in results) / duration_s,
        "retries": sum(r["retries"] for r in results),
    }


# ----- child -------------------------------------------------------------------------------------


def measure(spec: dict):
    port = harness.free_port()
    starts = {
        "ours": start_ours,
        "ceiling": start_ceiling,
        "uvicorn": start_uvicorn,
        "rllib": start_rllib,
    }
    stop = starts[spec["target"]](port)
    try:
        for clients in spec["clients"]:
            result = drive(
                spec["target"],
                port,
                clients,
                spec["duration"],
                spec.get("lead_s", 1.0),
                spec.get("client_env"),
            )
            yield {
                "bench": NAME,
                "round": spec["round"],
                "target": spec["target"],
                "clients": clients,
                "duration_s": spec["duration"],
                "load_avg_1m": os.getloadavg()[0],
                **result,
            }
    finally:
        stop()


# ----- parent ------------------------------------------------------------------------------------


def configurations(args) -> list[dict]:
    # smoke: two counts prove the loop over counts; each RLlib client process imports RLlib
    clients = [int(c) for c in (args.clients or ("1,2" if args.smoke else "1,4,16")).split(",")]
    return [
        dict(
            target=target,
            clients=clients,
            # smoke: one second timed per count (an RLlib client makes ~100 calls in it
            # at load 20), the start sent 0.2 s ahead
            duration=1.0 if args.smoke else args.duration,
            lead_s=0.2 if args.smoke else 1.0,
            client_env=SMOKE_RLLIB_CLIENT_ENV if args.smoke and target == "rllib" else {},
            prepare_tf=False,
            **({"rllib_python": args.rllib_python} if target == "rllib" else {}),
        )
        for target in (args.targets.split(",") if args.targets else TARGETS)
    ]


def rllib_python(spec: dict) -> str | None:
    """RLlib's target runs under its own virtualenv's interpreter (--rllib-python as
    given, else .venv-rllib-server's, made or checked here)."""
    if spec["target"] != "rllib":
        return None
    if spec.get("rllib_python"):
        return spec["rllib_python"]
    from benchmarks import rllib_env

    return rllib_env.ensure_rllib_server_venv()


def summarize(records: list[dict]) -> list[dict]:
    summary = stats.summarize_each(records, KEYS, (VALUE, "p50_ms", "p90_ms", "p99_ms"))
    for row in summary:
        if row["target"] != "rllib":
            for other in ("rllib", "ceiling"):
                value = stats.find(summary, VALUE, target=other, clients=row["clients"])
                row[f"vs_{other}"] = stats.ratio(row[VALUE], value)
    return summary


def plot(summary: list[dict], out_dir: str) -> str | None:
    from benchmarks import plots

    series = {
        "policy-service (Serve direct ingress, JSON)": {"target": "ours"},
        "bare Serve deployment, constant answers": {"target": "ceiling"},
        "ours without Serve (uvicorn, one process)": {"target": "uvicorn"},
        "RLlib 2.35 PolicyServerInput": {"target": "rllib"},
    }
    title = "Training servers, remote inference: CartPole episodes from client processes"
    return plots.count_chart(
        f"{out_dir}/{NAME}.png", title, "actions/s", summary, VALUE, ("clients", "clients"), series
    )


def add_flags(parser) -> None:
    parser.add_argument("--clients", default=None, help="client processes, default 1,4,16")
    parser.add_argument("--duration", type=float, default=15.0, help="seconds timed per count")
    parser.add_argument("--targets", default=None, help=f"default {','.join(TARGETS)}")
    parser.add_argument(
        "--rllib-python",
        default=None,
        help="RLlib 2.35's python, used as given: no import check (its caller checked the "
        "venv, as the tests do); default: .venv-rllib-server's, made or checked first",
    )


if __name__ == "__main__":
    harness.main(__name__, python=rllib_python, timeout=lambda spec: 3600, together_at_smoke=True)

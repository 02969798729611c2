"""Ray Compiled Graphs (ray.dag) for remote acting: vector env steps/s per round trip.

Issue 22's trial. Remote acting (`remote_inference`, `inference: learners`) pays one Ray
call per vector step, about 1 ms here, where a runner acting itself pays none. Ray's
Compiled Graphs promise "less than 50 us" per call for a graph executed again and again.
Each target steps one env runner actor (a sync vector env of N CartPole-v1 copies) for a
fixed number of vector steps with a PPO MLP (4 -> 256x256) choosing the actions:

- local: the runner's own policy acts (no round trip: the ceiling);
- classic: the runner calls a policy actor's `act` per step with `.remote` / `ray.get`
  (what our PolicyActor mode does);
- compiled: the driver executes a compiled graph per step, observations -> the policy
  actor's `act` -> the runner's `step` (a compiled graph can only be executed by the
  process that compiled it, so the driver drives; the env runners could not call it).

    python -m benchmarks.ray_dag_trial               # ~3 min
    python -m benchmarks.ray_dag_trial --smoke

Results: benchmarks/history/sampling.md, "Ray Compiled Graphs for remote acting".
"""

from __future__ import annotations

import time

import numpy as np

from benchmarks import harness, plots, stats

NAME = "ray_dag_trial"
VALUE = "ms_per_vector_step"
KEYS = ("target", "envs")
WORKLOAD = "CartPole-v1 sync vector env in a runner actor, PPO MLP 4 -> 256x256 acting"
TARGETS = ("local", "classic", "compiled")


def _policy():
    import gymnasium as gym

    from algorithms.ppo import PPOPolicy

    env = gym.make("CartPole-v1")
    return PPOPolicy(env.observation_space, env.action_space, {"seed": 0, "num_gpus": 0})


class Actor:
    """Chooses actions for a batch of observations (the remote policy)."""

    def __init__(self):
        self.policy = _policy()

    def act(self, obs: np.ndarray) -> np.ndarray:
        return self.policy.compute_actions(obs, explore=True)[0]


class Runner:
    """A sync vector env; acts itself ("local"), through an actor ("classic"), or
    steps with the actions a compiled graph hands it ("compiled")."""

    def __init__(self, num_envs: int, seed: int, local_policy: bool):
        import gymnasium as gym

        self.envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * num_envs)
        self.obs, _ = self.envs.reset(seed=seed)
        self.policy = _policy() if local_policy else None
        self.steps = 0

    def observations(self, _step: int) -> np.ndarray:
        return self.obs

    def step(self, actions: np.ndarray) -> int:
        self.obs, *_ = self.envs.step(actions)
        self.steps += 1
        return self.steps

    def run(self, steps: int, actor=None) -> float:
        """Seconds for `steps` vector steps, acting locally or through `actor`."""
        import ray

        start = time.perf_counter()
        for _ in range(steps):
            if actor is None:
                actions = self.policy.compute_actions(self.obs, explore=True)[0]
            else:
                actions = ray.get(actor.act.remote(self.obs))
            self.step(actions)
        return time.perf_counter() - start


def _timed_steps(spec: dict) -> float:
    """Seconds for spec["steps"] vector steps of spec["target"], after a warm-up."""
    import ray
    from ray.dag import InputNode

    target, warmup, steps = spec["target"], spec["warmup"], spec["steps"]
    runner = ray.remote(Runner).options(num_cpus=0).remote(spec["envs"], 0, target == "local")
    if target == "local":
        ray.get(runner.run.remote(warmup))
        return ray.get(runner.run.remote(steps))
    actor = ray.remote(Actor).options(num_cpus=0).remote()
    if target == "classic":
        ray.get(runner.run.remote(warmup, actor))
        return ray.get(runner.run.remote(steps, actor))
    with InputNode() as step:
        graph = runner.step.bind(actor.act.bind(runner.observations.bind(step)))
    compiled = graph.experimental_compile()
    try:
        for i in range(warmup):
            ray.get(compiled.execute(i))
        start = time.perf_counter()
        for i in range(steps):
            ray.get(compiled.execute(i))
        return time.perf_counter() - start
    finally:
        compiled.teardown()


def measure(spec: dict):
    import ray

    ray.init(**harness.RAY_INIT)
    try:
        seconds = _timed_steps(spec)
    finally:
        ray.shutdown()
    yield {
        "bench": NAME,
        "target": spec["target"],
        "envs": spec["envs"],
        "round": spec["round"],
        VALUE: 1e3 * seconds / spec["steps"],
        "env_steps_per_s": spec["envs"] * spec["steps"] / seconds,
        "steps": spec["steps"],
    }


def configurations(args) -> list[dict]:
    size = harness.sizes(args, {"steps": 30, "warmup": 5})
    envs = [int(n) for n in args.envs.split(",")]
    return [
        dict(size, target=target, envs=n, prepare_tf=False)
        for n in envs
        for target in args.targets.split(",")
    ]


def summarize(records: list[dict]) -> list[dict]:
    return stats.summarize(records, KEYS, VALUE)


def plot(summary: list[dict], out_dir: str) -> str | None:
    envs = sorted({r["envs"] for r in summary})
    targets = [t for t in TARGETS if any(r["target"] == t for r in summary)]
    return plots.bar_chart(
        f"{out_dir}/{NAME}.png",
        "One vector step of a runner actor with a remote or local policy (ray.dag trial)",
        "ms per vector step (log)",
        [f"{n} envs" for n in envs],
        {t: [stats.find(summary, VALUE, target=t, envs=n) for n in envs] for t in targets},
        log=True,
    )


def add_flags(parser) -> None:
    parser.add_argument("--steps", type=int, default=500, help="timed vector steps")
    parser.add_argument("--warmup", type=int, default=50, help="vector steps before timing")
    parser.add_argument("--envs", default="8", help="sub-envs per runner, e.g. 1,8")
    parser.add_argument("--targets", default=",".join(TARGETS))


if __name__ == "__main__":
    harness.main(__name__)

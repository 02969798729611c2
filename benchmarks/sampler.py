"""Env steps/s of one RolloutWorker on CartPole-v1: 1, 8, 32 vector envs, local and remote
inference.

The worker runs in the child process itself, with PPO's policy (MLP 256x256 tanh)
and PPO's postprocessing (GAE) on every fragment, so a step costs what it costs in
training. local: the policy is a copy inside the worker; remote: the worker sends
observations to a PolicyActor (central inference, batching as EnvRunnerGroup sizes it).

    python -m benchmarks.sampler            # ~2 min
    python -m benchmarks.sampler --smoke

Exactly what is timed: benchmarks/history/methods.md, "What each script measures".
"""

from __future__ import annotations

import time

from benchmarks import harness, plots, stats

NAME = "sampler"
VALUE = "env_steps_per_s"
KEYS = ("inference", "num_envs")
WORKLOAD = "CartPole-v1, PPO MLP 256x256 policy"


def measure(spec: dict):
    from algorithms.ppo import PPOPolicy as policy_cls
    from benchmarks import ppo_shaped
    from policy_service.distributed.rollout_worker import RolloutWorker, fragment_metrics

    config = {"model": dict(ppo_shaped.MODELS["mlp"][2]), "seed": 0}
    remote = spec["inference"] == "remote"
    if remote:
        import gymnasium as gym
        import ray

        from policy_service.distributed.policy_actor import PolicyActor

        ray.init(**harness.RAY_INIT)
        env = gym.make("CartPole-v1")
        obs_space, act_space = env.observation_space, env.action_space
        env.close()
    try:
        for num_envs in spec["num_envs_list"]:
            actor = None
            if remote:
                # as EnvRunnerGroup sizes it: one row per sub-env of all (here: one) workers
                actor = PolicyActor.remote(
                    policy_cls,
                    obs_space,
                    act_space,
                    config,
                    max_batch_size=num_envs,
                    batch_wait_timeout_s=0.002,
                )
                ray.get(actor.stats.remote())
            worker = RolloutWorker(
                "CartPole-v1",
                policy_cls,
                config,
                num_envs=num_envs,
                rollout_fragment_length=spec["fragment"],
                seed=0,
                policy_actor=actor,
            )
            worker.sample()  # warm-up: traces the action function, resets the envs
            steps, seconds, cpu_s, timers = (
                0,
                0.0,
                0.0,
                {"inference_time_s": 0.0, "env_time_s": 0.0, "postprocess_time_s": 0.0},
            )
            end = time.perf_counter() + spec["duration"]
            while time.perf_counter() < end:
                start, cpu_start = time.perf_counter(), time.process_time()
                metrics = fragment_metrics(worker.sample()[1])
                seconds += time.perf_counter() - start
                cpu_s += time.process_time() - cpu_start
                steps += metrics["env_steps"]
                for key in timers:
                    timers[key] += metrics.get(key, 0.0)
            worker.stop()
            if actor is not None:
                ray.kill(actor)
            yield {
                "bench": NAME,
                "inference": spec["inference"],
                "num_envs": num_envs,
                "round": spec["round"],
                "policy_class": policy_cls.__name__,
                "fragment": spec["fragment"],
                "env_steps": steps,
                "seconds": seconds,
                VALUE: steps / seconds,
                # this process's CPU (all its threads): steadier than wall time under load
                "cpu_ms_per_env_step": 1000 * cpu_s / steps,
                **{k.replace("_time_s", "_share"): v / seconds for k, v in timers.items()},
                "threads_actual": harness.tf_threads(),
            }
    finally:
        if remote:
            ray.shutdown()


def configurations(args) -> list[dict]:
    # --smoke: one count, local and remote: each count runs the same code, so the smoke
    # runs the largest of the full run's first two
    num_envs = [int(n) for n in (args.num_envs or ("8" if args.smoke else "1,8,32")).split(",")]
    size = dict(
        num_envs_list=num_envs,
        fragment=50 if args.smoke else args.fragment,
        duration=0.3 if args.smoke else args.duration,  # smoke: one fragment at least
        devices=1,
    )
    return [dict(size, inference=kind) for kind in args.inference.split(",")]


def plot(summary: list[dict], out_dir: str) -> str | None:
    kinds = sorted({r["inference"] for r in summary})
    series = {f"{kind} inference": {"inference": kind} for kind in kinds}
    title = "One RolloutWorker on CartPole-v1 (PPO policy, GAE included)"
    path = f"{out_dir}/{NAME}.png"
    return plots.count_chart(
        path, title, "env steps/s", summary, VALUE, ("num_envs", "envs"), series
    )


def summarize(records: list[dict]) -> list[dict]:
    return stats.summarize(records, KEYS, VALUE)


def add_flags(parser) -> None:
    parser.add_argument("--num-envs", default=None, help="default 1,8,32 (smoke 8)")
    parser.add_argument("--inference", default="local,remote")
    parser.add_argument("--fragment", type=int, default=200, help="steps per sub-env per sample()")
    parser.add_argument("--duration", type=float, default=5.0)


if __name__ == "__main__":
    harness.main(__name__, together_at_smoke=True)

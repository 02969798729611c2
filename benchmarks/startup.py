"""Where a run's start-up seconds go with remote env runners: one JSON line of phase
times, in seconds from the process start, for PPO or APPO from their tuned CartPole
configs. To compare two trees, run it alternately with each on PYTHONPATH:

    PYTHONPATH=/work/before python -m benchmarks.startup --algo ppo --runners 2
    PYTHONPATH=. python -m benchmarks.startup --algo ppo --runners 2

Phases: TensorFlow imported by the driver; ray.init; the algorithm built (of which
the env runner group and the learner group); each runner's process started and up
(a ping sent after the build answered: TensorFlow imported, envs and policy built);
then train() until every runner is up and 3 more iterations, each iteration's end
and whether the driver sampled it (a stand-in while the runners start).
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
T0 = time.time()


def since_start() -> float:
    return round(time.time() - T0, 2)


def timed(cls, name: str, phases: dict, key: str) -> None:
    """Record how long cls.name takes, as phases[key]."""
    method = getattr(cls, name)

    def wrapper(*args, **kwargs):
        start = time.time()
        try:
            return method(*args, **kwargs)
        finally:
            phases[key] = round(time.time() - start, 2)

    setattr(cls, name, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", choices=("ppo", "appo"), default="ppo")
    parser.add_argument("--runners", type=int, default=2)
    parser.add_argument("--ray-cpus", type=int, default=2)
    args = parser.parse_args()
    phases: dict = {"algo": args.algo, "runners": args.runners, "load_1min": os.getloadavg()[0]}
    import tensorflow  # noqa: F401 - timed: the driver's import

    phases["import_tensorflow_s"] = since_start()
    import ray
    import yaml

    from benchmarks import harness
    from benchmarks.harness import REPO
    from policy_service.distributed.env_runner_group import EnvRunnerGroup
    from policy_service.distributed.learner_group import LearnerGroup

    timed(EnvRunnerGroup, "__init__", phases, "env_runners_build_s")
    timed(LearnerGroup, "__init__", phases, "learners_build_s")
    start = time.time()
    ray.init(address="local", num_cpus=args.ray_cpus, include_dashboard=False, log_to_driver=False)
    phases["ray_init_s"] = round(time.time() - start, 2)
    if args.algo == "ppo":
        from algorithms.ppo import PPO as algo_cls
    else:
        from algorithms.appo import APPO as algo_cls
    config = yaml.safe_load(
        (REPO / "algorithms" / "tuned" / f"cartpole_{args.algo}.yaml").read_text()
    )
    config.update(num_env_runners=args.runners, seed=0)
    start = time.time()
    algo = algo_cls(config)
    phases["algorithm_build_s"] = round(time.time() - start, 2)
    phases["algorithm_built_at_s"] = since_start()
    workers = list(algo.env_runners.workers)
    up: list = [None] * len(workers)

    def wait_up(slot: int) -> None:
        ray.get(workers[slot].ping.remote())
        up[slot] = since_start()

    threads = [
        threading.Thread(target=wait_up, args=(s,), daemon=True) for s in range(len(workers))
    ]
    for thread in threads:
        thread.start()
    iterations = []
    try:
        while None in up or sum(1 for i in iterations if not i["in_driver"]) < 3:
            algo.train()
            in_driver = bool(workers) and algo.env_runners.local_worker is not None
            iterations.append({"end_s": since_start(), "in_driver": in_driver})
        starts = ray.get(
            [w.__ray_call__.remote(lambda _: harness.process_start_time()) for w in workers]
        )
    finally:
        algo.stop()
        ray.shutdown()
    phases["first_train_end_s"] = iterations[0]["end_s"]
    phases["runner_process_start_s"] = [round(s - T0, 2) for s in starts]
    phases["runner_up_s"] = up
    phases["iterations_in_driver"] = sum(i["in_driver"] for i in iterations)
    phases["iteration_ends_s"] = [i["end_s"] for i in iterations]
    print(json.dumps(phases))


if __name__ == "__main__":
    main()

"""Multi-agent sampling side by side: our PPO's env runners against RLlib's new-stack
multi-agent PPO (torch), on PettingZoo's simple_spread (mpe2: 3 agents, discrete
actions, 25-step episodes), one policy shared by the three agents.

Each configuration runs in its own process with its own local Ray (8 logical CPUs, so
every runner is placed on a 2-core machine; both sides are oversubscribed alike): R env
runners (1 CPU asked each) x E copies of the env each, fragments of F env steps per
copy, the same model on both sides (MLP 64x64 tanh, the value function on its own
branch). The algorithm is built, sampled once to warm up, then for `--seconds` the
sampling phase of a PPO iteration runs again and again:
- ours: `algo.env_runners.sample()`, every runner's fragment, each agent's
  trajectory already postprocessed (GAE, with the value bootstrap) in the runner;
- RLlib: `synchronous_parallel_sample(max_env_steps=R*E*F)`, as its
  PPO.training_step calls it (episodes; its GAE runs later, in the learner connector,
  so RLlib's side does less work per step than ours).
Reported: env steps sampled per second (an env step is 3 agent steps) and the CPU time
of the whole process tree (driver, its Ray, every runner) per env step, which a loaded
machine moves less than wall time; ours also with `remote_inference` (one
MultiPolicyActor acting for every runner).

RLlib runs in .venv-rllib-torch with PettingZoo and mpe2 at our versions
(rllib_env.ensure_rllib_multi_agent_venv, made on first use); torch never enters ours.

    python -m benchmarks.multi_agent_sampling                 # ~40 min
    python -m benchmarks.multi_agent_sampling --runners 2 --envs 8 --rounds 1
    python -m benchmarks.multi_agent_sampling --smoke --sides ours
"""

from __future__ import annotations

import time

from benchmarks import harness, plots, rllib_env, stats

NAME = "multi_agent_sampling"
WORKLOAD = "simple_spread_v3 (mpe2), 3 agents, one shared PPO policy: env steps/s sampled"
RAY_CPUS = 8
ENV = "simple_spread_v3"
MODEL = {"fcnet_hiddens": [64, 64], "fcnet_activation": "tanh"}
SIDES = ("ours", "ours_remote", "rllib")


# ----- ours ------------------------------------------------------------------------------------


def _our_algo(spec: dict):
    from algorithms.ppo import PPO

    runners, envs, fragment = spec["num_env_runners"], spec["num_envs"], spec["fragment"]
    return PPO(
        {
            "env": f"pettingzoo:mpe2.{ENV}",
            "policies": {"shared": None},
            "policy_mapping_fn": {"agent_": "shared"},
            "num_env_runners": runners,
            "num_envs_per_env_runner": envs,
            "num_cpus_per_env_runner": 1,
            "rollout_fragment_length": fragment,
            "train_batch_size": runners * envs * fragment,
            "minibatch_size": runners * envs * fragment,
            "remote_inference": spec["side"] == "ours_remote",
            "sample_while_env_runners_start": False,  # the runners sample every timed phase
            "model": MODEL,
            "seed": 0,
        }
    )


def _our_sample(algo) -> tuple[int, int]:
    """One sampling phase -> (env steps, agent steps)."""
    _, metrics = algo.env_runners.sample()
    return metrics["env_steps"], metrics["agent_steps"]


# ----- RLlib's new stack (runs in .venv-rllib-torch) ---------------------------------------------


def _rllib_algo(spec: dict):
    from mpe2 import simple_spread_v3
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.rllib.env.wrappers.pettingzoo_env import ParallelPettingZooEnv
    from ray.tune.registry import register_env

    register_env(ENV, lambda cfg: ParallelPettingZooEnv(simple_spread_v3.parallel_env(**cfg)))
    runners, envs, fragment = spec["num_env_runners"], spec["num_envs"], spec["fragment"]
    config = (
        PPOConfig()
        .environment(ENV)
        .multi_agent(policies={"shared"}, policy_mapping_fn=lambda agent, *a, **k: "shared")
        .env_runners(
            num_env_runners=runners,
            num_envs_per_env_runner=envs,
            num_cpus_per_env_runner=1,
            rollout_fragment_length=fragment,
        )
        .rl_module(model_config=DefaultModelConfig(**MODEL, vf_share_layers=False))
        .training(
            train_batch_size_per_learner=runners * envs * fragment,
            minibatch_size=runners * envs * fragment,
        )
        .learners(num_learners=0)
        .debugging(seed=0)
    )
    algo = config.build_algo()
    algo.sample_env_steps = runners * envs * fragment
    return algo


def _rllib_sample(algo) -> tuple[int, int]:
    from ray.rllib.execution.rollout_ops import synchronous_parallel_sample

    episodes = synchronous_parallel_sample(
        worker_set=algo.env_runner_group,
        max_env_steps=algo.sample_env_steps,
        sample_timeout_s=300,
        _uses_new_env_runners=True,
    )
    return sum(e.env_steps() for e in episodes), sum(e.agent_steps() for e in episodes)


# ----- a child: one configuration ------------------------------------------------------------


def _tree_cpu_s(root: int) -> float | None:
    """CPU seconds of `root` and every process below it (stats.process_tree_cpu_s)."""
    per_process = stats.process_tree_cpu_s(root)
    return None if per_process is None else sum(per_process.values())


def measure(spec: dict):
    import os

    start = time.perf_counter()
    harness.ray_init(
        address="local", num_cpus=RAY_CPUS, include_dashboard=False, log_to_driver=False
    )
    rllib = spec["side"] == "rllib"
    build, sample = (_rllib_algo, _rllib_sample) if rllib else (_our_algo, _our_sample)
    algo = build(spec)
    built = time.perf_counter()
    try:
        sample(algo)  # warm-up: actors up, functions traced
        cpu_begin, begin = _tree_cpu_s(os.getpid()), time.perf_counter()
        env_steps = agent_steps = phases = 0
        while time.perf_counter() - begin < spec["seconds"]:
            env, agent = sample(algo)
            env_steps, agent_steps, phases = env_steps + env, agent_steps + agent, phases + 1
        elapsed, cpu_end = time.perf_counter() - begin, _tree_cpu_s(os.getpid())
    finally:
        algo.stop()
        harness.ray_shutdown()
    yield {
        "bench": NAME,
        **{k: spec[k] for k in ("side", "num_env_runners", "num_envs", "fragment", "round")},
        "build_s": built - start,
        "seconds": elapsed,
        "sampling_phases": phases,
        "env_steps_per_s": env_steps / elapsed,
        "agent_steps_per_s": agent_steps / elapsed,
        # the whole run's CPU per step: on a loaded machine, steadier than wall time
        "cpu_ms_per_env_step": None
        if cpu_begin is None or cpu_end is None
        else 1e3 * (cpu_end - cpu_begin) / env_steps,
    }


# ----- the parent: configurations, summary, plot ---------------------------------------------


def configurations(args) -> list[dict]:
    runners = [int(r) for r in (args.runners or ("1" if args.smoke else "1,2")).split(",")]
    envs = [int(e) for e in (args.envs or ("2" if args.smoke else "1,8")).split(",")]
    common = {"prepare_tf": False, "fragment": 10 if args.smoke else args.fragment}
    seconds = 0.3 if args.smoke else args.seconds  # smoke: one sampling phase at least
    return [
        dict(common, side=side, num_env_runners=r, num_envs=e, seconds=seconds)
        for r in runners
        for e in envs
        for side in args.sides.split(",")
    ]


def summarize(records: list[dict]) -> list[dict]:
    good = [r for r in records if "error" not in r]
    keys = ("side", "num_env_runners", "num_envs")
    values = ("env_steps_per_s", "agent_steps_per_s", "cpu_ms_per_env_step", "build_s")
    summary = stats.summarize_each(good, keys, values)
    for row in summary:
        if row["side"] != "rllib":
            same = {"num_env_runners": row["num_env_runners"], "num_envs": row["num_envs"]}
            row["env_steps_vs_rllib"] = stats.vs(
                summary, "env_steps_per_s", row, side="rllib", **same
            )
            # RLlib's CPU per env step over ours: how many times cheaper a step is here
            row["cpu_per_step_rllib_over_ours"] = stats.ratio(
                stats.find(summary, "cpu_ms_per_env_step", side="rllib", **same),
                row.get("cpu_ms_per_env_step"),
            )
    return summary


def plot(summary: list[dict], out_dir: str) -> str | None:
    groups = sorted({(r["num_env_runners"], r["num_envs"]) for r in summary})
    series: dict = {}
    for r in summary:
        series.setdefault(r["side"], [None] * len(groups))
        series[r["side"]][groups.index((r["num_env_runners"], r["num_envs"]))] = r[
            "env_steps_per_s"
        ]
    return plots.bar_chart(
        f"{out_dir}/{NAME}.png",
        f"{ENV}, 3 agents, one shared policy: env steps sampled per second",
        "env steps/s",
        [f"{r} runner(s) x {e} env(s)" for r, e in groups],
        series,
    )


def add_flags(parser) -> None:
    parser.add_argument("--sides", default=",".join(SIDES), help=f"any of {SIDES}")
    parser.add_argument("--runners", default=None, help="env runner counts, default 1,2")
    parser.add_argument("--envs", default=None, help="envs per runner, default 1,8")
    parser.add_argument("--fragment", type=int, default=50, help="env steps per env and sample")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured span per run")


def python_of(spec: dict) -> str | None:
    return rllib_env.ensure_rllib_multi_agent_venv() if spec["side"] == "rllib" else None


if __name__ == "__main__":
    harness.main(
        __name__,
        python=python_of,
        timeout=lambda spec: spec["seconds"] + 600,
        together_at_smoke=True,
    )

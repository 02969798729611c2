"""SAC's SGD step beside its ceiling: a bare TF update, our policy's, our whole loop.

Each in a fresh child per round, alternating (the median over rounds is reported),
the work SB3's SAC does (batch 256, [256, 256] ReLU actor and twin critics, Adam
3e-4, one SGD step per env step):
  matmul  the machine's rate on the update's biggest matmul ([256, 256] x [256, 256]),
          chained in one compiled call: the FLOP rate no update can beat here;
  bare    benchmarks/bare_sac.py: a minimal hand-written compiled SAC update, k SGD
          steps on k batches in one call (the ceiling of an update written in TF);
  policy  our SACPolicy on the same batches: `update` (the batch loaded onto the
          towers, then the k steps: what the loop calls) and `loaded` (the k steps
          on a batch loaded before: the compiled call alone);
  sb3     Stable-Baselines3's SAC (torch, its own virtualenv as compare_sb3 finds
          it), `SAC.train(k, 256)` on a buffer of random transitions: its k SGD steps,
          replay draws included (no flag: skipped when there is no such virtualenv);
  loop    our SAC algorithm (compare_sb3's config: SB3's hyperparameters), env steps
          of k per sampling round each followed by its k SGD steps, after learning
          started: CPU and wall ms per env step, and where the time went.
FLOPs: sac_work.update_flops, the matmuls one update needs (checked against the
MatMul ops of the traced bare step, which also holds 2 critic weight gradients of the
actor loss that nothing reads); GFLOP/s = those FLOPs per CPU second of a step.

    python -m benchmarks.sac_step --rounds 3
    python -m benchmarks.sac_step --envs Pendulum-v1,HalfCheetah-v5 --threads 1,2
    python -m benchmarks.sac_step --smoke
"""

from __future__ import annotations

import sys
import time

import numpy as np

from benchmarks import harness, plots, stats

NAME = "sac_step"
WORKLOAD = "SAC update, batch 256, [256, 256]: bare TF vs our policy vs our loop"
KEYS = ("env", "kind", "mode", "steps", "threads")
SMOKE = {
    "envs": "Pendulum-v1",
    "steps": "1,8",
    "threads": "1",
    "calls": 3,
    "loop_env_steps": 64,
}
HIDDENS = [256, 256]
BATCH = 256
LEARNING_STARTS = 1000  # the loop is timed after these uniform-random env steps


# ----- child ---------------------------------------------------------------------------------


def measure(spec: dict):
    import gymnasium as gym

    space = gym.make(spec["env"])
    obs_dim = int(np.prod(space.observation_space.shape))
    low, high = space.action_space.low, space.action_space.high
    from benchmarks import sac_work

    flops = sac_work.update_flops(obs_dim, len(low), HIDDENS, BATCH)
    base = {
        "bench": NAME,
        "env": spec["env"],
        "kind": spec["kind"],
        "threads": spec["threads"][0],
        "round": spec["round"],
        "update_flops": flops,
    }
    if spec["kind"] != "sb3":
        base["threads_actual"] = harness.tf_threads()
    if spec["kind"] == "matmul":
        yield from _matmul(spec, base)
        return
    if spec["kind"] == "loop":
        yield _loop(spec, base)
        return
    for k in spec["steps"]:
        batch = sac_work.random_batch(obs_dim, low, high, k * BATCH, seed=spec["round"])
        if spec["kind"] == "bare":
            modes = _bare_modes(obs_dim, low, high, batch, spec, base)
        elif spec["kind"] == "sb3":
            modes = _sb3_modes(space, batch, k, spec)
        else:
            modes = _policy_modes(space, batch)
        for mode, fn in modes:
            walls, cpus = stats.timed_with_cpu(fn, spec["calls"], warmup=2)
            cpu_ms = 1e3 * stats.median(cpus) / k
            yield dict(
                base,
                mode=mode,
                steps=k,
                wall_ms=1e3 * stats.median(walls) / k,
                cpu_ms=cpu_ms,
                gflops_per_cpu_s=flops / cpu_ms / 1e6,
            )


def _bare_modes(obs_dim, low, high, batch, spec, base):
    import tensorflow as tf

    from benchmarks import bare_sac

    model = bare_sac.BareSAC(obs_dim, low, high, HIDDENS, BATCH, seed=spec["round"])
    base["graph_matmul_flops"] = bare_sac.matmul_flops_of(model.step_graph())
    tensors = [tf.constant(x) for x in batch]
    return [("update", lambda: model.update(*tensors).numpy())]


def _policy_modes(space, batch):
    from algorithms.sac import SACPolicy
    from benchmarks.compare_sb3 import ours_config
    from policy_service.data.sample_batch import SampleBatch
    from policy_service.returns.n_step import BOOTSTRAP_DISCOUNT

    config = ours_config(dict(env=space.spec.id, seed=0, fragment=1, learning_starts=0, every=1))
    policy = SACPolicy(space.observation_space, space.action_space, config)
    obs, actions, rewards, next_obs, discount = batch
    sample = SampleBatch(
        {
            SampleBatch.OBS: obs,
            SampleBatch.ACTIONS: actions,
            SampleBatch.REWARDS: rewards,
            SampleBatch.NEXT_OBS: next_obs,
            BOOTSTRAP_DISCOUNT: discount,
        }
    )

    def loaded():
        policy.learn_on_loaded_epochs(1, 0, shuffle=False)

    policy.load_batch_into_buffer(sample)
    return [
        ("update", lambda: policy.update(sample, num_epochs=1, shuffle=False)),
        ("loaded", loaded),
    ]


def _sb3_modes(space, batch, k: int, spec: dict):
    import torch
    from stable_baselines3 import SAC
    from stable_baselines3.common.logger import configure

    from benchmarks.compare_sb3 import HYPER

    torch.set_num_threads(spec["threads"][0])
    model = SAC(
        "MlpPolicy",
        space,
        learning_rate=HYPER["lr"],
        buffer_size=len(batch[0]),
        batch_size=BATCH,
        tau=HYPER["tau"],
        gamma=HYPER["gamma"],
        ent_coef="auto",
        policy_kwargs={"net_arch": HIDDENS},
        seed=spec["round"],
        device="cpu",
    )
    model.set_logger(configure(None, []))
    obs, actions, rewards, next_obs, discount = batch
    for row in range(len(obs)):
        model.replay_buffer.add(
            obs[row : row + 1],
            next_obs[row : row + 1],
            actions[row : row + 1],
            rewards[row : row + 1],
            discount[row : row + 1] == 0,
            [{}],
        )
    return [("train", lambda: model.train(gradient_steps=k, batch_size=BATCH))]


def _matmul(spec: dict, base: dict):
    import tensorflow as tf

    chain = 32
    x = tf.random.normal([BATCH, HIDDENS[0]])
    w = tf.random.normal([HIDDENS[0], HIDDENS[1]]) / 16.0

    @tf.function
    def run(x, w):
        for _ in range(chain):
            x = tf.matmul(x, w)
        return x

    flops = 2 * BATCH * HIDDENS[0] * HIDDENS[1] * chain
    walls, cpus = stats.timed_with_cpu(lambda: run(x, w).numpy(), spec["calls"] * 4, warmup=2)
    yield dict(
        base,
        mode=f"[{BATCH},{HIDDENS[0]}]x[{HIDDENS[0]},{HIDDENS[1]}]",
        steps=chain,
        wall_ms=1e3 * stats.median(walls),
        cpu_ms=1e3 * stats.median(cpus),
        gflops_per_cpu_s=flops / stats.median(cpus) / 1e9,
        update_ms_at_this_rate=1e3 * base["update_flops"] / (flops / stats.median(cpus)),
    )


def _loop(spec: dict, base: dict) -> dict:
    from algorithms import get_algorithm_class
    from benchmarks.compare_sb3 import ours_config

    k = spec["steps"][0]
    config = ours_config(
        dict(
            env=spec["env"],
            seed=spec["round"],
            fragment=k,
            learning_starts=LEARNING_STARTS,
            every=spec["loop_env_steps"],
        )
    )
    algo = get_algorithm_class("sac")(config)
    try:
        # past the random steps, the first compiled calls and the SGD steps carried over
        # from the start of learning (each draw is capped by the rows the buffer holds)
        while (
            algo.timesteps_total < LEARNING_STARTS + spec["loop_env_steps"]
            or algo.num_sgd_steps_total < algo.timesteps_total - LEARNING_STARTS - k
        ):
            algo.train()
        steps_before, sgd_before = algo.timesteps_total, algo.num_sgd_steps_total
        wall, cpu = time.perf_counter(), time.process_time()
        parts = {"sample_time_s": 0.0, "learn_time_s": 0.0, "sync_time_s": 0.0}
        for _ in range(spec["loop_iterations"]):
            result = algo.train()
            for key in parts:
                parts[key] += result[key]
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        env_steps = algo.timesteps_total - steps_before
        sgd_steps = algo.num_sgd_steps_total - sgd_before
    finally:
        algo.stop()
    return dict(
        base,
        mode="per env step",
        steps=k,
        env_steps=env_steps,
        sgd_steps=sgd_steps,
        wall_ms=1e3 * wall / env_steps,
        cpu_ms=1e3 * cpu / env_steps,
        env_steps_per_s=env_steps / wall,
        env_steps_per_cpu_s=env_steps / cpu,
        gflops_per_cpu_s=base["update_flops"] * sgd_steps / cpu / 1e9,
        **{f"{key.removesuffix('_time_s')}_ms": 1e3 * v / env_steps for key, v in parts.items()},
    )


# ----- parent --------------------------------------------------------------------------------


def configurations(args) -> list[dict]:
    from benchmarks.compare_sb3 import sb3_python

    size = harness.sizes(args, SMOKE)
    steps = [int(k) for k in str(size["steps"]).split(",")]
    python, skipped = sb3_python()
    if skipped:
        print(f"# {NAME}: skipping SB3: {skipped}", file=sys.stderr)
    specs = []
    for env in size["envs"].split(","):
        for intra in [int(t) for t in str(size["threads"]).split(",")]:
            common = dict(
                env=env,
                threads=[intra, None],
                calls=size["calls"],
                loop_env_steps=size["loop_env_steps"],
                loop_iterations=1 if args.smoke else 2,
            )
            specs.append(dict(common, kind="matmul", steps=[1]))
            specs.append(dict(common, kind="bare", steps=steps))
            # the smoke times our policy at the largest k alone (each k compiles its update)
            specs.append(dict(common, kind="policy", steps=steps[-1:] if args.smoke else steps))
            if python:
                specs.append(dict(common, kind="sb3", steps=steps, python=python, prepare_tf=False))
            # a loop child learns for LEARNING_STARTS steps first: the smoke runs one
            loop_steps = steps[-1:] if args.smoke else steps
            specs.extend(dict(common, kind="loop", steps=[k]) for k in loop_steps)
    kinds = args.kinds.split(",")
    return [spec for spec in specs if spec["kind"] in kinds]


def summarize(records: list[dict]) -> list[dict]:
    """Per (env, kind, mode, steps, threads): medians over the rounds; each policy
    and loop row also over the bare update's CPU time at the same k and threads."""
    ok = [r for r in records if "error" not in r]
    rows = []
    for key in sorted({tuple(r[k] for k in KEYS) for r in ok}, key=str):
        match = [r for r in ok if tuple(r[k] for k in KEYS) == key]
        row: dict = dict(zip(KEYS, key), rounds=len(match))
        for value in (
            "cpu_ms",
            "wall_ms",
            "gflops_per_cpu_s",
            "env_steps_per_s",
            "env_steps_per_cpu_s",
            "sample_ms",
            "learn_ms",
            "sync_ms",
            "update_ms_at_this_rate",
        ):
            if value in match[0]:
                row[value] = stats.median([r[value] for r in match])
        for name in ("update_flops", "graph_matmul_flops"):
            if name in match[0]:
                row[name] = match[0][name]
        rows.append(row)
    for row in rows:
        if row["kind"] in ("policy", "loop", "sb3"):
            bare = stats.find(
                rows,
                "cpu_ms",
                env=row["env"],
                kind="bare",
                steps=row["steps"],
                threads=row["threads"],
            )
            row["cpu_vs_bare"] = stats.ratio(row["cpu_ms"], bare)
    return rows


def plot(summary: list[dict], out_dir: str) -> list:
    paths = []
    for env in sorted({r["env"] for r in summary}):
        rows = [r for r in summary if r["env"] == env and r["kind"] != "matmul"]
        threads = sorted({r["threads"] for r in rows})
        order = ("bare", "sb3", "policy", "loop")
        groups = sorted(
            {(r["kind"], r["mode"], r["steps"]) for r in rows},
            key=lambda g: (order.index(g[0]), g[1] != "loaded", g[2]),
        )
        bound = stats.find(summary, "update_ms_at_this_rate", env=env, kind="matmul", threads=1)
        paths.append(
            plots.bar_chart(
                f"{out_dir}/{NAME}_{env}.png",
                f"SAC on {env}: CPU ms per SGD step (loop: per env step and its step)",
                "CPU ms (median over rounds)",
                [f"{kind}\n{mode if kind == 'policy' else ''}\nk={k}" for kind, mode, k in groups],
                {
                    f"{t} thread(s)": [
                        stats.find(rows, "cpu_ms", kind=kind, mode=mode, steps=k, threads=t)
                        for kind, mode, k in groups
                    ]
                    for t in threads
                },
                hlines={"its FLOPs at the matmul rate (1 thread)": bound},
            )
        )
    return paths


def add_flags(parser) -> None:
    parser.add_argument("--envs", default="Pendulum-v1", help="gymnasium ids, comma-separated")
    parser.add_argument("--steps", default="1,8", help="SGD steps per compiled call (k)")
    parser.add_argument("--threads", default="1", help="TF intra-op threads, comma-separated")
    parser.add_argument("--calls", type=int, default=30, help="timed calls per mode")
    parser.add_argument(
        "--kinds", default="matmul,bare,policy,sb3,loop", help="what to time, comma-separated"
    )
    parser.add_argument(
        "--loop-env-steps",
        type=int,
        default=1000,
        help="env steps per timed iteration of the loop (2 iterations, after a warm-up one)",
    )


if __name__ == "__main__":
    harness.main(
        __name__,
        timeout=lambda spec: 1800,
        python=lambda spec: spec.get("python"),
        together_at_smoke=True,
    )

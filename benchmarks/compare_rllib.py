"""Ours vs RLlib's old-API-stack TF PPO and DQN: learner, sampling, inference, end to end.

RLlib runs in its own virtualenv (.venv-rllib, created on first use by
rllib_env.ensure_rllib_venv with ray[rllib] at our Ray and TF versions, Keras 2),
so its pins never touch ours; every measurement is a child process, ours and
RLlib's alternating per round (at --smoke one child per side: harness.together).
Workloads: learner, sampler, inference, e2e, and dqn (not in the default workloads).

    python -m benchmarks.compare_rllib                      # ~20 min
    python -m benchmarks.compare_rllib --workloads learner,sampler --rounds 3
    python -m benchmarks.compare_rllib --smoke
    python -m benchmarks.compare_rllib --workloads dqn --seeds 0,1,2

Ratios are printed as JSON lines with "ratio" and written to
results/compare_rllib.json. Each workload, exactly: benchmarks/history/methods.md.
"""

from __future__ import annotations

import time

import numpy as np

from benchmarks import dqn_e2e, harness, plots, rllib_dqn, rllib_env, stats

NAME = "compare_rllib"
WORKLOADS = ("learner", "sampler", "inference", "e2e", "dqn")
DEFAULT_WORKLOADS = "learner,sampler,inference,e2e"


# ----- RLlib side (runs in .venv-rllib) ------------------------------------------------------

# The learner, sampler and inference workloads' model (ppo_shaped.MODELS, without
# importing TensorFlow here); e2e uses e2e.py's tuned hyperparameters instead.
WORKLOAD_MODELS = {
    "mlp": {"fcnet_hiddens": [256, 256], "fcnet_activation": "tanh"},
    "lstm": {
        "fcnet_hiddens": [256, 256],
        "fcnet_activation": "tanh",
        "use_lstm": True,
        "lstm_cell_size": 256,
        "max_seq_len": 16,
    },
}
WORKLOAD_SIZES = {"train_batch_size": 4000, "minibatch_size": 128, "num_epochs": 10}
PPO_LOSS_KEYS = ("lr", "clip_param", "vf_clip_param", "vf_loss_coeff", "kl_coeff", "entropy_coeff")


def ppo_loss_defaults() -> dict:
    """Our PPOConfig's loss defaults (RLlib's own), read in the parent process and
    sent to RLlib's children in the spec, which cannot import our package."""
    from algorithms.ppo import PPOConfig

    defaults = PPOConfig()
    return {key: getattr(defaults, key) for key in PPO_LOSS_KEYS}


def workload_hyper(spec: dict, model: str, **changes) -> dict:
    """The learner, sampler and inference workloads' PPO hyperparameters."""
    return dict(WORKLOAD_SIZES, **spec["ppo"], model=WORKLOAD_MODELS[model], **changes)


def rllib_config(
    hyper: dict,
    *,
    num_gpus: int = 0,
    threads=None,
    num_env_runners: int = 0,
    envs_per_runner: int = 1,
    fragment=None,
):
    """An old-API-stack TF PPOConfig with the given hyperparameters ("model" included)."""
    from ray.rllib.algorithms.ppo import PPOConfig

    framework_kwargs = {}
    if threads:
        framework_kwargs["local_tf_session_args"] = {
            "intra_op_parallelism_threads": threads[0],
            "inter_op_parallelism_threads": threads[1],
        }
    return (
        PPOConfig()
        .api_stack(enable_rl_module_and_learner=False, enable_env_runner_and_connector_v2=False)
        .framework("tf", **framework_kwargs)
        .environment("CartPole-v1")
        .resources(num_gpus=num_gpus, _fake_gpus=num_gpus > 0)
        .env_runners(
            num_env_runners=num_env_runners,
            num_envs_per_env_runner=envs_per_runner,
            rollout_fragment_length=fragment or "auto",
        )
        .training(**hyper)
        .reporting(metrics_num_episodes_for_smoothing=100)
    )


def rllib_batch(model: str, num_rows: int):
    """The learner workload's synthetic batch (same columns as ppo_shaped's) for RLlib."""
    from ray.rllib.policy.sample_batch import SampleBatch

    rng = np.random.default_rng(0)
    logits = rng.normal(0, 0.1, (num_rows, 2)).astype(np.float32)
    actions = rng.integers(0, 2, num_rows)
    logp = (logits - np.log(np.exp(logits).sum(-1, keepdims=True)))[np.arange(num_rows), actions]
    columns = {
        "obs": rng.uniform(-1, 1, (num_rows, 4)).astype(np.float32),
        "actions": actions,
        "action_dist_inputs": logits,
        "action_logp": logp.astype(np.float32),
        "advantages": rng.normal(size=num_rows).astype(np.float32),
        "value_targets": rng.normal(size=num_rows).astype(np.float32),
        "vf_preds": rng.normal(size=num_rows).astype(np.float32),
        "rewards": np.ones(num_rows, np.float32),
        "terminateds": np.zeros(num_rows, bool),
        "truncateds": np.zeros(num_rows, bool),
    }
    if model == "lstm":
        lengths = []
        while sum(lengths) < num_rows:
            lengths.append(int(rng.integers(10, 200)))
        lengths[-1] -= sum(lengths) - num_rows
        lengths = [n for n in lengths if n > 0]
        columns["eps_id"] = np.repeat(np.arange(len(lengths)), lengths)
        columns["t"] = np.concatenate([np.arange(n) for n in lengths])
        columns["unroll_id"] = columns["eps_id"]
        columns["agent_index"] = np.zeros(num_rows, np.int64)
        columns["state_in_0"] = rng.normal(0, 0.1, (num_rows, 256)).astype(np.float32)
        columns["state_in_1"] = rng.normal(0, 0.1, (num_rows, 256)).astype(np.float32)
        columns["state_out_0"] = columns["state_in_0"]
        columns["state_out_1"] = columns["state_in_1"]
    return SampleBatch(columns)


def rllib_ray(spec: dict, **settings) -> None:
    """The local Ray of one of RLlib's runs, with its own settings; at --smoke
    (spec "one_ray") every RLlib run asks the same ones, so that the one bundle child
    (harness.together) starts one Ray for all, not one per change of settings."""
    if spec.get("one_ray"):
        settings = {"log_to_driver": False}
    harness.ray_init(**harness.RAY_INIT, **settings)


def rllib_learner(spec: dict):
    """RLlib's multi_gpu_train_one_step loop on the policy, timed like ours."""
    from benchmarks.learner import NAME as LEARNER

    if spec.get("one_ray"):  # else RLlib's Algorithm starts a Ray of its own settings
        rllib_ray(spec)
    algo = rllib_config(
        workload_hyper(spec, spec["model"]), num_gpus=spec["towers"], threads=spec["threads"]
    ).build_algo()
    policy = algo.get_policy()
    batch = rllib_batch(spec["model"], spec["num_samples"])
    epochs, minibatch = spec["epochs"], spec["minibatch"]
    per_device = minibatch // max(1, spec["towers"])
    rng = np.random.default_rng(0)
    trained = {}

    def run():
        loaded = policy.load_batch_into_buffer(batch, buffer_index=0)
        num_batches = max(1, int(loaded) // per_device)
        for _ in range(epochs):
            for k in rng.permutation(num_batches):
                policy.learn_on_loaded_batch(int(k) * per_device, buffer_index=0)
        trained["samples"] = epochs * num_batches * minibatch
        trained["steps"] = epochs * num_batches

    seconds = stats.median(stats.timed(run, spec["repeats"], warmup=1))
    algo.stop()
    samples = trained["samples"]
    if spec["model"] == "lstm":  # padded rows are trained on but are not samples
        samples = min(samples, epochs * batch.count)
    yield {
        "bench": LEARNER,
        "framework": "rllib",
        "engine": "rllib",
        "mode": "minibatch",
        "model": spec["model"],
        "towers": spec["towers"],
        "threads": spec["threads"],
        "round": spec["round"],
        "seconds": seconds,
        "samples": samples,
        "sgd_steps": trained["steps"],
        "samples_per_s": samples / seconds,
    }


def rllib_sampler(spec: dict):
    """One local RLlib rollout worker (local inference): env steps/s of sample()."""
    rllib_ray(spec)
    try:
        for num_envs in spec["num_envs_list"]:
            rows = spec["fragment"] * num_envs  # RLlib checks the batch against the fragments
            hyper = workload_hyper(
                spec, "mlp", train_batch_size=rows, minibatch_size=min(128, rows)
            )
            algo = rllib_config(
                hyper, envs_per_runner=num_envs, fragment=spec["fragment"]
            ).build_algo()
            worker = algo.env_runner_group.local_env_runner
            worker.sample()
            steps, seconds = 0, 0.0
            end = time.perf_counter() + spec["duration"]
            while time.perf_counter() < end:
                start = time.perf_counter()
                batch = worker.sample()
                seconds += time.perf_counter() - start
                steps += batch.env_steps()
            algo.stop()
            yield {
                "bench": "sampler",
                "framework": "rllib",
                "inference": "local",
                "num_envs": num_envs,
                "round": spec["round"],
                "env_steps": steps,
                "seconds": seconds,
                "env_steps_per_s": steps / seconds,
            }
    finally:
        harness.ray_shutdown()


def rllib_server_class():
    import ray

    @ray.remote(num_cpus=1)
    class RLlibPolicyServer:
        """RLlib's TF policy in an actor; calls are served one at a time (no batching)."""

        def __init__(self, hyper: dict, threads=None):
            self.algo = rllib_config(hyper, threads=threads).build_algo()
            self.policy = self.algo.get_policy()

        def compute_actions(self, obs_batch, state_batches=None, explore=None, timestep=None):
            return self.policy.compute_actions(obs_batch, explore=explore)

        def ready(self) -> bool:
            return True

    return RLlibPolicyServer


def rllib_inference(spec: dict):
    import ray

    from benchmarks import inference

    rllib_ray(spec)
    try:
        callers = inference.start_callers(max(spec["callers"]))
        server = rllib_server_class().remote(workload_hyper(spec, "mlp"), spec.get("threads"))
        ray.get(server.ready.remote(), timeout=600)
        yield from inference.drive_counts(
            server,
            callers,
            spec["callers"],
            spec["duration"],
            {
                "bench": "inference",
                "framework": "rllib",
                "target": "rllib_policy",
                "batching": "none",
                "round": spec["round"],
            },
        )
    finally:
        harness.ray_shutdown()


def rllib_e2e(spec: dict):
    start = time.perf_counter()
    rllib_ray(spec, log_to_driver=False)
    record = {
        "bench": "e2e",
        "framework": "rllib",
        "num_gpus": spec["num_gpus"],
        "num_env_runners": spec["num_env_runners"],
        "seed": spec["seed"],
        "round": spec["round"],
        "target": spec["target"],
    }
    history, result, done = [], {}, False
    try:
        from benchmarks.e2e import PPO_CONFIG

        config = rllib_config(
            dict(PPO_CONFIG, **spec.get("overrides", {})),
            num_gpus=spec["num_gpus"],
            num_env_runners=spec["num_env_runners"],
            envs_per_runner=spec["envs_per_runner"],
        ).debugging(seed=spec["seed"])
        algo = config.build_algo()
        built = time.perf_counter()
        while True:
            result = algo.train()
            runners = result.get("env_runners", {})
            ret = runners.get("episode_return_mean")
            timers = result.get("timers", {})
            history.append(
                {
                    "iteration": result.get("training_iteration"),
                    "timesteps_total": result.get("num_env_steps_sampled_lifetime"),
                    "episode_return_mean": ret,
                    "sample_time_ms": timers.get("sample_time_ms"),
                    "learn_time_ms": timers.get("learn_time_ms"),
                    "learn_throughput": timers.get("learn_throughput"),
                }
            )
            done = bool(ret is not None and not np.isnan(ret) and ret >= spec["target"])
            if (
                done
                or time.perf_counter() - start > spec["max_seconds"]
                or len(history) >= spec["max_iterations"]
            ):
                break
        algo.stop()
    except Exception as err:  # noqa: BLE001 - RLlib's own failure is a result: record what failed
        import traceback

        yield dict(
            record,
            error=f"{type(err).__name__}: {err}"[:2000],
            traceback=traceback.format_exc()[-4000:],
            history=history,
        )
        return
    finally:
        harness.ray_shutdown()
    end = time.perf_counter()
    steps = history[-1]["timesteps_total"] if history else None
    sample_s = sum((h["sample_time_ms"] or 0) for h in history) / 1e3
    # RLlib's learn_throughput is batch rows per learn second; ours counts every epoch
    epochs = dict(PPO_CONFIG, **spec.get("overrides", {}))["num_epochs"]
    trained = stats.median(
        [h["learn_throughput"] * epochs for h in history if h.get("learn_throughput")]
    )
    yield dict(
        record,
        reached=done,
        wall_s=end - start,
        build_s=built - start,
        env_steps=steps,
        iterations=len(history),
        final_return=history[-1]["episode_return_mean"] if history else None,
        env_steps_sampled_per_s=(steps / sample_s if steps and sample_s else None),
        samples_trained_per_s=trained,
        history=history,
    )


def rllib_dqn_run(spec: dict):
    """RLlib's DQN to the target with spec["settings"] (rllib_dqn.rllib_settings)."""
    record = {
        "bench": "dqn",
        "framework": "rllib",
        "seed": spec["seed"],
        "round": spec["round"],
        "target": spec["target"],
        "max_env_steps": spec["max_env_steps"],
        "settings": spec["settings"],
    }
    rllib_ray(spec, log_to_driver=False)
    try:
        outcome = rllib_dqn.run_to_target(
            spec["settings"],
            spec["seed"],
            spec["target"],
            spec["max_env_steps"],
            spec["max_seconds"],
        )
    except Exception as err:  # noqa: BLE001 - RLlib's own failure is a result: record what failed
        import traceback

        yield dict(
            record,
            error=f"{type(err).__name__}: {err}"[:2000],
            traceback=traceback.format_exc()[-4000:],
        )
        return
    finally:
        harness.ray_shutdown()
    yield dict(record, **outcome)


RLLIB_MEASURES = {
    "learner": rllib_learner,
    "sampler": rllib_sampler,
    "inference": rllib_inference,
    "e2e": rllib_e2e,
    "dqn": rllib_dqn_run,
}


def measure(spec: dict):
    yield from RLLIB_MEASURES[spec["workload"]](spec)


# ----- the alternating schedule ---------------------------------------------------------------


def schedule(args) -> list[tuple[str, str, dict]]:
    """[(side, module, spec)] for one round: for every workload ours, then RLlib's."""
    smoke = args.smoke
    ppo = ppo_loss_defaults()
    out = []
    workloads = (args.workloads or DEFAULT_WORKLOADS).split(",")
    unknown = sorted(set(workloads) - set(WORKLOADS))
    if unknown:
        raise ValueError(f"--workloads must be among {list(WORKLOADS)}, got {unknown}")

    def rllib(workload: str, spec: dict) -> tuple[str, str, dict]:
        """RLlib's side of a workload, its PPO loss settings beside the spec."""
        return (
            "rllib",
            NAME_MODULE,
            dict(spec, workload=workload, prepare_tf=False, ppo=ppo, one_ray=smoke),
        )

    if "learner" in workloads:
        size = (
            {"epochs": 2, "num_samples": 512, "repeats": 1}
            if smoke
            else {"epochs": 10, "num_samples": 4000, "repeats": 3}
        )
        towers = [int(t) for t in (args.towers or ("1" if smoke else "1,2,4")).split(",")]
        models = (args.models or "mlp").split(",")
        for model in models:
            base = dict(size, model=model, minibatch=128, real_gpus=False)
            out.append(
                (
                    "ours",
                    "benchmarks.learner",
                    dict(base, engine="ceiling", towers=1, devices=1, threads=None),
                )
            )
            for n in towers:
                out.append(
                    (
                        "ours",
                        "benchmarks.learner",
                        dict(base, engine="ours", towers=n, devices=n, threads=None),
                    )
                )
                for threads in [None] if smoke else [None, [2, 2]]:
                    out.append(rllib("learner", dict(base, towers=n, threads=threads)))
    if "sampler" in workloads:
        size = dict(
            num_envs_list=[1] if smoke else [1, 8, 32],
            fragment=50 if smoke else 200,
            duration=0.3 if smoke else 5.0,  # smoke: one sample() at least, on each side
        )
        out.append(("ours", "benchmarks.sampler", dict(size, inference="local", devices=1)))
        out.append(rllib("sampler", size))
    if "inference" in workloads:
        callers = [2] if smoke else [16]
        duration = 0.5 if smoke else 5.0
        # smoke: ours' PolicyActor alone; the no-op ceilings' runs are inference.py's own
        # (test_inference_smoke), and their ratios here are None at this size
        servers = ["policy/on"] if smoke else ["noop", "noop_serial", "policy/on"]
        out.append(
            (
                "ours",
                "benchmarks.inference",
                dict(
                    target="remote",
                    callers=callers,
                    duration=duration,
                    servers=servers,
                    max_batch_size=32,
                    wait_ms=1.0,
                    prepare_tf=False,
                ),
            )
        )
        out.append(rllib("inference", dict(callers=callers, duration=duration)))
    if "e2e" in workloads:
        from benchmarks import e2e

        gpus = [int(g) for g in (args.e2e_gpus or ("0" if smoke else "0,2")).split(",")]
        runners = [int(r) for r in (args.e2e_runners or ("1" if smoke else "0,1,2")).split(",")]
        for g in gpus:
            for r in runners:
                spec = dict(
                    num_gpus=g,
                    num_env_runners=r,
                    envs_per_runner=e2e.ENVS_PER_RUNNER,
                    prepare_tf=False,
                )
                if smoke:
                    spec.update(
                        target=15.0,
                        max_iterations=2,
                        max_seconds=300,
                        overrides={"train_batch_size": 256, "minibatch_size": 64, "num_epochs": 2},
                    )
                else:
                    spec.update(
                        target=e2e.TARGET_RETURN,
                        max_iterations=10_000,
                        max_seconds=args.e2e_max_seconds,
                    )
                out.append(("ours", "benchmarks.e2e", spec))
                out.append(("rllib", NAME_MODULE, dict(spec, workload="e2e", one_ray=smoke)))
    if "dqn" in workloads:
        out.extend(dqn_schedule(args))
    return out


def dqn_schedule(args) -> list[tuple[str, str, dict]]:
    """The dqn workload's runs: ours (dqn_e2e.py) then RLlib's, same hyperparameters,
    target and budget; RLlib's translated here, in our venv, from our resolved config."""
    spec = dqn_e2e.spec_for(
        args.smoke,
        dqn_e2e.load_tuned(args.dqn_config),
        args.dqn_target,
        args.dqn_max_env_steps,
        args.dqn_max_seconds,
    )
    ours, fragment = dqn_e2e.resolved_config(spec["config"])
    settings = rllib_dqn.rllib_settings(ours, fragment)
    sides = args.dqn_sides.split(",")
    if set(sides) - {"ours", "rllib"} or not sides:
        raise ValueError(f"--dqn-sides must be ours, rllib or both, got {args.dqn_sides!r}")
    out = []
    if "ours" in sides:
        out.append(("ours", "benchmarks.dqn_e2e", spec))
    if "rllib" in sides:
        rllib_spec = {k: v for k, v in spec.items() if k != "config"}
        out.append(("rllib", NAME_MODULE, dict(rllib_spec, settings=settings, one_ray=args.smoke)))
    return out


NAME_MODULE = "benchmarks.compare_rllib"


def ratios(records: list[dict]) -> list[dict]:
    """Medians per side and configuration, and ours / RLlib (times: RLlib / ours)."""
    ok = [r for r in records if "error" not in r]
    out = []

    def med(rows, key):
        return stats.median([r.get(key) for r in rows])

    # learner: ours (library defaults) vs RLlib at each thread setting, same tower count
    for model in sorted({r["model"] for r in ok if r["bench"] == "learner"}):
        rows = [r for r in ok if r["bench"] == "learner" and r["model"] == model]
        ceiling = med(
            [r for r in rows if r["engine"] == "ceiling" and r["mode"] == "fused"], "samples_per_s"
        )
        ceiling_kernel = med(
            [r for r in rows if r["engine"] == "ceiling" and r["mode"] == "fused_adam_kernel"],
            "samples_per_s",
        )
        for n in sorted({r["towers"] for r in rows if r["engine"] == "rllib"}):
            ours = {
                mode: med(
                    [
                        r
                        for r in rows
                        if r["engine"] == "ours" and r["towers"] == n and r["mode"] == mode
                    ],
                    "samples_per_s",
                )
                for mode in ("epoch", "minibatch")
            }
            rllib = {
                str(t): med(
                    [
                        r
                        for r in rows
                        if r["engine"] == "rllib" and r["towers"] == n and r["threads"] == t
                    ],
                    "samples_per_s",
                )
                for t in [None, [2, 2]]
            }
            best = max((v for v in rllib.values() if v), default=None)
            out.append(
                {
                    "bench": NAME,
                    "workload": "learner",
                    "model": model,
                    "towers": n,
                    "ours_epoch": ours["epoch"],
                    "ours_minibatch": ours["minibatch"],
                    "rllib_default_threads": rllib["None"],
                    "rllib_2_2": rllib["[2, 2]"],
                    "ceiling_fused": ceiling,
                    "ceiling_adam_kernel": ceiling_kernel,
                    "ratio": stats.ratio(ours["epoch"], best),
                    "ratio_minibatch": stats.ratio(ours["minibatch"], best),
                    "ours_vs_ceiling": stats.ratio(ours["epoch"], ceiling),
                }
            )
    for num_envs in sorted({r["num_envs"] for r in ok if r["bench"] == "sampler"}):
        rows = [
            r
            for r in ok
            if r["bench"] == "sampler"
            and r["num_envs"] == num_envs
            and r.get("inference", "local") == "local"
        ]
        ours = med([r for r in rows if r.get("framework", "ours") == "ours"], "env_steps_per_s")
        rllib = med([r for r in rows if r.get("framework") == "rllib"], "env_steps_per_s")
        out.append(
            {
                "bench": NAME,
                "workload": "sampler",
                "num_envs": num_envs,
                "ours": ours,
                "rllib": rllib,
                "ratio": stats.ratio(ours, rllib),
            }
        )
    for callers in sorted(
        {r["callers"] for r in ok if r["bench"] == "inference" and r.get("callers")}
    ):
        rows = [r for r in ok if r["bench"] == "inference" and r.get("callers") == callers]
        pick = {
            "ours": [r for r in rows if r.get("target") == "policy"],
            "noop": [r for r in rows if r.get("target") == "noop"],
            "noop_serial": [r for r in rows if r.get("target") == "noop_serial"],
            "rllib": [r for r in rows if r.get("target") == "rllib_policy"],
        }
        row = {"bench": NAME, "workload": "inference", "callers": callers}
        for side, picked in pick.items():
            for key in ("actions_per_s", "p50_ms", "p99_ms"):
                row[f"{side}_{key}"] = med(picked, key)
        row["ratio"] = stats.ratio(row["ours_actions_per_s"], row["rllib_actions_per_s"])
        row["ours_vs_noop"] = stats.ratio(row["ours_actions_per_s"], row["noop_actions_per_s"])
        # the most any one-observation-per-call server could reach, against RLlib
        row["noop_serial_vs_rllib"] = stats.ratio(
            row["noop_serial_actions_per_s"], row["rllib_actions_per_s"]
        )
        out.append(row)
    e2e_rows = [r for r in records if r.get("bench") == "e2e"]
    for g, n in sorted({(r["num_gpus"], r["num_env_runners"]) for r in e2e_rows}):
        rows = [r for r in e2e_rows if r["num_gpus"] == g and r["num_env_runners"] == n]
        sides = {}
        for side in ("ours", "rllib"):
            picked = [r for r in rows if r.get("framework", "ours") == side]
            reached = [r for r in picked if r.get("reached")]
            sides[side] = {
                "wall_s": med(reached, "wall_s"),
                "env_steps": med(reached, "env_steps"),
                "reached": f"{len(reached)}/{len(picked)}",
                "errors": sorted({_why(r) for r in picked if "error" in r}),
            }
        out.append(
            {
                "bench": NAME,
                "workload": "e2e",
                "num_gpus": g,
                "num_env_runners": n,
                **{f"{s}_{k}": v for s, d in sides.items() for k, v in d.items()},
                "ratio_wall": stats.ratio(sides["ours"]["wall_s"], sides["rllib"]["wall_s"]),
                "ratio_env_steps": stats.ratio(
                    sides["ours"]["env_steps"], sides["rllib"]["env_steps"]
                ),
            }
        )
    out.extend(dqn_ratios([r for r in records if r.get("bench") == "dqn"]))
    return out


DQN_FIGURES = ("reached", "stopped_by", "env_steps", "wall_s", "final_return", "best_return")


def dqn_ratios(records: list[dict]) -> list[dict]:
    """Per seed, each side's outcome (env steps and wall seconds to the target, or at
    the budget when not reached) and ours / RLlib where both reached it; then the
    medians over the seeds each side reached the target in."""
    out = []
    by_side = {
        side: [r for r in records if r.get("framework") == side] for side in ("ours", "rllib")
    }
    for seed in sorted({r["seed"] for r in records if r.get("seed") is not None}):
        row = {"bench": NAME, "workload": "dqn", "seed": seed}
        for side, rows in by_side.items():
            run = next((r for r in rows if r.get("seed") == seed), {})
            row.update({f"{side}_{k}": run.get(k) for k in DQN_FIGURES})
            if "error" in run:
                row[f"{side}_error"] = _why(run)
        both = row["ours_reached"] and row["rllib_reached"]
        row["ratio_env_steps"] = (
            stats.ratio(row["ours_env_steps"], row["rllib_env_steps"]) if both else None
        )
        row["ratio_wall"] = stats.ratio(row["ours_wall_s"], row["rllib_wall_s"]) if both else None
        out.append(row)
    row = {"bench": NAME, "workload": "dqn", "seed": "median"}
    for side, rows in by_side.items():
        reached = [r for r in rows if r.get("reached")]
        row[f"{side}_reached"] = f"{len(reached)}/{len(rows)}"
        row[f"{side}_env_steps"] = stats.median([r["env_steps"] for r in reached])
        row[f"{side}_wall_s"] = stats.median([r["wall_s"] for r in reached])
    row["ratio_env_steps"] = stats.ratio(row["ours_env_steps"], row["rllib_env_steps"])
    row["ratio_wall"] = stats.ratio(row["ours_wall_s"], row["rllib_wall_s"])
    return out + [row] if records else out


def _why(record: dict) -> str:
    """The failure in one line: the exception a child died of, or the error text."""
    tail = (record.get("stderr_tail") or "").strip().splitlines()
    return (tail[-1] if tail else record["error"])[:200]


def plot(rows: list[dict], out_dir: str) -> str | None:
    groups, ours, rllib = [], [], []
    for row in rows:
        if row["workload"] == "learner":
            groups.append(f"learner {row['model']} x{row['towers']}\n(samples/s)")
            ours.append(row["ours_epoch"])
            rllib.append(
                max(
                    [v for v in (row["rllib_default_threads"], row["rllib_2_2"]) if v], default=None
                )
            )
        elif row["workload"] == "sampler":
            groups.append(f"sampler {row['num_envs']} env(s)\n(steps/s)")
            ours.append(row["ours"])
            rllib.append(row["rllib"])
        elif row["workload"] == "inference":
            groups.append(f"inference {row['callers']} callers\n(actions/s)")
            ours.append(row["ours_actions_per_s"])
            rllib.append(row["rllib_actions_per_s"])
    if not groups:
        return None
    return plots.bar_chart(
        f"{out_dir}/{NAME}.png",
        "Ours vs RLlib old-stack TF PPO (log scale)",
        "per second",
        groups,
        {"ours": ours, "RLlib (best threads)": rllib},
        log=True,
    )


def plot_dqn(rows: list[dict], out_dir: str) -> list[str | None]:
    """Env steps and wall seconds to the target per seed, ours beside RLlib's DQN
    (no bar: not reached within the budget)."""
    rows = [r for r in rows if r["workload"] == "dqn" and r["seed"] != "median"]
    if not rows:
        return []
    groups = [f"seed {r['seed']}" for r in rows]
    paths = []
    for figure, label in (("env_steps", "env steps"), ("wall_s", "wall seconds")):
        series = {
            name: [r[f"{side}_{figure}"] if r[f"{side}_reached"] else None for r in rows]
            for side, name in (("ours", "ours"), ("rllib", "RLlib old-stack TF DQN"))
        }
        paths.append(
            plots.bar_chart(
                f"{out_dir}/{NAME}_dqn_{figure}.png",
                f"DQN CartPole-v1 to return 450: {label} (no bar: not reached)",
                label,
                groups,
                series,
            )
        )
    return paths


def main(argv=None):
    parser = harness.base_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--workloads",
        default=None,
        help=f"among {','.join(WORKLOADS)}; default {DEFAULT_WORKLOADS}",
    )
    parser.add_argument("--models", default=None, help="learner models (default mlp)")
    parser.add_argument("--towers", default=None, help="learner towers (default 1,2,4)")
    parser.add_argument("--e2e-gpus", default=None, help="fake GPUs for e2e, default 0,2")
    parser.add_argument(
        "--e2e-runners",
        default=None,
        help="rollout workers for e2e, default 0,1,2 (0 samples in the learner process)",
    )
    parser.add_argument("--e2e-max-seconds", type=float, default=400)
    dqn_e2e.add_flags(parser, prefix="dqn-")
    parser.add_argument(
        "--dqn-sides", default="ours,rllib", help="the dqn workload's sides: ours, rllib or both"
    )
    parser.add_argument(
        "--seeds",
        default=None,
        help="one round per seed, e.g. 0,1,2 (default: the round is the seed)",
    )
    parser.add_argument(
        "--rllib-python",
        default=None,
        help="RLlib's python, used as given: no import check (its caller checked the venv, "
        "as the tests do); default: .venv-rllib's, made or checked first",
    )
    args = parser.parse_args(argv)
    if args.child:
        return harness.child_main(args, measure)
    rllib_python = args.rllib_python or rllib_env.ensure_rllib_venv()
    meta = harness.start_meta(
        args, rllib_python=rllib_python, rllib_versions=harness.versions(rllib_python)
    )
    planned = [
        harness.Run(
            module,
            spec,
            python=rllib_python if side == "rllib" else None,
            env=rllib_env.RLLIB_ENV if side == "rllib" else None,
            tags={"framework": side},
        )
        for side, module, spec in schedule(args)
    ]
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else None

    def child_timeout(spec: dict) -> float:
        return spec.get("max_seconds", 600) + 600

    runs, timeout = (
        (harness.together(planned), harness.timeout_of(child_timeout))  # a child per side
        if args.smoke
        else (planned, child_timeout)
    )
    records = harness.run_rounds(args, runs, seeded=True, seeds=seeds, timeout=timeout)
    rows = ratios(records)
    meta["plots"] = [plot(rows, args.out), *plot_dqn(rows, args.out)]
    harness.finish(NAME, args.out, records, rows, meta)


if __name__ == "__main__":
    main()

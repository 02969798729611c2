"""PPO at RLlib's defaults, ours vs RLlib's old-stack TF PPO: env steps to a 100-episode
mean return of 450 on CartPole-v1, side by side in one run.

Both sides get RLlib's PPO defaults, with 10 epochs as in issue 12; each round runs
every variant of ours, then RLlib, with the round as the seed. Variants of ours
(--variants): defaults, keras_init, adam_eps_1e-8, rllib_minibatches.

    python -m benchmarks.ppo_parity --rounds 3                 # ~30-60 min on 2 cores
    python -m benchmarks.ppo_parity --variants defaults,keras_init --rounds 1
    python -m benchmarks.ppo_parity --smoke

The hyperparameters, what each variant changes, and the results:
benchmarks/history/end_to_end.md.
"""

from __future__ import annotations

from benchmarks import compare_rllib, e2e, harness, rllib_env, stats

NAME = "ppo_parity"

# RLlib's PPOConfig defaults (ray 2.60, old API stack), num_epochs 10 as in issue 12.
RLLIB_DEFAULTS = {
    "lr": 5e-5,
    "gamma": 0.99,
    "lambda_": 1.0,
    "clip_param": 0.3,
    "vf_clip_param": 10.0,
    "vf_loss_coeff": 1.0,
    "kl_coeff": 0.2,
    "kl_target": 0.01,
    "entropy_coeff": 0.0,
    "train_batch_size": 4000,
    "minibatch_size": 128,
    "num_epochs": 10,
    "model": {"fcnet_hiddens": [256, 256], "fcnet_activation": "tanh"},
}
SMOKE = {"train_batch_size": 256, "minibatch_size": 64, "num_epochs": 2}

VARIANTS = {
    "defaults": {},
    "keras_init": {"init": "keras"},
    "adam_eps_1e-8": {"config": {"adam_epsilon": 1e-8}},
    "rllib_minibatches": {"minibatches": "rllib"},
}


# ----- ours: the e2e workload with a re-initialized model where a variant asks ------------


def keras_init_model_class():
    """FeedForwardModel re-initialized with the initializers it had before RLlib's."""
    import keras

    from policy_service.policy.models import FeedForwardModel
    from policy_service.policy.policy_config import ModelConfig

    class KerasInitModel(FeedForwardModel):
        def __init__(self, obs_space, action_space, num_outputs, model_config: dict):
            fields = {k: v for k, v in model_config.items() if k != "custom_model"}
            super().__init__(obs_space, action_space, num_outputs, ModelConfig(**fields))
            for layer in self._flatten_layers():
                if not isinstance(layer, keras.layers.Dense):
                    continue
                init = {
                    "action_dist_inputs": keras.initializers.Orthogonal(0.01),
                    "vf": keras.initializers.Orthogonal(1.0),
                }.get(layer.name, keras.initializers.GlorotUniform())
                layer.kernel.assign(init(layer.kernel.shape))

    return KerasInitModel


def rllib_minibatch_update(algo, learners, train_batch) -> dict:
    """PPO's update with RLlib's minibatching (see rllib_minibatches above), as
    PPO.update_on_batch."""
    import numpy as np

    from algorithms.ppo import standardize_advantages, update_kl_coefficient
    from policy_service.data.sample_batch import SampleBatch

    train_batch = standardize_advantages(train_batch.copy(shallow=True))
    train_batch.pop(SampleBatch.NEXT_OBS, None)
    learners.load_batch_into_buffer(train_batch, buffer_index=0)
    size = learners.config.minibatch_size
    num_blocks = max(1, train_batch.count // size)
    steps = []
    for _ in range(learners.config.num_epochs):
        for k in np.random.permutation(num_blocks):
            step = learners.learn_on_loaded_batch(int(k) * size, buffer_index=0)
            steps.append(step["learner_stats"])
    stats = {key: float(np.mean([s[key] for s in steps])) for key in steps[0]}
    if learners.config.kl_coeff > 0:
        update_kl_coefficient(learners, stats["kl"])
    stats["num_samples_trained"] = int(sum(s["valid_rows"] for s in steps))
    return stats


def measure(spec: dict):
    """Ours through e2e.measure, with the variant's model registered first."""
    spec = dict(spec, overrides=dict(spec["overrides"], **spec.get("config", {})))
    if spec.get("init") == "keras":
        from policy_service.policy.models import register_custom_model

        register_custom_model("keras_init_ff", keras_init_model_class())
        spec = dict(
            spec,
            overrides=dict(
                spec["overrides"],
                model=dict(spec["overrides"]["model"], custom_model="keras_init_ff"),
            ),
        )
    from algorithms.ppo import PPO

    update = PPO.update_on_batch  # put back after: a smoke measures variants in one process
    if spec.get("minibatches") == "rllib":
        import numpy as np

        np.random.seed(spec["seed"])
        PPO.update_on_batch = rllib_minibatch_update
    try:
        for record in e2e.measure(spec):
            yield dict(record, bench=NAME, variant=spec["variant"])
    finally:
        PPO.update_on_batch = update


# ----- the side-by-side schedule ------------------------------------------------------------


def schedule(args, rllib_python: str) -> list[harness.Run]:
    """Each variant of ours, then RLlib's e2e under `rllib_python` (its venv's)."""
    overrides = dict(RLLIB_DEFAULTS, **(SMOKE if args.smoke else {}))
    base = dict(
        num_gpus=0,
        num_env_runners=0,
        envs_per_runner=1,
        prepare_tf=False,
        overrides=overrides,
        target=15.0 if args.smoke else args.target,
        max_iterations=2 if args.smoke else 10_000,
        max_seconds=300 if args.smoke else args.max_seconds,
    )
    runs = [
        harness.Run(
            "benchmarks.ppo_parity",
            dict(base, variant=name, **VARIANTS[name]),
            tags={"framework": "ours"},
        )
        for name in args.variants.split(",")
    ]
    runs.append(
        harness.Run(
            compare_rllib.NAME_MODULE,
            dict(base, workload="e2e"),
            python=rllib_python,
            env=rllib_env.RLLIB_ENV,
            tags={"framework": "rllib", "bench": NAME, "variant": "rllib"},
        )
    )
    return runs


def summarize(records: list[dict]) -> list[dict]:
    """Per side: median env steps (and wall seconds) to the target over the seeds that
    reached it, and each variant's ratio to RLlib's median."""
    rows = []
    for variant in dict.fromkeys(r.get("variant") for r in records):
        picked = [r for r in records if r.get("variant") == variant]
        reached = [r for r in picked if r.get("reached")]
        rows.append(
            {
                "bench": NAME,
                "variant": variant,
                "reached": f"{len(reached)}/{len(picked)}",
                "env_steps_by_seed": {
                    r["seed"]: r.get("env_steps") if r.get("reached") else None for r in picked
                },
                "env_steps": stats.median([r["env_steps"] for r in reached]),
                "wall_s": stats.median([r["wall_s"] for r in reached]),
                "errors": sorted({r["error"][:200] for r in picked if "error" in r}),
            }
        )
    rllib = next((r for r in rows if r["variant"] == "rllib"), None)
    for row in rows:
        row["ratio_env_steps"] = stats.ratio(row["env_steps"], rllib and rllib["env_steps"])
    return rows


def main(argv=None):
    parser = harness.base_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--variants",
        default="defaults",
        help=f"variants of ours, comma-separated: {','.join(VARIANTS)}",
    )
    parser.add_argument("--target", type=float, default=e2e.TARGET_RETURN)
    parser.add_argument("--max-seconds", type=float, default=900)
    parser.add_argument(
        "--rllib-python",
        default=None,
        help="RLlib's python, used as given: no import check (its caller checked the venv, "
        "as the tests do); default: .venv-rllib's, made or checked first",
    )
    args = parser.parse_args(argv)
    if args.child:
        return harness.child_main(args, measure)
    unknown = set(args.variants.split(",")) - set(VARIANTS)
    if unknown:
        parser.error(f"--variants: unknown {sorted(unknown)}; expected some of {list(VARIANTS)}")
    rllib_python = args.rllib_python or rllib_env.ensure_rllib_venv()
    meta = harness.start_meta(
        args,
        rllib_python=rllib_python,
        rllib_versions=harness.versions(rllib_python),
        hyperparameters=RLLIB_DEFAULTS,
    )
    runs, timeout = schedule(args, rllib_python), harness.TO_TARGET["timeout"]
    if args.smoke:  # ours' variants in one child
        runs, timeout = harness.together(runs), harness.timeout_of(timeout)
    records = harness.run_rounds(args, runs, seeded=True, timeout=timeout)
    rows = summarize(records)
    # the table is the result: benchmarks/history/end_to_end.md, "PPO at RLlib's defaults"
    meta["plots"] = []
    harness.finish(NAME, args.out, records, rows, meta)


if __name__ == "__main__":
    main()

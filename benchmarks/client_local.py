"""Local-mode client acting: actions/s of ExportedPolicy.act beside a bare forward pass.

Targets, alternating within each child (one observation per call, the PPO MLP
4 -> 256x256 on CartPole spaces, its SavedModel packed as GET /v1/model sends it):
  bare      a tf.function over the Keras model with a [None, 4] signature, its
            action logits to numpy: the least an in-process forward pass costs
  exported  ExportedPolicy.act, what PolicyClient(inference_mode="local") calls per
            get_action: preprocessing, the SavedModel's serving signature (exploring)

    python -m benchmarks.client_local            # ~1 min
    python -m benchmarks.client_local --smoke
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from benchmarks import harness, plots, stats

NAME = "client_local"
VALUE = "actions_per_s"
KEYS = ("target",)
TARGETS = ("bare", "exported")
WORKLOAD = "PPO MLP 4 -> 256x256, one observation per call"


def measure(spec: dict):
    import numpy as np
    import tensorflow as tf

    from benchmarks import ppo_shaped
    from policy_service.client.exported_policy import ExportedPolicy, pack_model
    from policy_service.io.export import export_saved_model

    policy = ppo_shaped.make_policy("mlp", 1)
    with tempfile.TemporaryDirectory() as tmp:
        export_saved_model(policy, str(Path(tmp) / "model"))
        exported = ExportedPolicy.from_tar(pack_model(Path(tmp), 0, 0), 0, policy.observation_space)
    model = policy.model
    bare_fn = tf.function(
        lambda obs: model({"obs": obs}, training=False)["action_dist_inputs"],
        input_signature=[tf.TensorSpec([None, 4], tf.float32)],
    )
    obs = np.array([[0.01, -0.02, 0.03, -0.04]], np.float32)
    prev_a, prev_r = np.zeros(1, np.int64), np.zeros(1, np.float32)
    calls = {
        "bare": lambda: bare_fn(obs).numpy(),
        "exported": lambda: exported.act(obs, [], prev_a, prev_r, 0),
    }
    for target in spec["targets"]:
        calls[target]()  # warm-up (tracing the bare function)
    for repeat in range(spec["repeats"]):
        for target in spec["targets"]:  # alternating, so both see the same load
            times = stats.timed(calls[target], spec["calls"], warmup=10)
            yield {
                "bench": NAME,
                "round": spec["round"],
                "repeat": repeat,
                "target": target,
                VALUE: len(times) / sum(times),
                "p50_ms": stats.median(times) * 1e3,
                "p99_ms": stats.percentile(times, 99) * 1e3,
            }


def configurations(args) -> list[dict]:
    return [
        dict(
            target="local",
            targets=list(TARGETS),
            calls=200 if args.smoke else 2000,
            repeats=2 if args.smoke else 5,
        )
    ]


def summarize(records: list[dict]) -> list[dict]:
    summary = stats.summarize(records, KEYS, VALUE)
    for row in summary:
        row["vs_bare"] = stats.ratio(row[VALUE], stats.find(summary, VALUE, target="bare"))
    return summary


def plot(summary: list[dict], out_dir: str) -> str | None:
    return plots.bar_chart(
        f"{out_dir}/{NAME}.png",
        "Local-mode client acting, one observation per call",
        "actions/s",
        ["one process"],
        {row["target"]: [row[VALUE]] for row in summary},
    )


def add_flags(parser) -> None:
    """No flags beyond the harness's own."""


if __name__ == "__main__":
    harness.main(__name__)

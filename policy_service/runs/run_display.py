"""Metrics out of a run as it goes: a progress bar (or a line per iteration),
TensorBoard scalars, and every N iterations TensorBoard histograms."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HISTOGRAM_BINS = 30


class ProgressDisplay:
    """A tqdm bar on a terminal; one plain line per iteration when stderr is a file."""

    def __init__(self, total_iters: int | None, initial: int):
        from tqdm import tqdm

        self.live = sys.stderr.isatty()
        self.bar = tqdm(
            total=total_iters,
            initial=initial,
            unit="iter",
            file=sys.stderr,
            dynamic_ncols=True,
            disable=not self.live,
            desc="train",
        )

    def update(self, metrics: dict) -> None:
        ret = metrics.get("episode_return_mean")
        summary = (
            f"steps={metrics.get('timesteps_total', 0)} "
            f"return={'n/a' if ret is None else f'{ret:.1f}'} "
            f"{metrics.get('num_env_steps_sampled_per_s') or 0:.0f} steps/s"
        )
        if self.live:
            self.bar.set_postfix_str(summary, refresh=False)
            self.bar.update(1)
        else:
            print(
                f"iteration {metrics.get('iteration')}: {summary} "
                f"({metrics.get('time_total_s') or 0:.1f}s)",
                file=sys.stderr,
                flush=True,
            )

    def note(self, text: str) -> None:
        if self.live:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        self.bar.close()


class ScalarWriter:
    """Every numeric metric as a TensorBoard scalar at step = iteration.

    Written with tf.summary.write and the scalars plugin's metadata, which is
    what tf.summary.scalar does, minus its need for the tensorboard package.
    """

    def __init__(self, logdir: Path):
        import tensorflow as tf  # after the algorithm set up TF's devices
        from tensorflow.core.framework import summary_pb2

        self._tf = tf
        self._metadata = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"),
            data_class=summary_pb2.DATA_CLASS_SCALAR,
        )
        self._writer = tf.summary.create_file_writer(str(logdir))

    def write(self, metrics: dict) -> None:
        tf = self._tf
        step = int(metrics["iteration"])
        with self._writer.as_default(), tf.device("/CPU:0"):
            for key, value in metrics.items():
                if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue
                tf.summary.write(
                    key, tf.constant(value, tf.float32), step=step, metadata=self._metadata
                )
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class HistogramWriter:
    """Distributions as TensorBoard histograms, each with its mean, stddev, min and max
    as scalars beside it (Coach's variable summaries), at step = iteration.

    Written as TensorBoard's histograms plugin stores them (a <float64>[bins, 3]
    tensor of left edge, right edge and count per bin), without the tensorboard
    package, as ScalarWriter does for scalars.
    """

    def __init__(self, logdir: Path):
        import tensorflow as tf
        from tensorflow.core.framework import summary_pb2

        self._tf = tf
        self._histogram = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="histograms"),
            data_class=summary_pb2.DATA_CLASS_TENSOR,
        )
        self._scalar = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"),
            data_class=summary_pb2.DATA_CLASS_SCALAR,
        )
        self._writer = tf.summary.create_file_writer(str(logdir))

    def write(self, step: int, distributions: dict[str, np.ndarray]) -> None:
        """One histogram (and four scalars) per name; an empty array writes nothing."""
        tf = self._tf
        with self._writer.as_default(), tf.device("/CPU:0"):
            for name, values in distributions.items():
                values = np.asarray(values, np.float64).ravel()
                if values.size == 0:
                    continue
                buckets = tf.constant(histogram_buckets(values))
                tf.summary.write(name, buckets, step=step, metadata=self._histogram)
                for stat, value in (
                    ("mean", values.mean()),
                    ("stddev", values.std()),
                    ("min", values.min()),
                    ("max", values.max()),
                ):
                    tf.summary.write(
                        f"{name}/{stat}",
                        tf.constant(value, tf.float32),
                        step=step,
                        metadata=self._scalar,
                    )
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def histogram_buckets(values: np.ndarray, bins: int = HISTOGRAM_BINS) -> np.ndarray:
    """<float64>[bins, 3]: left edge, right edge, count (equal values: one bucket)."""
    low, high = float(values.min()), float(values.max())
    if low == high:
        return np.array([[low, high, float(values.size)]])
    counts, edges = np.histogram(values, bins=bins, range=(low, high))
    return np.stack([edges[:-1], edges[1:], counts.astype(np.float64)], axis=1)

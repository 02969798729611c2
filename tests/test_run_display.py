"""run_display.py's histograms, read back from the event files: every weight and the
episode returns after N iterations of a real `policy-service train`, each with its
mean, stddev, min and max."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.util import event_pb2

from policy_service import TFPolicy
from policy_service.cli import commands as cli
from policy_service.runs.run_display import HistogramWriter, histogram_buckets


def read_events(logdir: Path) -> dict:
    """tag -> {step: (plugin name, value as numpy)} over every event file in logdir."""
    found: dict = defaultdict(dict)
    for path in sorted(logdir.glob("events.out.tfevents.*")):
        for record in tf.data.TFRecordDataset(str(path)):
            event = event_pb2.Event.FromString(record.numpy())
            for value in event.summary.value:
                plugin = value.metadata.plugin_data.plugin_name
                found[value.tag][event.step] = (plugin, tf.make_ndarray(value.tensor))
    return found


def test_buckets_count_every_value_between_its_min_and_max():
    values = np.random.default_rng(0).normal(size=1000)
    buckets = histogram_buckets(values)
    assert buckets.shape == (30, 3) and buckets[:, 2].sum() == 1000
    assert buckets[0, 0] == values.min() and buckets[-1, 1] == values.max()
    np.testing.assert_array_equal(histogram_buckets(np.full(4, 2.5)), [[2.5, 2.5, 4.0]])


def test_a_distribution_is_a_histogram_with_its_four_statistics(tmp_path):
    writer = HistogramWriter(tmp_path)
    values = np.arange(12.0).reshape(3, 4)
    writer.write(7, {"w": values, "empty": np.zeros(0)})
    writer.close()
    events = read_events(tmp_path)
    assert "empty" not in events
    plugin, buckets = events["w"][7]
    assert plugin == "histograms"
    np.testing.assert_array_equal(buckets, histogram_buckets(values.ravel()))
    for stat, expected in (("mean", 5.5), ("stddev", values.std()), ("min", 0), ("max", 11)):
        assert events[f"w/{stat}"][7][0] == "scalars"
        assert events[f"w/{stat}"][7][1] == np.float32(expected)


def _small_ppo_run(tmp_path, capsys, iterations: int, histograms_every: int):
    """`train ppo` on CartPole with a tiny model and batch -> its output directory."""
    run = tmp_path / "run"
    code = cli.main(
        ["train", "ppo", "--env", "CartPole-v1", "--stop-iters", str(iterations), "--seed", "0"]
        + ["--output-dir", str(run), "--set", f"tensorboard_histograms_every={histograms_every}"]
        + ["--set", "train_batch_size=128", "--set", "minibatch_size=64", "--set", "num_epochs=1"]
        + ["--set", "model.fcnet_hiddens=[8]"]
    )
    assert code == 0, capsys.readouterr().err
    return run


@pytest.mark.slow  # a real two-iteration run: ~30 s on this loaded machine
def test_a_run_writes_histograms_of_every_weight_every_n_iterations(tmp_path, capsys):
    run = _small_ppo_run(tmp_path, capsys, iterations=2, histograms_every=2)
    events = read_events(run / "tensorboard")
    weights = TFPolicy.from_checkpoint(str(run / "checkpoints" / "checkpoint_000002" / "policy"))
    for name, value in weights.get_weights().items():
        plugin, buckets = events[f"weights/{name}"][2]
        assert plugin == "histograms" and buckets[:, 2].sum() == value.size, name
        assert list(events[f"weights/{name}"]) == [2]  # iteration 2 only, not 1
        assert events[f"weights/{name}/max"][2][1] == np.float32(value.max())
    histograms = {tag for tag, steps in events.items() if steps[2][0] == "histograms"}
    # an MLP: every weight is trainable, and each has its gradient's histogram
    assert {f"gradients/{name}" for name in weights.get_weights()} <= histograms
    for name, value in weights.get_weights().items():
        plugin, buckets = events[f"gradients/{name}"][2]
        assert buckets[:, 2].sum() == value.size and list(events[f"gradients/{name}"]) == [2]
        assert np.isfinite(events[f"gradients/{name}/stddev"][2][1])
    assert events["episode_returns"][2][1][:, 2].sum() >= 1


@pytest.mark.slow  # a real one-iteration run: ~10 s here
def test_histograms_every_0_writes_scalars_and_no_histogram(tmp_path, capsys):
    events = read_events(_small_ppo_run(tmp_path, capsys, 1, histograms_every=0) / "tensorboard")
    assert 1 in events["policy_loss"]  # the scalars are written
    assert not [tag for tag, steps in events.items() if steps[1][0] == "histograms"]
    assert not [tag for tag in events if tag.startswith(("weights/", "gradients/"))]

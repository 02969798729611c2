"""Replay buffers: the priority tree against its definition, sampling frequencies
(chi-square, fixed seed), importance weights against the PER formula, priority
updates, ring overwrite, state round trips through npz/JSON, bad input."""

import math

import gymnasium as gym
import numpy as np
import pytest
import tree
from replay_checkpoints import save_and_load

from policy_service.data.sample_batch import SampleBatch, concat_samples
from policy_service.replay import (
    BATCH_INDEXES,
    PRIO_WEIGHTS,
    PrioritizedReplayBuffer,
    PriorityTree,
    ReplayBuffer,
)


def cartpole_batch(rows, seed=0, start_id=0):
    """Random-action CartPole transitions, with an "id" column counting rows added."""
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    columns = {k: [] for k in ("obs", "actions", "rewards", "terminateds", "truncateds", "new_obs")}
    for _ in range(rows):
        action = int(rng.integers(2))
        new_obs, reward, terminated, truncated, _ = env.step(action)
        for key, value in zip(columns, (obs, action, reward, terminated, truncated, new_obs)):
            columns[key].append(value)
        obs = env.reset()[0] if terminated or truncated else new_obs
    env.close()
    dtypes = {
        "obs": np.float32,
        "actions": np.int64,
        "rewards": np.float32,
        "terminateds": bool,
        "truncateds": bool,
        "new_obs": np.float32,
    }
    batch = {k: np.asarray(v, dtypes[k]) for k, v in columns.items()}
    batch["id"] = np.arange(start_id, start_id + rows, dtype=np.int64)
    return SampleBatch(batch)


def id_batch(rows, start=0):
    return {
        "id": np.arange(start, start + rows, dtype=np.int64),
        "frame": np.full((rows, 6, 6, 4), start % 251, np.uint8),
    }


def chi_square_critical(df, z=4.75):
    """Upper quantile of chi-square(df) at normal deviate z (~1e-6 tail), by the
    Wilson-Hilferty approximation (no scipy here)."""
    c = 2.0 / (9.0 * df)
    return df * (1.0 - c + z * math.sqrt(c)) ** 3


def chi_square(counts, probabilities):
    expected = probabilities * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


# ---- PriorityTree ----------------------------------------------------------------


@pytest.mark.parametrize("capacity,fanout", [(1, 2), (37, 2), (37, 16), (1000, 16), (300, 5)])
def test_tree_find_total_min_match_definition(capacity, fanout):
    rng = np.random.default_rng(capacity)
    tree = PriorityTree(capacity, fanout)
    leaves = np.zeros(capacity, np.float32)
    for _ in range(5):  # batches with duplicate slots and zeros (empty slots)
        slots = rng.integers(0, capacity, max(1, capacity // 3))
        values = rng.uniform(0, 2, len(slots)).astype(np.float32)
        values[rng.random(len(slots)) < 0.2] = 0.0
        tree.update(slots, values)
        for s, v in zip(slots, values):  # numpy's rule for duplicates: the last wins
            leaves[s] = v
    if not leaves.any():
        tree.update(np.array([0]), np.array([1.0], np.float32))
        leaves[0] = 1.0
    np.testing.assert_allclose(tree.total, leaves.astype(np.float64).sum(), rtol=1e-12)
    assert tree.min == leaves[leaves > 0].min()
    cumulative = np.cumsum(leaves.astype(np.float64))
    prefixes = np.concatenate(
        [
            rng.random(2000) * tree.total,
            cumulative[:-1],
            [0.0, np.nextafter(tree.total, 0), tree.total],
        ]
    )
    want = np.minimum(np.searchsorted(cumulative, prefixes, side="right"), capacity - 1)
    got = tree.find(prefixes)
    in_range = prefixes < cumulative[-1] * (1 - 1e-9)  # away from the rounding edge
    np.testing.assert_array_equal(got[in_range], want[in_range])
    assert (leaves[got] > 0).all(), "an empty slot was found"


@pytest.mark.parametrize("start,count", [(0, 5), (30, 20), (45, 50), (7, 50)])
def test_tree_set_range_wraps_like_slot_updates(start, count):
    """set_range (slices, what add uses) equals update with the wrapped slots."""
    rng = np.random.default_rng(start)
    by_range, by_slots = PriorityTree(50, 4), PriorityTree(50, 4)
    initial = rng.random(50).astype(np.float32)
    by_range.update(np.arange(50), initial)
    by_slots.update(np.arange(50), initial)
    values = rng.random(count).astype(np.float32)
    by_range.set_range(start, values)
    by_slots.update((start + np.arange(count)) % 50, values)
    for level_a, level_b in zip(by_range.sums + by_range.mins, by_slots.sums + by_slots.mins):
        np.testing.assert_array_equal(level_a, level_b)


def test_tree_rebuild_equals_incremental_updates():
    rng = np.random.default_rng(1)
    a, b = PriorityTree(500, 16), PriorityTree(500, 16)
    slots = rng.integers(0, 500, 300)
    values = rng.random(300).astype(np.float32)
    a.update(slots, values)
    b.leaves[slots] = values
    b.rebuild()
    for level_a, level_b in zip(a.sums + a.mins, b.sums + b.mins):
        np.testing.assert_array_equal(level_a, level_b)


# ---- sampling distributions ------------------------------------------------------


def test_prioritized_frequencies_follow_the_sum_tree_definition():
    capacity, alpha = 40, 0.7
    buffer = PrioritizedReplayBuffer(capacity, alpha=alpha, beta=0.5, seed=7)
    buffer.add(id_batch(capacity))
    td = np.random.default_rng(3).normal(0, 2, capacity)
    buffer.update_priorities(np.arange(capacity), td)
    scaled = (np.abs(td) + buffer.epsilon) ** alpha
    probabilities = scaled / scaled.sum()
    counts = np.zeros(capacity)
    for _ in range(5000):  # 200k draws, `capacity` at a time (n > size is refused)
        np.add.at(counts, buffer.sample(capacity)["id"], 1)
    critical = chi_square_critical(capacity - 1)
    assert chi_square(counts, probabilities) < critical
    # the same draws are far from uniform and from alpha = 1: the test can fail
    assert chi_square(counts, np.full(capacity, 1 / capacity)) > 10 * critical
    unsharpened = np.abs(td) / np.abs(td).sum()
    assert chi_square(counts, unsharpened) > critical


def test_uniform_frequencies_and_indexes():
    buffer = ReplayBuffer(30, seed=2)
    buffer.add(id_batch(30, start=100))
    counts = np.zeros(30)
    for _ in range(2000):
        batch = buffer.sample(30)
        np.testing.assert_array_equal(batch["id"], batch[BATCH_INDEXES] + 100)
        np.add.at(counts, batch[BATCH_INDEXES], 1)
    assert chi_square(counts, np.full(30, 1 / 30)) < chi_square_critical(29)
    assert PRIO_WEIGHTS not in batch


def test_importance_weights_match_the_formula():
    capacity, alpha, beta = 64, 0.6, 0.4
    buffer = PrioritizedReplayBuffer(capacity, alpha=alpha, beta=beta, seed=0)
    buffer.add(cartpole_batch(capacity))
    td = np.random.default_rng(5).uniform(-3, 3, capacity)
    buffer.update_priorities(np.arange(capacity), td)
    p = (np.abs(td) + buffer.epsilon) ** alpha
    probability = p / p.sum()
    all_weights = (capacity * probability) ** -beta
    for b in (beta, 1.0):  # the buffer's beta, and one passed to sample
        batch = buffer.sample(capacity, beta=None if b == beta else b)
        idx = batch[BATCH_INDEXES]
        want = (capacity * probability[idx]) ** -b / ((capacity * probability) ** -b).max()
        np.testing.assert_allclose(batch[PRIO_WEIGHTS], want, rtol=1e-5)
        assert batch[PRIO_WEIGHTS].dtype == np.float32
    assert all_weights.argmax() == p.argmin()  # the normaliser is the rarest row's weight
    batch = concat_samples([buffer.sample(capacity) for _ in range(40)])
    rarest = batch[BATCH_INDEXES] == p.argmin()
    if rarest.any():
        np.testing.assert_allclose(batch[PRIO_WEIGHTS][rarest], 1.0, rtol=1e-6)
    assert (batch[PRIO_WEIGHTS] <= 1.0 + 1e-6).all()


# ---- priorities ------------------------------------------------------------------


def test_priority_updates_and_new_rows_get_the_max_priority():
    buffer = PrioritizedReplayBuffer(10, alpha=0.5, epsilon=0.01, seed=0)
    buffer.add(id_batch(6))
    np.testing.assert_allclose(buffer.tree.leaves[:6], 1.0)  # max priority starts at 1
    buffer.update_priorities(np.array([0, 2, 2]), np.array([3.0, -8.0, 0.0]))
    np.testing.assert_allclose(buffer.tree.leaves[[0, 2]], [3.01**0.5, 0.01**0.5], rtol=1e-6)
    assert buffer.max_priority == pytest.approx(8.01)  # duplicates: all count for the max
    buffer.add(id_batch(2, start=6))
    np.testing.assert_allclose(buffer.tree.leaves[6:8], 8.01**0.5, rtol=1e-6)
    buffer.add(id_batch(2, start=8), priorities=np.array([0.25, 4.0]))
    np.testing.assert_allclose(buffer.tree.leaves[8:10], [0.5, 2.0], rtol=1e-6)
    leaves = buffer.tree.leaves[:10].astype(np.float64)
    assert buffer.tree.total == pytest.approx(leaves.sum(), rel=1e-12)
    assert buffer.tree.min == pytest.approx(leaves.min(), rel=1e-7)


def test_alpha_zero_is_uniform():
    buffer = PrioritizedReplayBuffer(20, alpha=0.0, seed=1)
    buffer.add(id_batch(20))
    buffer.update_priorities(np.arange(20), np.arange(20) * 5.0)
    np.testing.assert_allclose(buffer.sample(20)[PRIO_WEIGHTS], 1.0)


# ---- ring ------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer])
def test_ring_overwrites_the_oldest_rows(cls):
    buffer = cls(10, seed=0)
    buffer.add(id_batch(7))
    buffer.add(id_batch(7, start=7))  # wraps: ids 10..13 overwrite slots 0..3
    assert len(buffer) == 10 and buffer.store.next_index == 4
    held = buffer.store.take(np.arange(10))["id"]
    np.testing.assert_array_equal(held, [10, 11, 12, 13, 4, 5, 6, 7, 8, 9])
    np.testing.assert_array_equal(
        buffer.store.take(np.arange(10))["frame"][:, 0, 0, 0], [7] * 4 + [0] * 3 + [7] * 3
    )
    buffer.add(id_batch(25, start=14))  # longer than the ring: its last 10 rows stay
    held = buffer.store.take(np.arange(10))["id"]
    np.testing.assert_array_equal(np.sort(held), np.arange(29, 39))
    np.testing.assert_array_equal(held % 10, np.arange(10))  # row i in slot i mod capacity
    assert buffer.store.next_index == 39 % 10 and buffer.store.num_added == 39
    sampled = buffer.sample(10)
    assert set(sampled["id"].tolist()) <= set(range(29, 39))


def test_prioritized_overwritten_slots_lose_their_priority():
    buffer = PrioritizedReplayBuffer(4, alpha=1.0, seed=0)
    buffer.add(id_batch(4))
    buffer.update_priorities(np.arange(4), np.array([100.0, 1.0, 1.0, 1.0]))
    buffer.add(id_batch(1, start=4), priorities=np.array([0.5]))  # replaces slot 0
    assert buffer.tree.leaves[0] == pytest.approx(0.5)
    assert buffer.tree.total == pytest.approx(0.5 + 3 * (1 + buffer.epsilon))


# ---- state -----------------------------------------------------------------------


def nested_batch(rows, start=0):
    rng = np.random.default_rng(start)
    return {
        "obs": {
            "pos": rng.normal(size=(rows, 3)).astype(np.float32),
            "frames": (rng.integers(0, 255, (rows, 84, 84, 4), dtype=np.uint8),),
        },
        "actions": rng.integers(0, 4, rows),
        "id": np.arange(start, start + rows),
    }


def assert_same_batch(a, b):
    assert list(a) == list(b)
    tree.map_structure(np.testing.assert_array_equal, dict(a), dict(b))


@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer])
def test_state_round_trip_gives_the_same_next_sample(cls, tmp_path):
    buffer = cls(50, seed=11)
    buffer.add(nested_batch(30))
    buffer.add(nested_batch(30, start=30))  # wrapped
    buffer.sample(8)
    if cls is PrioritizedReplayBuffer:
        batch = buffer.sample(16)
        buffer.update_priorities(batch[BATCH_INDEXES], np.linspace(-2, 2, 16))
    restored = cls(50, seed=999)
    restored.set_state(save_and_load(buffer.get_state(), tmp_path))
    assert len(restored) == len(buffer) and restored.store.next_index == buffer.store.next_index
    assert_same_batch(restored.sample(16), buffer.sample(16))
    more = nested_batch(5, start=60)
    buffer.add(more)
    restored.add(more)
    assert_same_batch(restored.sample(32), buffer.sample(32))
    if cls is PrioritizedReplayBuffer:
        for level_a, level_b in zip(buffer.tree.sums, restored.tree.sums):
            np.testing.assert_allclose(level_a, level_b, rtol=1e-12)


def test_set_state_checks_everything_before_assigning(tmp_path):
    buffer = PrioritizedReplayBuffer(20, seed=0)
    buffer.add(id_batch(10))
    state = save_and_load(buffer.get_state(), tmp_path)
    target = PrioritizedReplayBuffer(20, seed=1)
    target.add(id_batch(3, start=50))
    before = target.store.take(np.arange(3))["id"].copy()

    bad = {"arrays": dict(state["arrays"]), "meta": state["meta"]}
    bad["arrays"]["priorities"] = bad["arrays"]["priorities"].copy()
    bad["arrays"]["priorities"][4] = np.nan
    with pytest.raises(ValueError, match="priorities must be finite and > 0; row 4"):
        target.set_state(bad)
    bad = {"arrays": dict(state["arrays"]), "meta": state["meta"]}
    bad["arrays"]["columns/frame"] = bad["arrays"]["columns/frame"][:, :3]
    with pytest.raises(ValueError, match="'columns/frame' has shape"):
        target.set_state(bad)
    with pytest.raises(ValueError, match="capacity 20, this buffer has 30"):
        PrioritizedReplayBuffer(30).set_state(state)
    with pytest.raises(ValueError, match="written by 'PrioritizedReplayBuffer'"):
        ReplayBuffer(20).set_state(state)
    np.testing.assert_array_equal(target.store.take(np.arange(3))["id"], before)
    assert len(target) == 3


# ---- bad input -------------------------------------------------------------------


def test_uniform_samples_more_rows_than_it_holds_with_replacement_as_rllibs():
    buffer = ReplayBuffer(100, seed=0)
    with pytest.raises(ValueError, match=r"^replay buffer: cannot sample from an empty buffer$"):
        buffer.sample(1)
    added = cartpole_batch(3)
    buffer.add(added)
    batch = buffer.sample(600)  # was: cannot sample 600 rows, it holds 3
    assert batch.count == 600
    counts = np.bincount(batch[BATCH_INDEXES], minlength=3)
    assert counts.sum() == 600 and np.all(counts > 150)  # 200 each expected, sd ~12
    np.testing.assert_array_equal(batch["obs"], added["obs"][batch[BATCH_INDEXES]])
    with pytest.raises(ValueError, match=r"^replay buffer: sample size must be an int >= 1"):
        buffer.sample(0)
    with pytest.raises(ValueError, match="sample size must be an int >= 1, got True"):
        buffer.sample(True)


def test_prioritized_samples_more_rows_than_it_holds_with_replacement_as_rllibs():
    buffer = PrioritizedReplayBuffer(100, alpha=1.0, seed=0)
    buffer.add(cartpole_batch(3), priorities=np.array([1.0, 2.0, 5.0]))
    batch = buffer.sample(800)
    assert batch.count == 800
    counts = np.bincount(batch["batch_indexes"], minlength=3)
    assert counts.sum() == 800 and np.all(counts > 0)
    assert counts[2] > counts[1] > counts[0]  # 500 : 200 : 100 expected, sd < 15


def test_bad_input_errors_name_the_column():
    buffer = PrioritizedReplayBuffer(100, seed=0)
    good = cartpole_batch(8)
    buffer.add(good)
    missing = {k: v for k, v in good.items() if k != "rewards"}
    with pytest.raises(KeyError, match="column 'rewards' missing from the batch"):
        buffer.add(missing)
    with pytest.raises(KeyError, match="column 'infos' is not stored"):
        buffer.add(dict(good, infos=np.zeros(8)))
    with pytest.raises(
        ValueError,
        match=r"column 'obs' has rows of shape \(5,\) dtype float32"
        r", the buffer stores rows of shape \(4,\)",
    ):
        buffer.add(dict(good, obs=np.zeros((8, 5), np.float32)))
    with pytest.raises(ValueError, match="column 'rewards' has rows of shape .* dtype float64"):
        buffer.add(dict(good, rewards=np.zeros(8)))
    with pytest.raises(ValueError, match=r"^replay buffer: cannot sample from an empty buffer$"):
        PrioritizedReplayBuffer(10, seed=0).sample(1)
    with pytest.raises(ValueError, match="td_errors must be finite; row 1 is nan"):
        buffer.update_priorities(np.array([0, 1]), np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match="index 8 is outside the 8 rows held"):
        buffer.update_priorities(np.array([0, 8]), np.array([1.0, 1.0]))
    with pytest.raises(ValueError, match="priorities must be finite and > 0; row 2 is -1.0"):
        buffer.add(good, priorities=np.array([1.0, 1.0, -1.0, 1, 1, 1, 1, 1]))
    with pytest.raises(ValueError, match=r"priorities must have shape \(8,\), got \(3,\)"):
        buffer.add(good, priorities=np.ones(3))
    with pytest.raises(ValueError, match="td_errors must be finite; row 0 is -inf"):
        buffer.update_priorities(np.array([0, 1]), np.array([-np.inf, 1.0]))
    with pytest.raises(ValueError, match="index -1 is outside the 8 rows held"):
        buffer.update_priorities(np.array([0, -1]), np.array([1.0, 1.0]))
    with pytest.raises(
        ValueError,
        match="indexes must be a 1-D integer array, got shape "
        r"\(2,\) dtype float64",
    ):
        buffer.update_priorities(np.array([0.0, 1.0]), np.array([1.0, 1.0]))
    with pytest.raises(ValueError, match=r"td_errors must have shape \(2,\), got \(3,\)"):
        buffer.update_priorities(np.array([0, 1]), np.ones(3))
    assert len(buffer) == 8  # nothing above was added
    leaves = buffer.tree.leaves.copy()
    buffer.update_priorities(np.array([3, 7], np.uint64), np.array([2.0, -1.0], np.float32))
    assert buffer.tree.leaves[3] == pytest.approx((2.0 + buffer.epsilon) ** buffer.alpha)
    assert buffer.tree.leaves[7] == pytest.approx((1.0 + buffer.epsilon) ** buffer.alpha)
    np.testing.assert_array_equal(np.delete(buffer.tree.leaves, [3, 7]), np.delete(leaves, [3, 7]))
    with pytest.raises(TypeError, match="column 'infos' must be a numeric array"):
        ReplayBuffer(10).add({"obs": np.zeros((2, 3)), "infos": [{}, {}]})
    with pytest.raises(ValueError, match="epsilon must be > 0"):
        PrioritizedReplayBuffer(10, epsilon=0.0)
    with pytest.raises(ValueError, match="capacity must be an int >= 1"):
        ReplayBuffer(0)


def test_a_layout_added_before_still_refuses_bad_batches_before_writing():
    """Batches of a layout the store has seen take one comparison of (dtype, shape)
    per column; every mismatch still raises naming the column, nothing written."""
    buffer = ReplayBuffer(16, seed=0)
    good = {"obs": np.ones((4, 3), np.float32), "actions": np.arange(4)}
    for _ in range(3):
        buffer.add(good)
    held = buffer.store.take(np.arange(12))
    bad_batches = [
        (
            dict(good, obs=np.ones((4, 3))),
            ValueError,
            r"column 'obs' has rows of shape "
            r"\(3,\) dtype float64, the buffer stores rows of shape \(3,\) dtype float32",
        ),
        (
            dict(good, obs=np.ones((4, 1), np.float32)),
            ValueError,  # would broadcast
            r"column 'obs' has rows of shape \(1,\) dtype float32",
        ),
        (dict(good, actions=np.arange(3)), ValueError, "different row counts"),
        (dict(good, actions=np.int64(1)), ValueError, r"column 'actions' has rows of shape \(\)"),
        ({"obs": good["obs"]}, KeyError, "column 'actions' missing from the batch"),
        (dict(good, extra=np.zeros(4)), KeyError, "column 'extra' is not stored"),
    ]
    for batch, error, message in bad_batches:
        with pytest.raises(error, match=message):
            buffer.add(batch)
    assert len(buffer) == 12 and buffer.store.next_index == 12
    assert_same_batch(buffer.store.take(np.arange(12)), held)

    class Tagged(np.ndarray):  # not an ndarray exactly: checked column by column
        pass

    buffer.add(SampleBatch(obs=np.full((5, 3), 2, np.float32), actions=np.arange(5)))
    buffer.add({"obs": np.full((2, 3), 3, np.float32).view(Tagged), "actions": np.array([7, 8])})
    buffer.add({"obs": np.zeros((0, 3), np.float32), "actions": np.zeros(0, np.int64)})
    assert len(buffer) == 16 and buffer.store.next_index == (12 + 5 + 2) % 16
    held = buffer.store.take(np.arange(16))
    np.testing.assert_array_equal(held["actions"], [4, 7, 8, 3] + [0, 1, 2, 3] * 3)
    np.testing.assert_array_equal(held["obs"][:4, 0], [2, 3, 3, 1])
    buffer.add(dict(good, actions=[5, 5, 5, 5]))  # a list of ints: an int64 column
    np.testing.assert_array_equal(buffer.store.take(np.arange(3, 7))["actions"], [5] * 4)
    import tensorflow as tf  # tensors of the stored dtype and shape copy as arrays do

    buffer.add({"obs": tf.fill((2, 3), 6.0), "actions": tf.constant([6, 6], tf.int64)})
    np.testing.assert_array_equal(buffer.store.take(np.arange(7, 9))["obs"], np.full((2, 3), 6))
    with pytest.raises(ValueError, match="column 'obs' has rows of shape .* dtype float64"):
        buffer.add({"obs": tf.ones((2, 3), tf.float64), "actions": tf.constant([6, 6], tf.int64)})


def test_sampled_batch_has_the_flags_of_a_plain_sample_batch():
    """sample builds its SampleBatch without the constructor's checks; it must be the
    batch the constructor would have built."""
    for buffer in (ReplayBuffer(10, seed=0), PrioritizedReplayBuffer(10, seed=0)):
        buffer.add(cartpole_batch(6))
        batch = buffer.sample(5)
        built = SampleBatch(dict(batch))
        assert (batch.count, batch.zero_padded, batch.max_seq_len, batch.is_training) == (
            built.count,
            built.zero_padded,
            built.max_seq_len,
            built.is_training,
        )
        batch.validate()
        assert len(batch.slice(1, 3)) == 2 and len(concat_samples([batch, batch])) == 10


def test_columns_argument_keeps_only_those():
    buffer = ReplayBuffer(10, columns=["obs", "actions"], seed=0)
    buffer.add(cartpole_batch(4))
    batch = buffer.sample(3)
    assert set(batch) == {"obs", "actions", BATCH_INDEXES}
    assert batch["obs"].shape == (3, 4) and batch.count == 3


def test_row_count_and_nesting_mismatches_are_refused():
    buffer = ReplayBuffer(10, seed=0)
    buffer.add({"obs": {"a": np.zeros((2, 3)), "b": np.zeros(2)}, "actions": np.zeros(2)})
    with pytest.raises(
        ValueError,
        match=r"different row counts \{'obs/a': 3, 'obs/b': 3, "
        r"'actions': 2\}",
    ):
        buffer.add({"obs": {"a": np.zeros((3, 3)), "b": np.zeros(3)}, "actions": np.zeros(2)})
    with pytest.raises(
        ValueError,
        match=r"column 'obs' has leaves \['obs/a'\], the buffer "
        r"stores \['obs/a', 'obs/b'\]",
    ):
        buffer.add({"obs": {"a": np.zeros((2, 3))}, "actions": np.zeros(2)})
    with pytest.raises(ValueError, match=r"column 'obs/b' has rows of shape \(2,\)"):
        buffer.add({"obs": {"a": np.zeros((2, 3)), "b": np.zeros((2, 2))}, "actions": np.zeros(2)})
    assert len(buffer) == 2
    fresh = ReplayBuffer(10)
    with pytest.raises(ValueError, match="different row counts"):
        fresh.add({"obs": np.zeros((3, 2)), "actions": np.zeros(2)})
    fresh.add({"obs": np.zeros((2, 5), np.float32)})  # the refused batch fixed no layout
    assert fresh.store.columns == ["obs"] and fresh.sample(2)["obs"].shape == (2, 5)

"""Replay buffers with frame_stack_axis: each distinct frame of obs/new_obs stored once.

Exactness against a plain buffer fed the same batches (same seed: same rows
drawn, byte-identical columns) on frame-stacked streams from gymnasium's
FrameStackObservation, interleaved sub-envs, n-step new_obs, ring wrapped many
times; memory about one frame per row; reference counts that never leak; hash
collisions (forced, and real ones of the sampled-word hash) that stay exact;
state round trips; one-line refusals that change nothing. (DQN with the option:
test_dqn_algorithm.py.)
"""

import numpy as np
import pytest
from fakes import frame_stack_stream
from replay_checkpoints import save_and_load

from policy_service.replay import PrioritizedReplayBuffer, ReplayBuffer, frame_pool

STACK, ENVS = 4, 4


def assert_same_rows(a, b):
    assert list(a) == list(b)
    for key in a:
        assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
        assert a[key].flags.c_contiguous, key
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def feed_both(cls, axis, n_step, rounds, capacity=200, seed=3, check_every=1):
    """A plain buffer and a frame-pool one fed the same stream and sampled alike;
    every sample compared. Returns (plain, pooled, episodes begun)."""
    plain = cls(capacity, seed=seed)
    pooled = cls(capacity, seed=seed, frame_stack_axis=axis)
    rng = np.random.default_rng(seed)
    episodes = 0
    stream = frame_stack_stream(ENVS, rounds, n_step, STACK, axis=axis, seed=seed)
    for i, (batch, episodes) in enumerate(stream):  # noqa: B007 - the last count is returned
        plain.add(batch)
        pooled.add(batch)
        if i % check_every == 0:
            a, b = plain.sample(len(plain)), pooled.sample(len(pooled))
            assert_same_rows(a, b)
            if cls is PrioritizedReplayBuffer:
                td = rng.normal(size=len(a["id"]))
                plain.update_priorities(a["batch_indexes"], td)
                pooled.update_priorities(b["batch_indexes"], td)
    return plain, pooled, episodes


def assert_counts_match_the_rows(store):
    """Each slot's reference count is the rows' uses of it; free slots have none; the
    hash index points at live slots whose frames hash to its keys."""
    pool, ids = store.pool, store.row_ids[: store.size]
    np.testing.assert_array_equal(pool.refcounts, np.bincount(ids.ravel(), minlength=pool.capacity))
    free = pool.free[: pool.num_free]
    assert len(np.unique(free)) == pool.num_free and (pool.refcounts[free] == 0).all()
    assert pool.num_live == np.count_nonzero(pool.refcounts)
    slots = np.array(list(pool.index.values()), np.int64)
    assert (pool.refcounts[slots] > 0).all()
    hashes = frame_pool.frame_hashes(frame_pool.word_view(pool.frames[slots]))
    np.testing.assert_array_equal(hashes, np.array(list(pool.index), np.uint64))


def live_episodes(buffer):
    rows = buffer.store.take(np.arange(len(buffer)))
    return int(np.count_nonzero(rows["terminateds"] | rows["truncateds"])) + ENVS


# ---- exactness and memory ----------------------------------------------------------


@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer])
@pytest.mark.parametrize("axis", [0, -1])
@pytest.mark.parametrize("n_step", [1, 3])
def test_every_sample_equals_the_plain_buffers(cls, axis, n_step):
    # 16 rows per add (4 sub-envs x 4 steps), 1600 rows through a ring of 200: 8 wraps
    plain, pooled, _ = feed_both(cls, axis, n_step, rounds=100)
    assert_same_rows(plain.store.take(np.arange(200)), pooled.store.take(np.arange(200)))
    if cls is PrioritizedReplayBuffer:
        np.testing.assert_array_equal(plain.tree.leaves, pooled.tree.leaves)
    assert_counts_match_the_rows(pooled.store)


def test_live_frames_are_about_one_per_row_and_stay_bounded():
    plain = ReplayBuffer(400, seed=0)
    pooled = ReplayBuffer(400, seed=0, frame_stack_axis=0)
    live, capacities = [], []
    for batch, _ in frame_stack_stream(ENVS, 300, n_step=3, stack=STACK):  # 12 wraps
        plain.add(batch)
        pooled.add(batch)
        live.append(pooled.store.num_frames)
        capacities.append(pooled.store.pool.capacity)
    # a frame per step, one more per episode (its reset frame), and at the ring's
    # edge the older frames of each sub-env's oldest stacks
    rows, episodes = len(pooled), live_episodes(pooled)
    assert pooled.store.num_frames <= rows + episodes + (STACK + 3) * ENVS
    assert pooled.store.num_frames <= 1.2 * rows + STACK * episodes
    assert max(live[-200:]) <= 1.2 * rows + STACK * max(episodes, 1)
    assert capacities[-1] == capacities[100]  # the pool stopped growing once the ring was full
    assert_counts_match_the_rows(pooled.store)
    # the frames cost ~1/8 of storing obs and new_obs whole
    frame_bytes = 6 * 6
    assert pooled.store.pool.frames.nbytes < 2 * (rows + episodes) * frame_bytes
    assert plain.store.nbytes > 2 * STACK * rows * frame_bytes


@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer])
def test_random_data_round_trips_without_sharing(cls):
    """Frames that never repeat: nothing is shared, the pool grows to every frame."""
    plain, pooled = cls(50, seed=1), cls(50, seed=1, frame_stack_axis=-1)
    rng = np.random.default_rng(0)
    for i in range(30):
        rows = int(rng.integers(1, 12))
        batch = {
            "obs": rng.integers(0, 256, (rows, 5, 7, 3), np.uint8),
            "new_obs": rng.integers(0, 256, (rows, 5, 7, 3), np.uint8),
            "actions": rng.integers(0, 4, rows),
            "id": np.arange(rows) + 100 * i,
        }
        plain.add(batch)
        pooled.add(batch)
        assert_same_rows(plain.sample(len(plain)), pooled.sample(len(pooled)))
        assert pooled.store.num_frames == 2 * 3 * len(pooled)
    assert_same_rows(plain.store.take(np.arange(50)), pooled.store.take(np.arange(50)))
    assert_counts_match_the_rows(pooled.store)
    assert pooled.store.pool.capacity <= 2 * 3 * 50


def test_float_frames_with_nan_and_signed_zeros_are_kept_bit_for_bit():
    frames = np.array([[np.nan, 0.0], [np.nan, -0.0], [1.0, 2.0]], np.float32)
    obs = np.stack([frames[[0, 1, 2]], frames[[1, 2, 0]]])[..., None]  # [2, 3, 2, 1]
    batch = {"obs": obs, "new_obs": obs[::-1].copy(), "id": np.arange(2)}
    buffer = ReplayBuffer(4, seed=0, frame_stack_axis=0)
    buffer.add(batch)
    held = buffer.store.take(np.arange(2))
    for key in ("obs", "new_obs"):
        np.testing.assert_array_equal(held[key].view(np.uint32), batch[key].view(np.uint32))
    assert buffer.store.num_frames == 3


# ---- hash collisions ------------------------------------------------------------------


def test_a_constant_hash_stays_exact(monkeypatch):
    monkeypatch.setattr(frame_pool, "frame_hashes", lambda words: np.zeros(len(words), np.uint64))
    plain, pooled, _ = feed_both(PrioritizedReplayBuffer, -1, 3, rounds=40, capacity=100)
    assert_same_rows(plain.store.take(np.arange(100)), pooled.store.take(np.arange(100)))
    assert_counts_match_the_rows(pooled.store)
    assert len(pooled.store.pool.index) == 1
    # collisions cost memory, never content: more frames than a working hash keeps
    # (~1.1 per row, see test_live_frames_are_about_one_per_row_and_stay_bounded)
    assert 1.5 * len(pooled) < pooled.store.num_frames <= 2 * STACK * len(pooled)


def test_frames_differing_only_outside_the_hashed_words_are_both_kept():
    """84x84 uint8 frames are 882 words, 128 are hashed: a change elsewhere collides."""
    sampled = frame_pool.sampled_positions(84 * 84 // 8)
    assert len(sampled) == frame_pool.HASH_WORDS
    unsampled = int(np.setdiff1d(np.arange(882), sampled)[0])
    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, (84, 84), np.uint8)
    other = base.copy()
    other.reshape(-1)[8 * unsampled] ^= 1
    hashes = frame_pool.frame_hashes(frame_pool.word_view(np.stack([base, other])))
    assert hashes[0] == hashes[1]
    plain, pooled = ReplayBuffer(8, seed=0), ReplayBuffer(8, seed=0, frame_stack_axis=-1)
    for stacks in ([base, other, base, other], [other, other, base, base]):
        obs = np.stack(stacks, -1)[None]
        batch = {"obs": obs, "new_obs": obs[..., ::-1].copy(), "actions": np.zeros(1)}
        plain.add(batch)
        pooled.add(batch)
    assert_same_rows(plain.store.take(np.arange(2)), pooled.store.take(np.arange(2)))
    assert 2 <= pooled.store.num_frames <= 4
    assert_counts_match_the_rows(pooled.store)


# ---- state -------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer])
def test_state_round_trip_mid_run_gives_the_same_next_samples(cls, tmp_path):
    stream = frame_stack_stream(ENVS, 120, n_step=3, stack=STACK, axis=-1, seed=5)
    buffer = cls(150, seed=4, frame_stack_axis=-1)
    for _ in range(60):
        buffer.add(next(stream)[0])
    if cls is PrioritizedReplayBuffer:
        batch = buffer.sample(64)
        buffer.update_priorities(batch["batch_indexes"], np.arange(64) / 7 + 0.1)
    state = save_and_load(buffer.get_state(), tmp_path)
    # only the live frames are saved: ~ the unique bytes, not 2k frames per row
    assert len(state["arrays"]["frames/pool"]) == buffer.store.num_frames <= 1.3 * 150
    assert "columns/obs" not in state["arrays"]
    restored = cls(150, seed=99, frame_stack_axis=-1)
    restored.set_state(state)
    assert restored.store.num_frames == buffer.store.num_frames
    assert restored.nbytes == buffer.nbytes
    for _ in range(60):  # wraps the ring again on both
        batch = next(stream)[0]
        buffer.add(batch)
        restored.add(batch)
        assert_same_rows(buffer.sample(32), restored.sample(32))
    assert_counts_match_the_rows(restored.store)
    mine, theirs = buffer.get_state(), restored.get_state()
    assert mine["meta"] == theirs["meta"]
    for key, value in mine["arrays"].items():
        np.testing.assert_array_equal(theirs["arrays"][key], value, err_msg=key)


def test_states_that_do_not_fit_are_refused_in_one_line_and_change_nothing(tmp_path):
    stream = frame_stack_stream(ENVS, 20, stack=STACK, axis=-1)
    source = ReplayBuffer(60, seed=0, frame_stack_axis=-1)
    plain = ReplayBuffer(60, seed=0)
    for _ in range(10):
        batch = next(stream)[0]
        source.add(batch)
        plain.add(batch)
    (tmp_path / "pooled").mkdir()
    state = save_and_load(source.get_state(), tmp_path / "pooled")
    plain_state = save_and_load(plain.get_state(), tmp_path)
    target = ReplayBuffer(60, seed=0, frame_stack_axis=-1)
    target.add(next(stream)[0])
    before = {k: v.copy() for k, v in target.store.take(np.arange(16)).items()}

    def refused(buffer, bad, match):
        with pytest.raises(ValueError, match=match) as err:
            buffer.set_state(bad)
        assert "\n" not in str(err.value)

    refused(target, plain_state, "written with frame_stack_axis None, this buffer has -1")
    refused(ReplayBuffer(60), state, "written with frame_stack_axis -1, this buffer has None")
    refused(
        ReplayBuffer(60, frame_stack_axis=0),
        state,
        "written with frame_stack_axis -1, this buffer has 0",
    )
    refused(
        target,
        {
            "meta": {k: v for k, v in state["meta"].items() if k != "frame_stack"},
            "arrays": state["arrays"],
        },
        "missing 'frame_stack'",
    )
    ids = state["arrays"]["frames/row_ids"].copy()
    ids[3, 2] = len(state["arrays"]["frames/pool"])
    refused(
        target,
        {"meta": state["meta"], "arrays": dict(state["arrays"], **{"frames/row_ids": ids})},
        r"'frames/row_ids' must lie in \[0, ",
    )
    extra = np.concatenate([state["arrays"]["frames/pool"], state["arrays"]["frames/pool"][:1]])
    meta = dict(
        state["meta"], frame_stack=dict(state["meta"]["frame_stack"], num_frames=len(extra))
    )
    refused(
        target,
        {
            "meta": meta,
            "arrays": dict(
                state["arrays"],
                **{"frames/pool": extra, "frames/indexed": np.ones(len(extra), bool)},
            ),
        },
        f"frame {len(extra) - 1} of 'frames/pool' is used by no row",
    )
    refused(
        target,
        {
            "meta": state["meta"],
            "arrays": {k: v for k, v in state["arrays"].items() if k != "frames/pool"},
        },
        "array 'frames/pool' missing",
    )
    small = ReplayBuffer(60, seed=0, frame_stack_axis=-1)
    small.add({k: v[..., :3] if k in ("obs", "new_obs") else v for k, v in next(stream)[0].items()})
    refused(
        small,
        state,
        r"frame stacks of shape \(6, 6, 4\) dtype uint8, this buffer "
        r"stores \(6, 6, 3\) uint8",
    )
    assert len(target) == 16
    assert_same_rows(before, target.store.take(np.arange(16)))
    target.set_state(state)  # the good state still restores
    assert_same_rows(source.store.take(np.arange(60)), target.store.take(np.arange(60)))


# ---- bad input ---------------------------------------------------------------------------


def test_bad_batches_are_refused_in_one_line_before_anything_is_written():
    stream = frame_stack_stream(ENVS, 3, stack=STACK, axis=-1)
    buffer = PrioritizedReplayBuffer(40, seed=0, frame_stack_axis=-1)
    good = next(stream)[0]

    def refused(batch, match, error=ValueError):
        state = (len(buffer), buffer.store.num_frames, buffer.store.next_index, buffer.tree.total)
        with pytest.raises(error, match=match) as err:
            buffer.add(batch)
        assert "\n" not in str(err.value)
        assert (
            len(buffer),
            buffer.store.num_frames,
            buffer.store.next_index,
            buffer.tree.total,
        ) == state

    flat = dict(good, obs=good["obs"].reshape(16, -1), new_obs=good["new_obs"].reshape(16, -1))
    refused(
        flat,
        r"column 'obs' must have rows of at least 2 dimensions with the stack on "
        r"axis -1, got rows of shape \(144,\)",
    )
    refused(
        dict(good, new_obs=good["new_obs"][:, :, :5]),
        r"column 'new_obs' has rows of shape \(6, 5, 4\) dtype uint8, column 'obs' "
        r"has rows of shape \(6, 6, 4\) dtype uint8",
    )
    refused(
        dict(good, actions=good["actions"][:15]),
        r"column 'obs' has 16 rows, column 'actions' has 15",
    )
    refused({k: v for k, v in good.items() if k != "new_obs"}, "'new_obs' missing", KeyError)
    assert buffer.store.pool is None  # nothing allocated by refused first batches
    buffer.add(good)
    before = buffer.store.take(np.arange(16))
    refused(
        dict(good, obs=good["obs"].astype(np.float32)),
        r"column 'obs' has rows of shape \(6, 6, 4\) dtype float32, the buffer stores "
        r"rows of shape \(6, 6, 4\) dtype uint8",
    )
    refused(dict(good, rewards=good["rewards"].astype(np.float64)), "column 'rewards'")
    refused(dict(good, obs={"a": good["obs"]}), "column 'obs' must be one array of frame stacks")
    with pytest.raises(ValueError, match=r"priorities must have shape \(16,\)"):
        buffer.add(good, priorities=np.ones(3))
    assert_same_rows(before, buffer.store.take(np.arange(16)))
    assert_counts_match_the_rows(buffer.store)


def test_a_pool_that_cannot_grow_fails_the_add_before_anything_is_written(monkeypatch):
    """Growth happens before the columns are written: a MemoryError there leaves the
    rows, frames, ids and ring position as they were, and the next add works."""
    buffer = PrioritizedReplayBuffer(40, seed=0, frame_stack_axis=-1)
    rng = np.random.default_rng(0)

    def random_batch(rows):  # frames that never repeat: every one needs a new slot
        return {
            "obs": rng.integers(0, 256, (rows, 5, 7, 3), np.uint8),
            "new_obs": rng.integers(0, 256, (rows, 5, 7, 3), np.uint8),
            "actions": rng.integers(0, 4, rows),
        }

    buffer.add(random_batch(6))  # 36 of the pool's 48 slots
    before = (
        buffer.store.take(np.arange(6)),
        len(buffer),
        buffer.store.next_index,
        buffer.store.num_frames,
        buffer.tree.total,
    )

    def no_memory(pool, needed):
        raise MemoryError(f"cannot grow the frame pool to {needed} frames")

    monkeypatch.setattr(frame_pool.FramePool, "_grow", no_memory)
    with pytest.raises(MemoryError):
        buffer.add(random_batch(6))
    rows, size, next_index, frames, total = before
    assert_same_rows(rows, buffer.store.take(np.arange(6)))
    assert (len(buffer), buffer.store.next_index, buffer.store.num_frames, buffer.tree.total) == (
        size,
        next_index,
        frames,
        total,
    )
    assert_counts_match_the_rows(buffer.store)
    monkeypatch.undo()
    buffer.add(random_batch(6))
    assert len(buffer) == 12 and buffer.store.num_frames == 72


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="frame_stack_axis must be an int or None, got 'x'"):
        ReplayBuffer(10, frame_stack_axis="x")
    with pytest.raises(ValueError, match="needs 'obs' or 'new_obs' among the columns"):
        ReplayBuffer(10, columns=["actions"], frame_stack_axis=0)
    with pytest.raises(ValueError, match="needs a column besides"):
        ReplayBuffer(10, columns=["obs", "new_obs"], frame_stack_axis=0)


def test_a_batch_longer_than_the_ring_keeps_its_last_rows():
    plain, pooled = ReplayBuffer(30, seed=0), ReplayBuffer(30, seed=0, frame_stack_axis=-1)
    stream = frame_stack_stream(ENVS, 8, stack=STACK, axis=-1, fragment=12)  # 48 rows each
    for batch, _ in stream:
        plain.add(batch)
        pooled.add(batch)
        assert_same_rows(plain.store.take(np.arange(30)), pooled.store.take(np.arange(30)))
    assert plain.store.next_index == pooled.store.next_index
    assert_counts_match_the_rows(pooled.store)

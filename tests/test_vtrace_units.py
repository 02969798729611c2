"""vtrace_units: trajectory chunks as padded units, and V-trace over them equal to
V-trace run on each chunk alone (numpy recursion written here), whatever the
padding, with terminations, truncations and cuts told apart."""

import numpy as np
import pytest
import tensorflow as tf

from policy_service.data.sample_batch import SampleBatch
from policy_service.data.train_batches import TrainColumns
from policy_service.data.units import LOSS_MASK, SEQ_LENS
from policy_service.returns.vtrace_units import last_rows, sequence_units, vtrace_on_units

GAMMA = 0.9


def chunk_vtrace(log_rhos, rewards, terminated, values, bootstrap, rho_bar, pg_rho_bar, lam):
    """One chunk's V-trace by the backward recursion of Espeholt et al. (eq. 1)."""
    rhos = np.exp(log_rhos.astype(np.float64))
    discounts = GAMMA * (1.0 - terminated)
    clipped = np.minimum(rho_bar, rhos) if rho_bar else rhos
    pg_clipped = np.minimum(pg_rho_bar, rhos) if pg_rho_bar else rhos
    next_values = np.append(values[1:], bootstrap)
    deltas = clipped * (rewards + discounts * next_values - values)
    vs_minus_v, later = np.zeros(len(values)), 0.0
    for t in reversed(range(len(values))):
        later = deltas[t] + discounts[t] * lam * min(1.0, rhos[t]) * later
        vs_minus_v[t] = later
    vs = vs_minus_v + values
    next_vs = np.append(vs[1:], bootstrap)
    return vs, pg_clipped * (rewards + discounts * next_vs - values)


# chunk lengths and how each ends: a termination, a truncation, or the fragment's end
CHUNKS = [(5, "terminated"), (2, "truncated"), (7, "fragment end"), (1, "terminated"), (4, "")]


def flat_columns(seed: int = 0) -> TrainColumns:
    """Prepared flat rows of several chunks, each contiguous, with the per-row inputs
    V-trace takes as columns (so the layout pads them alongside)."""
    rng = np.random.default_rng(seed)
    n = sum(length for length, _ in CHUNKS)
    eps_id = np.repeat(np.arange(len(CHUNKS)), [length for length, _ in CHUNKS])
    terminated = np.zeros(n, bool)
    ends = np.cumsum([length for length, _ in CHUNKS]) - 1
    for end, (_, how) in zip(ends, CHUNKS):
        terminated[end] = how == "terminated"
    columns = {
        SampleBatch.EPS_ID: eps_id,
        SampleBatch.UNROLL_ID: np.zeros(n, np.int64),
        SampleBatch.TERMINATEDS: terminated,
        SampleBatch.REWARDS: rng.normal(size=n).astype(np.float32),
        "log_rhos": rng.normal(0, 0.7, n).astype(np.float32),
        "values": rng.normal(size=n).astype(np.float32),
        LOSS_MASK: np.ones(n, bool),
    }
    return TrainColumns(columns, n, 1)


def test_each_chunk_becomes_one_unit_padded_to_the_longest():
    train = sequence_units(flat_columns())
    assert train.units == len(CHUNKS) and train.rows_per_unit == 7
    np.testing.assert_array_equal(train.columns[SEQ_LENS], [5, 2, 7, 1, 4])
    mask = train.columns[LOSS_MASK].reshape(5, 7)
    np.testing.assert_array_equal(mask.sum(axis=1), [5, 2, 7, 1, 4])
    # the rows of a unit are its chunk's rows in order
    eps = train.columns[SampleBatch.EPS_ID].reshape(5, 7)
    assert all((eps[u, :n] == u).all() for u, n in enumerate([5, 2, 7, 1, 4]))
    rows = last_rows({SEQ_LENS: tf.constant(train.columns[SEQ_LENS]), LOSS_MASK: mask.ravel()})
    np.testing.assert_array_equal(rows.numpy(), [4, 8, 20, 21, 31])


def test_a_recurrent_batch_keeps_its_sequences_as_units():
    train = TrainColumns({SEQ_LENS: np.array([2, 1]), LOSS_MASK: np.ones(4, bool)}, 2, 2)
    assert sequence_units(train) is train


def test_chunks_need_their_ids_naming_the_missing_column():
    flat = flat_columns()
    del flat.columns[SampleBatch.UNROLL_ID]
    with pytest.raises(ValueError, match="missing column 'unroll_id'"):
        sequence_units(flat)


@pytest.mark.parametrize("threshold", [None, 1.0, 0.5])
@pytest.mark.parametrize("lam", [1.0, 0.9])
def test_vtrace_on_units_is_vtrace_on_each_chunk_alone(threshold, lam):
    flat = flat_columns(seed=int(10 * (threshold or 3) + 100 * lam))
    train = sequence_units(flat)
    bootstrap = np.random.default_rng(7).normal(size=len(CHUNKS)).astype(np.float32)
    batch = {k: tf.constant(v) for k, v in train.columns.items()}
    out = vtrace_on_units(
        log_rhos=batch["log_rhos"],
        values=batch["values"],
        bootstrap_value=tf.constant(bootstrap),
        train_batch=batch,
        gamma=GAMMA,
        clip_rho_threshold=threshold,
        clip_pg_rho_threshold=threshold,
        lambda_=lam,
    )
    mask = train.columns[LOSS_MASK]
    got_vs, got_adv = out.vs.numpy()[mask], out.pg_advantages.numpy()[mask]
    assert np.isfinite(out.vs.numpy()).all() and np.isfinite(out.pg_advantages.numpy()).all()
    start = 0
    for unit, (length, _) in enumerate(CHUNKS):
        rows = slice(start, start + length)
        c = flat.columns
        vs, adv = chunk_vtrace(
            c["log_rhos"][rows],
            c[SampleBatch.REWARDS][rows],
            c[SampleBatch.TERMINATEDS][rows].astype(np.float64),
            c["values"][rows],
            bootstrap[unit],
            threshold,
            threshold,
            lam,
        )
        np.testing.assert_allclose(got_vs[rows], vs, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got_adv[rows], adv, rtol=1e-5, atol=1e-5)
        start += length


def test_a_termination_ignores_the_bootstrap_and_a_truncation_uses_it():
    train = sequence_units(flat_columns())
    batch = {k: tf.constant(v) for k, v in train.columns.items()}

    def vs_with(bootstrap):
        return vtrace_on_units(
            log_rhos=batch["log_rhos"],
            values=batch["values"],
            bootstrap_value=tf.constant(bootstrap, tf.float32),
            train_batch=batch,
            gamma=GAMMA,
            clip_rho_threshold=1.0,
            clip_pg_rho_threshold=1.0,
        ).vs.numpy()[train.columns[LOSS_MASK]]

    base, moved = vs_with([0.0] * 5), vs_with([5.0] * 5)
    ends = np.cumsum([length for length, _ in CHUNKS]) - 1
    changed = ~np.isclose(base[ends], moved[ends])
    np.testing.assert_array_equal(changed, [how != "terminated" for _, how in CHUNKS])

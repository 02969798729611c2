"""algorithms/impala.py and algorithms/appo.py with an LSTM model, against a reference
built here: the policy's own model run on each sequence alone (unpadded, from that
sequence's recorded state_in), V-trace written out from Espeholt et al. 2018 eq. 1 in
numpy, and the loss terms averaged over the real rows only. The library's loss runs
on the padded batch (and on 2 fake GPUs); padding rows must not count."""

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf
from fakes import assert_grads_close

from algorithms.appo import APPOPolicy
from algorithms.impala import IMPALAPolicy
from policy_service.data.sample_batch import SampleBatch
from policy_service.data.train_batches import TrainColumns
from policy_service.data.units import LOSS_MASK

CELL = 8
MAX_SEQ_LEN = 5
LOSS = {
    "gamma": 0.95,
    "vf_loss_coeff": 0.25,
    "entropy_coeff": 0.05,
    "vtrace_lambda": 0.9,
    "vtrace_clip_rho_threshold": 1.0,
    "vtrace_clip_pg_rho_threshold": 1.5,
}
APPO_LOSS = {"clip_param": 0.2, "use_kl_loss": True, "kl_coeff": 0.3}
# (first row, end row, episode id) of each sequence; episode 0 is cut at max_seq_len
SEQUENCES = [(0, 5, 0), (5, 7, 0), (7, 9, 1), (9, 13, 2), (13, 16, 3)]
TERMINATED_EPISODES = {1}  # its last row terminates: no bootstrap
TRUNCATED_EPISODES = {2}  # its last row truncates: bootstrap, as at the other cuts
ROWS = SEQUENCES[-1][1]
ATOL, RTOL = 1e-5, 1e-4  # float32 model and loss against a float64 reference
DIFFERS = 50 * ATOL  # how far a wrong reference must land from the right one


def policy_config(**overrides):
    model = {
        "fcnet_hiddens": [16],
        "use_lstm": True,
        "lstm_cell_size": CELL,
        "max_seq_len": MAX_SEQ_LEN,
        "lstm_use_prev_action": True,
        "lstm_use_prev_reward": True,
    }
    return {
        "seed": 0,
        "lr": 1e-3,
        "grad_clip": None,  # the reference gradient is the unclipped one
        "rollout_fragment_length": 10,
        "train_batch_size": 40,
        "model": model,
        **LOSS,
        **overrides,
    }


def cartpole_spaces():
    env = gym.make("CartPole-v1")
    spaces = env.observation_space, env.action_space
    env.close()
    return spaces


def random_weights(policy, seed: int) -> dict:
    """Weights far from the near-uniform initial logits, so that the actions'
    log-probabilities (not only the values) depend on the LSTM state."""
    rng = np.random.default_rng(seed)
    return {
        name: rng.normal(0.0, 0.5, value.shape).astype(value.dtype)
        for name, value in policy.get_weights().items()
    }


def make_policy(policy_cls, seed: int = 1, **overrides):
    policy = policy_cls(*cartpole_spaces(), policy_config(**overrides))
    policy.set_weights(random_weights(policy, seed))
    return policy


def lstm_batch(seed: int = 0) -> SampleBatch:
    """Four fragments as an env runner records them: a different state_in on every
    row (the actor's state before that step), prev actions and rewards."""
    rng = np.random.default_rng(seed)
    eps_id = np.zeros(ROWS, np.int64)
    terminateds = np.zeros(ROWS, bool)
    truncateds = np.zeros(ROWS, bool)
    for start, end, eps in SEQUENCES:
        eps_id[start:end] = eps
        terminateds[end - 1] = eps in TERMINATED_EPISODES
        truncateds[end - 1] = eps in TRUNCATED_EPISODES
    actions = rng.integers(0, 2, ROWS)
    return SampleBatch(
        {
            SampleBatch.OBS: rng.uniform(-0.4, 0.4, (ROWS, 4)).astype(np.float32),
            SampleBatch.NEXT_OBS: rng.uniform(-0.4, 0.4, (ROWS, 4)).astype(np.float32),
            SampleBatch.ACTIONS: actions,
            SampleBatch.REWARDS: rng.normal(0.5, 1.0, ROWS).astype(np.float32),
            SampleBatch.TERMINATEDS: terminateds,
            SampleBatch.TRUNCATEDS: truncateds,
            SampleBatch.EPS_ID: eps_id,
            SampleBatch.UNROLL_ID: np.zeros(ROWS, np.int64),
            SampleBatch.ACTION_LOGP: np.log(rng.uniform(0.15, 0.85, ROWS)).astype(np.float32),
            SampleBatch.PREV_ACTIONS: rng.integers(0, 2, ROWS),
            SampleBatch.PREV_REWARDS: rng.normal(0.5, 1.0, ROWS).astype(np.float32),
            "state_in_0": rng.normal(0.0, 1.0, (ROWS, CELL)).astype(np.float32),
            "state_in_1": rng.normal(0.0, 1.0, (ROWS, CELL)).astype(np.float32),
        }
    )


def recorded_states(batch, offset: int = 0) -> list:
    """(h, c) at each sequence's first row (+ offset: a wrong row, for the checks)."""
    return [
        (batch["state_in_0"][start + offset], batch["state_in_1"][start + offset])
        for start, _, _ in SEQUENCES
    ]


# ----- the reference ------------------------------------------------------------------------


def vtrace_eq1(log_rhos, discounts, rewards, values, bootstrap, rho_bar, pg_rho_bar, lambda_):
    """Espeholt et al. 2018 eq. 1 as a sum, not a recursion, in float64:
    v_s = V(x_s) + sum_{t>=s} (prod_{i=s}^{t-1} gamma_i c_i) delta_t,
    delta_t = min(rho_bar, rho_t) (r_t + gamma_t V(x_{t+1}) - V(x_t)),
    c_i = lambda min(1, rho_i), and A_s = min(pg_rho_bar, rho_s) (r_s + gamma_s v_{s+1} - V(x_s))
    with V(x_n) = v_n = bootstrap."""
    rhos = np.exp(np.asarray(log_rhos, np.float64))
    next_values = np.append(values[1:], bootstrap)
    deltas = np.minimum(rho_bar, rhos) * (rewards + discounts * next_values - values)
    traces = lambda_ * np.minimum(1.0, rhos)
    n = len(rewards)
    vs = np.empty(n)
    for s in range(n):
        total, weight = 0.0, 1.0
        for t in range(s, n):
            total += weight * deltas[t]
            weight *= discounts[t] * traces[t]
        vs[s] = values[s] + total
    pg_advantages = np.minimum(pg_rho_bar, rhos) * (
        rewards + discounts * np.append(vs[1:], bootstrap) - values
    )
    return vs, pg_advantages


def test_the_reference_vtrace_on_policy_is_the_n_step_return():
    """Reference check: rho = 1 and lambda = 1 make v_s the discounted return to the
    end plus the discounted bootstrap; a termination cuts it."""
    rewards, values = np.array([1.0, 2.0, 3.0]), np.array([0.5, -1.0, 2.0])
    discounts = np.array([0.9, 0.9, 0.0])
    vs, adv = vtrace_eq1(np.zeros(3), discounts, rewards, values, 7.0, 1.0, 1.0, 1.0)
    np.testing.assert_allclose(vs, [1 + 0.9 * 2 + 0.81 * 3, 2 + 0.9 * 3, 3.0])
    np.testing.assert_allclose(adv, vs - values)
    discounts = np.full(3, 0.9)
    vs, _ = vtrace_eq1(np.zeros(3), discounts, rewards, values, 7.0, 1.0, 1.0, 1.0)
    assert vs[2] == pytest.approx(3 + 0.9 * 7.0)


def sequence_pass(model, batch, start: int, end: int, state):
    """The model on one sequence alone, from `state`, one step past its end (the final
    new_obs, as the actor would have gone on) -> logits [n, A], values [n], bootstrap."""
    last = end - 1
    inputs = {
        SampleBatch.OBS: np.concatenate(
            [batch[SampleBatch.OBS][start:end], batch["new_obs"][last:end]]
        ),
        SampleBatch.PREV_ACTIONS: np.append(
            batch[SampleBatch.PREV_ACTIONS][start:end], batch[SampleBatch.ACTIONS][last]
        ),
        SampleBatch.PREV_REWARDS: np.append(
            batch[SampleBatch.PREV_REWARDS][start:end], batch[SampleBatch.REWARDS][last]
        ).astype(np.float32),
        "state_in_0": state[0][None],
        "state_in_1": state[1][None],
        SampleBatch.SEQ_LENS: np.array([end - start + 1], np.int32),
    }
    out = model({k: tf.constant(v) for k, v in inputs.items()}, training=False)
    n = end - start
    return (
        out[SampleBatch.ACTION_DIST_INPUTS][:n],
        out[SampleBatch.VF_PREDS][:n],
        out[SampleBatch.VF_PREDS][n],
    )


def log_softmax(logits):
    logits = np.asarray(logits, np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def reference(
    policy,
    batch,
    states,
    *,
    target=None,
    trace_through_padding: bool = False,
    rows_in_mean: int | None = None,
    with_gradients: bool = False,
):
    """IMPALA's loss terms (APPO's with `target`, a policy holding the target weights)
    per sequence, each a mean over the real rows -> (terms, gradients or None).

    Wrong variants, to show the comparison would catch them: `trace_through_padding`
    runs V-trace over each sequence padded to max_seq_len (padding as zero value and
    reward, rho 1, discount gamma) before the bootstrap; `rows_in_mean` divides the
    sums by that many rows (the padded count: unmasked padding)."""
    cfg = policy.config
    actions = batch[SampleBatch.ACTIONS]
    with tf.GradientTape() as tape:
        passes = [
            sequence_pass(policy.model, batch, start, end, state)
            for (start, end, _), state in zip(SEQUENCES, states)
        ]
        logits = tf.concat([p[0] for p in passes], 0)
        values = tf.concat([p[1] for p in passes], 0)
        log_probs = log_softmax(logits.numpy())
        logp = log_probs[np.arange(ROWS), actions]
        if target is None:
            rho_logp = logp
        else:
            target_logits = np.concatenate(
                [
                    sequence_pass(target.model, batch, start, end, state)[0].numpy()
                    for (start, end, _), state in zip(SEQUENCES, states)
                ]
            )
            target_log_probs = log_softmax(target_logits)
            rho_logp = target_log_probs[np.arange(ROWS), actions]
        vs, adv = [], []
        for (start, end, _), (_, seq_values, bootstrap) in zip(SEQUENCES, passes):
            rows = slice(start, end)
            terminated = batch[SampleBatch.TERMINATEDS][rows].astype(np.float64)
            args = [
                rho_logp[rows] - batch[SampleBatch.ACTION_LOGP][rows],
                cfg.gamma * (1.0 - terminated),
                batch[SampleBatch.REWARDS][rows].astype(np.float64),
                seq_values.numpy().astype(np.float64),
            ]
            if trace_through_padding:
                pad = MAX_SEQ_LEN - (end - start)
                args = [
                    np.append(a, np.full(pad, fill)) for a, fill in zip(args, [0, cfg.gamma, 0, 0])
                ]
            seq_vs, seq_adv = vtrace_eq1(
                *args,
                float(bootstrap),
                cfg.vtrace_clip_rho_threshold,
                cfg.vtrace_clip_pg_rho_threshold,
                cfg.vtrace_lambda,
            )
            vs.append(seq_vs[: end - start])
            adv.append(seq_adv[: end - start])
        vs, adv = np.concatenate(vs), np.concatenate(adv)
        rows_in_mean = rows_in_mean or ROWS

        def mean(x):
            return tf.reduce_sum(x) / rows_in_mean

        tf_logp = tf.gather(tf.nn.log_softmax(logits), actions, batch_dims=1)
        tf_probs = tf.nn.softmax(logits)
        entropy = mean(-tf.reduce_sum(tf_probs * tf.nn.log_softmax(logits), -1))
        vf_loss = 0.5 * mean(tf.square(tf.constant(vs, tf.float32) - values))
        adv32 = tf.constant(adv, tf.float32)
        terms = {"vf_loss": vf_loss, "entropy": entropy}
        if target is None:
            terms["policy_loss"] = mean(-tf_logp * adv32)
            total = terms["policy_loss"]
        else:
            ratio = tf.exp(tf_logp - tf.constant(rho_logp, tf.float32))
            clipped = tf.clip_by_value(ratio, 1 - cfg.clip_param, 1 + cfg.clip_param)
            terms["policy_loss"] = mean(-tf.minimum(adv32 * ratio, adv32 * clipped))
            target_probs = tf.constant(np.exp(target_log_probs), tf.float32)
            terms["kl"] = mean(
                tf.reduce_sum(
                    target_probs
                    * (tf.constant(target_log_probs, tf.float32) - tf.nn.log_softmax(logits)),
                    -1,
                )
            )
            total = terms["policy_loss"] + (cfg.kl_coeff * terms["kl"] if cfg.use_kl_loss else 0)
        total += cfg.vf_loss_coeff * vf_loss - cfg.entropy_coeff * entropy
    gradients = (
        [g.numpy() for g in tape.gradient(total, policy.model.trainable_variables)]
        if with_gradients
        else None
    )
    terms = {name: float(value) for name, value in terms.items()}
    terms["total_loss"] = float(total)
    # float64 cross-checks of the float32 TF terms: the rows entering each mean
    probs = np.exp(log_probs)
    np.testing.assert_allclose(
        terms["entropy"], -(probs * log_probs).sum() / rows_in_mean, rtol=1e-5
    )
    if target is None:
        np.testing.assert_allclose(
            terms["policy_loss"], (-logp * adv).sum() / rows_in_mean, rtol=1e-4, atol=1e-6
        )
    return terms, gradients


def assert_terms_close(stats: dict, expected: dict) -> None:
    for name, value in expected.items():
        assert stats[name] == pytest.approx(value, rel=RTOL, abs=ATOL), name


def assert_terms_differ(wrong: dict, right: dict, what: str) -> None:
    gap = max(abs(wrong[k] - right[k]) for k in right)
    assert gap > DIFFERS, f"{what}: the reference moves by only {gap:.2e}"


# ----- IMPALA -------------------------------------------------------------------------------


def test_the_batch_is_padded_into_the_sequences_the_reference_takes():
    policy = make_policy(IMPALAPolicy)
    train = policy.train_columns(lstm_batch())
    lengths = [end - start for start, end, _ in SEQUENCES]
    assert train.columns[SampleBatch.SEQ_LENS].tolist() == lengths
    assert train.rows_per_unit == MAX_SEQ_LEN and train.units == len(SEQUENCES)
    assert (~train.columns[LOSS_MASK]).sum() == len(SEQUENCES) * MAX_SEQ_LEN - ROWS > 0


@pytest.mark.parametrize("num_gpus", [0, 2], ids=["one-device", "two-fake-gpus"])
def test_impala_lstm_loss_and_gradient_match_the_per_sequence_reference(num_gpus):
    policy = make_policy(IMPALAPolicy, num_gpus=num_gpus, _fake_gpus=num_gpus > 0)
    assert len(policy.devices) == max(1, num_gpus)
    batch = lstm_batch()
    expected, expected_grads = reference(policy, batch, recorded_states(batch), with_gradients=True)
    gradients, stats = policy.compute_gradients(batch.copy())
    assert stats["valid_rows"] == ROWS
    assert_terms_close(stats, expected)
    assert_grads_close(gradients, expected_grads, atol=1e-5, rtol=1e-4)


def test_the_impala_reference_tells_wrong_states_and_padding_apart():
    """What the comparison above would catch: each wrong variant moves the reference
    by much more than its tolerance."""
    policy = make_policy(IMPALAPolicy)
    batch = lstm_batch()
    right, _ = reference(policy, batch, recorded_states(batch))
    zeros = [(np.zeros(CELL, np.float32),) * 2 for _ in SEQUENCES]
    assert_terms_differ(reference(policy, batch, zeros)[0], right, "zero state_in")
    assert_terms_differ(
        reference(policy, batch, recorded_states(batch, offset=1))[0], right, "state_in of row 2"
    )
    fragment_start = recorded_states(batch)
    fragment_start[1] = fragment_start[0]  # episode 0's second sequence from the fragment's
    assert_terms_differ(
        reference(policy, batch, fragment_start)[0], right, "the fragment's first state_in"
    )
    assert_terms_differ(
        reference(policy, batch, recorded_states(batch), trace_through_padding=True)[0],
        right,
        "V-trace through the padding",
    )
    padded_rows = len(SEQUENCES) * MAX_SEQ_LEN
    unmasked, _ = reference(policy, batch, recorded_states(batch), rows_in_mean=padded_rows)
    assert_terms_differ(unmasked, right, "padding in the means")


# ----- APPO ---------------------------------------------------------------------------------


def make_appo_policy():
    """An APPO policy whose target weights differ from its model's."""
    policy = make_policy(APPOPolicy, seed=1, **APPO_LOSS)
    state = policy.get_state()
    state["target_weights"] = random_weights(policy, seed=2)
    policy.set_state(state)
    target = IMPALAPolicy(*cartpole_spaces(), policy_config())  # holds the target weights
    target.set_weights(dict(zip(target.get_weights(), policy.get_target_weights().values())))
    return policy, target


def test_appo_lstm_loss_and_gradient_match_the_per_sequence_reference():
    policy, target = make_appo_policy()
    batch = lstm_batch()
    states = recorded_states(batch)
    expected, expected_grads = reference(policy, batch, states, target=target, with_gradients=True)
    gradients, stats = policy.compute_gradients(batch.copy())
    assert stats["valid_rows"] == ROWS
    assert_terms_close(stats, expected)
    assert_grads_close(gradients, expected_grads, atol=1e-5, rtol=1e-4)
    zeros = [(np.zeros(CELL, np.float32),) * 2 for _ in SEQUENCES]
    assert_terms_differ(reference(policy, batch, zeros, target=target)[0], expected, "zero state")
    assert_terms_differ(
        reference(policy, batch, states, target=target, trace_through_padding=True)[0],
        expected,
        "V-trace through the padding",
    )


# ----- padding rows contribute nothing ------------------------------------------------------


@pytest.mark.parametrize("policy_cls", [IMPALAPolicy, APPOPolicy])
def test_values_in_padding_rows_change_neither_loss_nor_gradient(policy_cls):
    policy = make_policy(policy_cls)
    train = policy.train_columns(lstm_batch())
    padding = ~train.columns[LOSS_MASK]
    rng = np.random.default_rng(3)
    garbage = dict(train.columns)
    for name, fill in [
        (SampleBatch.OBS, rng.normal(0.0, 5.0, (padding.sum(), 4))),
        (SampleBatch.NEXT_OBS, rng.normal(0.0, 5.0, (padding.sum(), 4))),
        (SampleBatch.ACTIONS, 1),
        (SampleBatch.REWARDS, 50.0),
        (SampleBatch.TERMINATEDS, True),
        (SampleBatch.TRUNCATEDS, True),
        (SampleBatch.ACTION_LOGP, -4.0),
        (SampleBatch.PREV_ACTIONS, 1),
        (SampleBatch.PREV_REWARDS, -30.0),
    ]:
        column = garbage[name].copy()
        column[padding] = fill
        garbage[name] = column
    clean_grads, clean = policy.compute_gradients_on_train_columns(train)
    dirty_grads, dirty = policy.compute_gradients_on_train_columns(
        TrainColumns(garbage, train.units, train.rows_per_unit)
    )
    for name in ("policy_loss", "vf_loss", "entropy", "total_loss"):
        assert dirty[name] == pytest.approx(clean[name], rel=1e-6, abs=1e-7), name
    assert_grads_close(dirty_grads, clean_grads, atol=1e-7, rtol=1e-6)

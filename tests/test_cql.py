"""algorithms/cql.py: the conservative gap and the TD loss against a row-by-row
computation from the model's own pieces, behaviour cloning for the first bc_iters
steps, the lagrangian alpha' following the gap, two fake GPUs taking one device's
step (the draws travel with the rows), and bad config."""

import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf
import yaml
from fakes import assert_grads_close, assert_weights_close, fake_gpus

from algorithms import get_algorithm_class
from algorithms.cql import (
    CQL,
    NORMAL_DRAWS,
    UNIFORM_DRAWS,
    CQLConfig,
    CQLPolicy,
    with_loss_draws,
)
from algorithms.sac import SAC
from policy_service.config import ConfigError, field_docs, from_dict
from policy_service.data.sample_batch import SampleBatch
from policy_service.returns.n_step import BOOTSTRAP_DISCOUNT

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
BOX = gym.spaces.Box(np.float32([-2.0, 0.0]), np.float32([2.0, 1.0]))
MLP = {"fcnet_hiddens": [8], "fcnet_activation": "relu"}
N = 3  # num_actions
TINY = {
    "seed": 0,
    "q_model_config": MLP,
    "policy_model_config": MLP,
    "gamma": 0.9,
    "num_actions": N,
    "temperature": 2.0,
    "min_q_weight": 0.5,
    "bc_iters": 0,
    "train_batch_size": 16,
}


def make(**overrides) -> CQLPolicy:
    return CQLPolicy(OBS, BOX, {**TINY, **overrides})


def logged(n: int, seed: int = 0) -> SampleBatch:
    """n logged rows of one terminated episode, postprocessed, with the loss's draws."""
    rng = np.random.default_rng(seed)
    obs = rng.uniform(-1, 1, (n + 1, 3)).astype(np.float32)
    terminateds = np.zeros(n, bool)
    terminateds[-1] = True
    batch = SampleBatch(
        {
            SampleBatch.OBS: obs[:-1],
            SampleBatch.NEXT_OBS: obs[1:],
            SampleBatch.ACTIONS: rng.uniform(BOX.low, BOX.high, (n, 2)).astype(np.float32),
            SampleBatch.REWARDS: rng.normal(size=n).astype(np.float32),
            SampleBatch.TERMINATEDS: terminateds,
            SampleBatch.TRUNCATEDS: np.zeros(n, bool),
        }
    )
    batch = make().postprocess_trajectory(batch)
    return with_loss_draws(batch, rng, N, 2)


def by_hand(policy: CQLPolicy, batch: SampleBatch) -> tuple[float, float]:
    """(mean over the twin critics of the conservative gap, the summed TD loss), row
    by row from the model's actor, critics, target critics and distribution."""
    model, dist_class, cfg = policy.model, policy.dist_class, policy.config
    log_uniform = -np.log(4.0 * 1.0)  # the box is 4 x 1
    gaps, td = np.zeros(2), np.zeros(2)
    rows = batch.count
    for b in range(rows):
        obs, next_obs = batch[SampleBatch.OBS][b : b + 1], batch[SampleBatch.NEXT_OBS][b : b + 1]
        dist = dist_class(model({SampleBatch.OBS: obs})["action_dist_inputs"])
        next_dist = dist_class(model({SampleBatch.OBS: next_obs})["action_dist_inputs"])

        def draw(d, eps):
            a = d.squash(d.gaussian.mean + d.gaussian.std * eps[None].astype(np.float32))
            return a, float(d.logp(a)[0])

        normal = batch[NORMAL_DRAWS][b]
        next_a, _ = draw(next_dist, normal[1])
        q_next = min(float(q[0]) for q in policy.target_call(model.q_values, next_obs, next_a))
        y = batch[SampleBatch.REWARDS][b] + batch[BOOTSTRAP_DISCOUNT][b] * q_next
        proposals = [
            (BOX.low + (BOX.high - BOX.low) * batch[UNIFORM_DRAWS][b, j], log_uniform)
            for j in range(N)
        ]
        proposals += [draw(next_dist, normal[2 + N + j]) for j in range(N)]
        proposals += [draw(dist, normal[2 + j]) for j in range(N)]
        taken = model.q_values(obs, batch[SampleBatch.ACTIONS][b : b + 1])
        for i in range(2):
            values = [
                float(model.q_values(obs, tf.reshape(tf.cast(a, tf.float32), [1, 2]))[i][0]) - lp
                for a, lp in proposals
            ]
            values = np.asarray(values) / cfg.temperature
            lse = values.max() + np.log(np.exp(values - values.max()).sum())
            gaps[i] += cfg.min_q_weight * (cfg.temperature * lse - float(taken[i][0])) / rows
            td[i] += (float(taken[i][0]) - y) ** 2 / rows
    return float(gaps.mean()), float(td.sum())


def test_the_gap_and_td_loss_match_a_row_by_row_computation():
    policy = make()
    policy.learn_on_batch(logged(8, seed=1))  # the target critics now lag the online ones
    batch = logged(5, seed=2)
    gap, td = by_hand(policy, batch)
    _, stats = policy.compute_gradients(batch)
    np.testing.assert_allclose(stats["cql_gap"], gap, rtol=1e-4)
    np.testing.assert_allclose(stats["td_loss"], td, rtol=1e-4)
    np.testing.assert_allclose(stats["critic_loss"], td + 2 * gap, rtol=1e-4)


def test_bc_iters_steps_clone_the_logged_actions_and_alpha_prime_follows_the_gap():
    policy = make(bc_iters=2, lagrangian=True, lagrangian_thresh=-100.0)
    batch = logged(8, seed=3)
    stats = [policy.learn_on_batch(batch) for _ in range(4)]
    assert [s["bc_actor"] for s in stats] == [1.0, 1.0, 0.0, 0.0]
    # the gap is far above the threshold: alpha' (1 at the start) rises every step
    weights = [s["alpha_prime_value"] for s in stats]
    assert weights[0] == pytest.approx(1.0)
    assert all(b > a for a, b in zip(weights, weights[1:]))


@pytest.mark.slow  # ~20 s on this loaded machine: two policies of four loss groups traced
def test_two_fake_gpus_take_the_gradient_and_step_of_one_device():
    one, two = make(lagrangian=True), make(lagrangian=True, **fake_gpus(2))
    assert two.devices == ["/CPU:0", "/CPU:1"]
    assert_weights_close(one.get_weights(), two.get_weights(), atol=0, rtol=0)
    batch = logged(13, seed=5)  # padded over 2 towers
    g1, s1 = one.compute_gradients(batch)
    g2, s2 = two.compute_gradients(batch)
    for a, b in zip(g1, g2):
        assert_grads_close(a, b)
    assert s2["critic_loss"] == pytest.approx(s1["critic_loss"], rel=1e-5)
    for seed in (6, 7):
        one.learn_on_batch(logged(13, seed=seed))
        two.learn_on_batch(logged(13, seed=seed))
        assert_weights_close(one.get_weights(), two.get_weights())


def test_cql_is_registered_with_rllibs_defaults():
    assert get_algorithm_class("cql") is CQL
    cfg = from_dict(CQLConfig, {})
    assert (cfg.bc_iters, cfg.temperature, cfg.num_actions) == (20000, 1.0, 10)
    assert (cfg.min_q_weight, cfg.lagrangian, cfg.lagrangian_thresh) == (5.0, False, 5.0)
    docs = field_docs(CQLConfig)
    assert all(docs[k] for k in ("bc_iters", "temperature", "num_actions", "min_q_weight"))


@pytest.mark.parametrize("key, value", [("bc_iters", -1), ("temperature", 0.0), ("num_actions", 0)])
def test_bad_cql_keys_are_one_line_errors_naming_them(key, value):
    with pytest.raises(ConfigError, match=key) as err:
        from_dict(CQLConfig, {key: value})
    assert "\n" not in str(err.value)


def test_a_discrete_action_space_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="CQL needs a 1-D float Box") as err:
        CQLPolicy(OBS, gym.spaces.Discrete(3), TINY)
    assert "\n" not in str(err.value)


# ----- learning from a logged SAC run on Pendulum (slow) -----------------------------------

TUNED = Path(__file__).resolve().parents[1] / "algorithms" / "tuned"
SAC_STEPS = 5000  # its first 4000 steps' episodes return about -1200 to -800, the last -200
SMALL = {"fcnet_hiddens": [64, 64], "fcnet_activation": "relu"}
RATES = dict.fromkeys(
    ("actor_learning_rate", "critic_learning_rate", "entropy_learning_rate"), 1e-3
)


@pytest.fixture(scope="module")
def sac_replay(tmp_path_factory):
    """Every step of one SAC run on Pendulum from its start (`output`): mixed quality."""
    directory = tmp_path_factory.mktemp("sac_replay")
    config = yaml.safe_load((TUNED / "pendulum_sac.yaml").read_text())
    config.update(seed=0, output=str(directory), q_model_config=SMALL, policy_model_config=SMALL)
    start = time.perf_counter()
    algo = SAC(config)
    try:
        while algo.train()["timesteps_total"] < SAC_STEPS:
            pass
    finally:
        algo.stop()
    print(f"\nlogged {SAC_STEPS} SAC steps on Pendulum in {time.perf_counter() - start:.0f} s")
    return directory


def pendulum_return(name: str, input: str, iterations: int, **config) -> tuple[float, float]:
    """`name` trained `iterations` times on `input` -> (greedy mean return over 10
    evaluation episodes, seconds)."""
    start = time.perf_counter()
    base = {
        "env": "Pendulum-v1",  # for evaluation only: the rows come from `input`
        "input": input,
        "seed": 0,
        "shuffle_buffer_size": 5000,
        "evaluation_duration": 10,
        "evaluation_config": {"explore": False},
    }
    algo = get_algorithm_class(name)({**base, **config})
    try:
        for _ in range(iterations):
            algo.train()
        return algo.evaluate()["evaluation/episode_return_mean"], time.perf_counter() - start
    finally:
        algo.stop()


# Measured 2026-12-06 (seed 0, the fixture's 5000 steps: SAC's episodes return about
# -1200 to -800 for 4000 steps, then -200; 10 greedy evaluation episodes): BC -1008 after
# 100 iterations; CQL (these keys) -841 after 100 iterations, -171 after 150. With
# pendulum_cql.yaml's num_actions 10, critic rate 1e-3 and tau 0.005: -964 after 150,
# -259 after 300. Wall: 90 s for the fixture (19 s) and both runs at load average 7;
# 374 s (fixture 68 s) at 14-19. The target (>= -300 from one SAC run's first
# 10k steps) is shown by `python -m benchmarks.offline_learning --rounds 3` (BENCHMARKS.md,
# the offline RL row: -232, median of 3 seeds); CI asserts a bar on half the rows that
# only learning reaches (the logged episodes return -1200 to -800 until their last 1000
# steps, BC -1008).
CQL_ITERATIONS = 150  # of 10 SGD steps of 256 rows
CQL_LEARNED = -600
CQL_MARGIN = 200  # over BC on the same rows


@pytest.mark.slow
def test_cql_beats_bc_on_a_logged_sac_run(sac_replay):
    bc_return, bc_s = pendulum_return(
        "bc", str(sac_replay), 100, lr=1e-3, train_batch_size=2560, minibatch_size=256,
        model={"fcnet_hiddens": [64, 64]},
    )  # fmt: skip
    cql_return, cql_s = pendulum_return(
        "cql", str(sac_replay), CQL_ITERATIONS, bc_iters=0, min_q_weight=1.0, num_actions=4,
        tau=0.01, min_sample_timesteps_per_iteration=2560,
        optimization={**RATES, "critic_learning_rate": 3e-3},
        q_model_config=SMALL, policy_model_config=SMALL,
    )  # fmt: skip
    print(f"\nBC {bc_return:.0f} ({bc_s:.0f} s), CQL {cql_return:.0f} ({cql_s:.0f} s)")
    assert cql_return >= CQL_LEARNED
    assert cql_return > bc_return + CQL_MARGIN

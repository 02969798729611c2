"""Off-policy estimation: RLlib's four estimators on logged episodes, at each evaluation
of an offline run (evaluation/off_policy_estimation/<name>/...) and as `policy-service
estimate`. Exact answers on small made-up data here; on CartPole against 1,000 rollouts
of the target in benchmarks/offline_ope.py (the slow test at the end)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from offline_datasets import episodes, write
from offline_runs import OfflinePG, offline_config

from policy_service.data.sample_batch import SampleBatch
from policy_service.offline import OfflineDataError
from policy_service.offline.estimators import Episodes, estimate, logged_episodes

ROOT = Path(__file__).resolve().parent.parent


class FixedPolicy:
    """A target policy pi(1|s) = p1 whatever the state (the estimators' view of a policy)."""

    def __init__(self, p1: float) -> None:
        self.p1 = p1
        self.action_space = gym.spaces.Discrete(2)

        class Flat:
            @staticmethod
            def transform(obs):
                return np.asarray(obs, np.float32)

        self.preprocessor = Flat()

    def is_recurrent(self) -> bool:
        return False

    def compute_log_likelihoods(self, actions, obs):
        return np.log(np.where(np.asarray(actions) == 1, self.p1, 1 - self.p1))


def bandit(n: int, behaviour_p1: float, seed: int = 0) -> Episodes:
    """One-step episodes: action 1 pays 1, action 0 pays 0; mu(1) = behaviour_p1."""
    rng = np.random.default_rng(seed)
    actions = (rng.random(n) < behaviour_p1).astype(np.int64)
    logp = np.log(np.where(actions == 1, behaviour_p1, 1 - behaviour_p1))
    batch = SampleBatch(
        {
            SampleBatch.OBS: np.zeros((n, 1), np.float32),
            SampleBatch.NEXT_OBS: np.zeros((n, 1), np.float32),
            SampleBatch.ACTIONS: actions,
            SampleBatch.REWARDS: actions.astype(np.float32),
            SampleBatch.TERMINATEDS: np.ones(n, bool),
            SampleBatch.EPS_ID: np.arange(n),
            SampleBatch.ACTION_LOGP: logp,
        }
    )
    return Episodes.of(batch, "bandit")


def test_importance_sampling_reweighs_to_the_target():
    data = bandit(20_000, behaviour_p1=0.5)
    out = estimate(
        FixedPolicy(0.8), data, ["ImportanceSampling", "WeightedImportanceSampling"], 0.99
    )
    behaviour = data.batch[SampleBatch.REWARDS].mean()
    assert out["ImportanceSampling"]["v_behavior"] == pytest.approx(behaviour)
    # IS: the mean of (pi/mu) r, unbiased; its variance and standard error are reported
    assert out["ImportanceSampling"]["v_target"] == pytest.approx(0.8, abs=0.02)
    assert out["ImportanceSampling"]["v_target_var"] == pytest.approx(
        np.var(np.where(data.batch[SampleBatch.ACTIONS] == 1, 1.6, 0.0))
    )
    assert out["ImportanceSampling"]["v_target_stderr"] < 0.01
    # WIS normalizes the weights: exactly the weighted mean of the rewards
    ones = data.batch[SampleBatch.ACTIONS].mean()
    exact = ones * 1.6 / (ones * 1.6 + (1 - ones) * 0.4)
    assert out["WeightedImportanceSampling"]["v_target"] == pytest.approx(exact)


def test_on_policy_data_estimates_its_own_value():
    data = bandit(500, behaviour_p1=0.3)
    out = estimate(FixedPolicy(0.3), data, ["ImportanceSampling", "WeightedImportanceSampling"], 1)
    for values in out.values():
        assert values["v_target"] == pytest.approx(values["v_behavior"])
        assert values["v_gain"] == pytest.approx(1.0) and values["v_delta"] == pytest.approx(0)


def corridor(n: int, seed: int = 0) -> Episodes:
    """Each step pays 1; action 1 ends the episode, action 0 goes on (at most 8 steps);
    mu(1) = 0.5. A target that never ends early is worth more than the logged returns."""
    rng = np.random.default_rng(seed)
    columns: dict = {k: [] for k in ("obs", "new_obs", "actions", "rewards", "terminateds",
                                     "eps_id", "t", "action_logp")}  # fmt: skip
    for e in range(n):
        for t in range(8):
            a = int(rng.random() < 0.5)
            for key, value in (("obs", [t]), ("new_obs", [t + 1]), ("actions", a),
                               ("rewards", 1.0), ("terminateds", a == 1 or t == 7),
                               ("eps_id", e), ("t", t), ("action_logp", np.log(0.5))):  # fmt: skip
                columns[key].append(value)
            if a == 1:
                break
    batch = SampleBatch({k: np.asarray(v) for k, v in columns.items()})
    batch[SampleBatch.OBS] = batch[SampleBatch.OBS].astype(np.float32)
    batch[SampleBatch.NEXT_OBS] = batch[SampleBatch.NEXT_OBS].astype(np.float32)
    return Episodes.of(batch, "corridor")


def test_weighted_is_and_doubly_robust_on_episodes_of_many_lengths():
    """pi(1) = 0.2 everywhere: its value is sum over the steps it survives, exactly
    computable; the behaviour (0.5) ends sooner. WIS normalizes over every episode
    (an ended one with its last weight), DR with a fitted Q model."""
    gamma, p_end = 0.9, 0.2
    truth = sum(gamma**t * (1 - p_end) ** t for t in range(8))
    data = corridor(4000)
    methods = {
        "wis": {"type": "WeightedImportanceSampling"},
        "dr": {"type": "DoublyRobust", "q_model_config": {"n_iters": 150, "hiddens": [32]}},
        "dm": {"type": "DirectMethod", "q_model_config": {"n_iters": 150, "hiddens": [32]}},
    }
    out = estimate(FixedPolicy(p_end), data, methods, gamma)
    assert out["wis"]["v_behavior"] < 0.75 * truth  # the logged returns are no estimate
    for name in ("wis", "dr", "dm"):
        assert out[name]["v_target"] == pytest.approx(truth, rel=0.1), (name, out[name], truth)
    assert out["dr"]["fit_time_s"] > 0 and "q_loss" in out["dm"]


def test_a_q_model_needs_discrete_actions():
    data = bandit(10, 0.5)
    policy = FixedPolicy(0.5)
    policy.action_space = gym.spaces.Box(-1, 1, (1,))
    with pytest.raises(OfflineDataError, match=r"^off_policy_estimation_methods.dm: DirectMethod"):
        estimate(policy, data, {"dm": {"type": "DirectMethod"}}, 0.9)


def test_a_missing_behaviour_logp_is_one_line(tmp_path):
    batch = episodes(3)
    del batch[SampleBatch.ACTION_LOGP]
    write(tmp_path, [batch])
    with pytest.raises(OfflineDataError) as err:
        logged_episodes(tmp_path, {"wis": {"type": "WeightedImportanceSampling"}})
    assert "\n" not in str(err.value)
    assert str(err.value).endswith("column 'action_logp' missing (required)")
    assert ".parquet" in str(err.value)
    # the direct method needs none
    assert logged_episodes(tmp_path, {"dm": {"type": "DirectMethod"}}).num_episodes == 3


def test_each_evaluation_of_an_offline_run_estimates_on_held_out_episodes(tmp_path):
    write(tmp_path, [episodes(30, seed=s) for s in range(2)])
    small_q = {"n_iters": 5, "hiddens": [8]}
    algo = OfflinePG(
        offline_config(
            tmp_path,
            postprocess_inputs=True,
            evaluation_interval=1,
            off_policy_estimation_methods={
                "is": {"type": "ImportanceSampling"},
                "wis": {"type": "WeightedImportanceSampling"},
                "dr": {"type": "DoublyRobust", "q_model_config": small_q},
            },
            off_policy_estimation_held_out=0.25,
        )
    )
    try:
        result = algo.train()
    finally:
        algo.stop()
    prefix = "evaluation/off_policy_estimation/"
    for name in ("is", "wis", "dr"):
        assert np.isfinite(result[f"{prefix}{name}/v_target"])
        assert result[f"{prefix}{name}/v_behavior"] == pytest.approx(
            sum(0.99**t for t in range(20))
        )  # 20 steps paying 1 each
    held = result[f"{prefix}is/num_episodes"]
    assert 0 < held < 60
    assert "evaluation/episode_return_mean" not in result  # no env: nothing played


@pytest.mark.slow  # ~10 s: a PPO run from logged rows, then the command in a process
def test_the_estimate_command(tmp_path):
    from policy_service.cli.commands import main

    data = write(tmp_path / "data", [episodes(10, seed=s) for s in range(2)])
    run = tmp_path / "run"
    assert (
        main(
            ["train", "ppo", "--input", str(data), "--stop-iters", "1", "--output-dir", str(run)]
            + ["--set", "train_batch_size=100", "--set", "minibatch_size=50"]
            + ["--set", "postprocess_inputs=true", "--set", "model.fcnet_hiddens=[8]"]
        )
        == 0
    )
    done = subprocess.run(
        [sys.executable, "-m", "policy_service.cli.commands", "estimate", str(run)]
        + ["--input", str(data), "--methods", "is,wis"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["episodes"] == 20 and report["steps"] == 400
    assert set(report["estimates"]) == {"is", "wis"}
    assert report["estimates"]["is"]["v_target_var"] >= 0
    bad = subprocess.run(
        [sys.executable, "-m", "policy_service.cli.commands", "estimate", str(run)]
        + ["--input", str(tmp_path / "none")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1] == (
        f"policy-service: error: --input {tmp_path / 'none'}: no such file or directory"
    )


@pytest.mark.slow  # ~2 min: PPO's target, 50k behaviour steps, 1,000 rollouts, the Q fit
def test_on_cartpole_wis_and_dr_are_within_15_percent_of_1000_rollouts():
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "offline_ope.py")],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["steps"] >= 50_000
    for name in ("wis", "dr"):
        assert abs(report["estimates"][name]["relative_error"]) <= 0.15, report
    # the behaviour's own value is far off: the estimators did the work
    assert abs(report["v_behavior"] - report["true_value"]) / report["true_value"] > 0.15

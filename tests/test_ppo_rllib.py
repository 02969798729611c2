"""PPO's loss and postprocessing against RLlib 2.60's old-stack TF PPO, at its defaults.

RLlib's PPOTF1Policy runs in its own virtualenv behind tests/rllib_ppo_oracle.py
(benchmark_runs.peer_venv builds it once per machine). Both policies get
RLlib's default model shape ([256, 256] tanh, separate value branch) and the same
weights (ours, renamed to RLlib's variables), then see the same batches: the loss
terms, the gradients of the total loss, GAE advantages and value targets (bootstrapped
and terminated), standardized advantages and the KL coefficient schedule must agree.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from algorithms.ppo import PPOPolicy, standardize_advantages
from policy_service.data.sample_batch import SampleBatch
from policy_service.policy.models import weight_names

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark_runs import peer_venv
from rllib_wire import Oracle

pytestmark = [pytest.mark.rllib, pytest.mark.slow]  # builds RLlib's venv once

REPO = Path(__file__).resolve().parent.parent
MODEL = {"fcnet_hiddens": [256, 256], "fcnet_activation": "tanh"}
OBS_SHAPE, NUM_ACTIONS = (4,), 2
# float32 sums in a different order (TF1 graph vs TF2 function); independent of sizes
RTOL, ATOL = 1e-4, 1e-6


class PPOOracle(Oracle):
    """tests/rllib_ppo_oracle.py: RLlib's TF PPO policy, asked op by op."""

    def __init__(self, python: str, env: dict):
        super().__init__(python, REPO / "tests" / "rllib_ppo_oracle.py", env)

    def call(self, op: str, **request):
        return self.ask({"op": op, **request})


def rllib_name(our_name: str) -> str:
    """Our weight path -> RLlib's FullyConnectedNetwork variable name (tf_keras):
    policy_dense_i -> fc_{i+1}, value_dense_i -> fc_value_{i+1},
    action_dist_inputs -> fc_out, vf -> value_out."""
    layer, var = our_name.split("/")[-2:]
    hidden = re.fullmatch(r"(policy|value)_dense_(\d+)", layer)
    if hidden:
        prefix = "fc" if hidden.group(1) == "policy" else "fc_value"
        return f"{prefix}_{int(hidden.group(2)) + 1}/{var}"
    return {"action_dist_inputs": "fc_out", "vf": "value_out"}[layer] + f"/{var}"


@pytest.fixture(scope="module")
def rllib():
    from benchmarks.harness import child_env
    from benchmarks.rllib_env import RLLIB_ENV, ensure_rllib_venv

    given = os.environ.get("RLLIB_VENV")
    python = ensure_rllib_venv(Path(given)) if given else peer_venv(".venv-rllib")
    oracle = PPOOracle(python, child_env(RLLIB_ENV))
    yield oracle
    oracle.close()


@pytest.fixture(scope="module")
def pair(rllib):
    """(our PPOPolicy at RLlib's defaults, the oracle holding RLlib's with our weights)."""
    obs_space = gym.spaces.Box(-np.inf, np.inf, OBS_SHAPE, np.float32)
    ours = PPOPolicy(obs_space, gym.spaces.Discrete(NUM_ACTIONS), {"model": MODEL, "seed": 0})
    build_rllib_like(ours, rllib)
    return ours, rllib


def build_rllib_like(ours: PPOPolicy, rllib: PPOOracle) -> None:
    """A fresh RLlib policy (KL coefficient at its default) holding our weights."""
    shapes = rllib.call("build", model=MODEL, obs_shape=list(OBS_SHAPE), num_actions=NUM_ACTIONS)
    weights = {rllib_name(k): v for k, v in ours.get_weights().items()}
    assert {k: list(v.shape) for k, v in weights.items()} == shapes
    rllib.call("set_weights", weights=weights)


def loss_batch(rng: np.random.Generator, rows: int) -> dict:
    """A PPO train batch whose value errors fall on both sides of vf_clip_param's
    sqrt(10) and whose old logits differ from the model's (KL > 0)."""
    batch = trajectory(rng, rows, terminated=False)
    logits = rng.normal(0, 0.5, (rows, NUM_ACTIONS)).astype(np.float32)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return dict(
        batch,
        action_dist_inputs=logits,
        action_logp=logp[np.arange(rows), batch["actions"]].astype(np.float32),
        action_prob=np.exp(logp[np.arange(rows), batch["actions"]]).astype(np.float32),
        advantages=rng.normal(0, 1, rows).astype(np.float32),
        value_targets=rng.normal(0, 4, rows).astype(np.float32),
    )


def assert_losses_match(ours: PPOPolicy, rllib: PPOOracle, batch: dict) -> dict:
    grads, info = ours.compute_gradients(SampleBatch({k: v.copy() for k, v in batch.items()}))
    theirs = rllib.call("loss", batch=batch)
    for ours_key, rllib_key in (
        ("policy_loss", "policy_loss"),
        ("vf_loss", "vf_loss"),
        ("kl", "kl"),
        ("entropy", "entropy"),
        ("kl_coeff", "cur_kl_coeff"),
        ("vf_explained_var", "vf_explained_var"),
    ):
        np.testing.assert_allclose(
            info[ours_key], theirs["stats"][rllib_key], rtol=RTOL, atol=ATOL, err_msg=ours_key
        )
    names = [rllib_name(n) for n in weight_names(ours.model, ours.model.trainable_variables)]
    assert sorted(names) == sorted(theirs["grads"])
    for name, grad in zip(names, grads):
        scale = float(np.abs(theirs["grads"][name]).max())
        np.testing.assert_allclose(
            np.asarray(grad),
            theirs["grads"][name],
            rtol=RTOL,
            atol=ATOL + RTOL * scale,
            err_msg=name,
        )
    return info


def test_loss_terms_and_gradients_match_rllib(pair):
    ours, rllib = pair
    rng = np.random.default_rng(0)
    info = assert_losses_match(ours, rllib, loss_batch(rng, 512))
    assert info["kl"] > 1e-3 and 0.0 < info["vf_loss"] < 10.0  # the terms are exercised
    # a changed KL coefficient weighs the KL term the same way on both sides
    for sampled_kl in (0.05, 0.05):
        assert ours.update_kl(sampled_kl) == pytest.approx(
            rllib.call("update_kl", kls=[sampled_kl])[0], rel=1e-6
        )
    assert_losses_match(ours, rllib, loss_batch(rng, 200))
    for sampled_kl in (0.001, 0.001):  # back to 0.2 on both sides
        ours.update_kl(sampled_kl)
        rllib.call("update_kl", kls=[sampled_kl])


def test_kl_coefficient_schedule_matches_rllib(pair):
    ours, rllib = pair
    kls = [0.03, 0.021, 0.019, 0.004, 0.0049, 0.006, 0.5, 0.0]
    start = ours.get_state()["kl_coeff"]
    expected = rllib.call("update_kl", kls=kls)
    np.testing.assert_allclose([ours.update_kl(kl) for kl in kls], expected, rtol=1e-6)
    assert len(set(np.round(expected, 6))) > 3  # it rose, held and fell
    ours.set_state({**ours.get_state(), "kl_coeff": start})  # both back at the default
    build_rllib_like(ours, rllib)


def trajectory(rng: np.random.Generator, steps: int, terminated: bool) -> dict:
    """One episode chunk with every column RLlib's view requirements read."""
    obs = rng.normal(0, 1, (steps + 1,) + OBS_SHAPE).astype(np.float32)
    done = np.zeros(steps, bool)
    done[-1] = terminated
    return {
        "obs": obs[:-1],
        "new_obs": obs[1:],
        "actions": rng.integers(0, NUM_ACTIONS, steps),
        "prev_actions": np.zeros(steps, np.int64),
        "rewards": rng.uniform(0, 2, steps).astype(np.float32),
        "prev_rewards": np.zeros(steps, np.float32),
        "terminateds": done,
        "truncateds": np.zeros(steps, bool),
        "eps_id": np.full(steps, 7, np.int64),
        "unroll_id": np.zeros(steps, np.int64),
        "agent_index": np.zeros(steps, np.int64),
        "t": np.arange(steps),
        "vf_preds": rng.normal(0, 1, steps).astype(np.float32),
        "action_dist_inputs": rng.normal(0, 0.1, (steps, NUM_ACTIONS)).astype(np.float32),
        "action_logp": np.full(steps, -0.69, np.float32),
        "action_prob": np.full(steps, 0.5, np.float32),
    }


@pytest.mark.parametrize("terminated", [False, True], ids=["bootstrapped", "terminated"])
def test_advantages_and_value_targets_match_rllib(pair, terminated):
    ours, rllib = pair
    batch = trajectory(np.random.default_rng(1), 57, terminated)
    theirs = rllib.call("postprocess", batch=batch)
    mine = ours.postprocess_trajectory(SampleBatch({k: v.copy() for k, v in batch.items()}))
    for key in ("advantages", "value_targets"):
        np.testing.assert_allclose(mine[key], theirs[key], rtol=RTOL, atol=1e-5, err_msg=key)


def test_standardized_advantages_match_rllib(rllib):
    rng = np.random.default_rng(2)
    for adv in (rng.normal(3, 5, 4000), np.full(10, 2.5), rng.normal(0, 1e-6, 33)):
        batch = {"advantages": adv.astype(np.float32)}
        mine = standardize_advantages(SampleBatch({"advantages": adv.astype(np.float32)}))
        np.testing.assert_allclose(
            mine["advantages"], rllib.call("standardize", batch=batch), rtol=RTOL, atol=1e-5
        )

"""The worked examples under examples/ run as a user would run them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from examples import custom_recurrent_policy as example
from policy_service.data.sample_batch import SampleBatch


def test_custom_recurrent_policy_example_trains():
    history = example.main(["--iterations", "2", "--train-batch-size", "400"])
    assert [m["iteration"] for m in history] == [1, 2]
    assert history[-1]["timesteps_total"] >= 800
    for metrics in history:
        for key in ("pg_loss", "vf_loss", "entropy"):
            assert math.isfinite(metrics[key]), (key, metrics[key])
    assert 0.0 < history[-1]["entropy"] <= math.log(2) + 1e-6


def test_ported_model_carries_its_state_between_calls():
    """The ported LSTM acts on one step at a time with the state it returned, and
    trains on padded sequences with the same outputs on the valid rows."""
    import gymnasium as gym

    space = gym.spaces.Box(-1, 1, (2,), np.float32)
    model = example.MemoryLSTM(
        space, gym.spaces.Discrete(2), 2, {"custom_model_config": {"cell_size": 8}}
    )
    obs = np.random.default_rng(0).uniform(-1, 1, (5, 2)).astype(np.float32)
    state = [s[None] for s in model.get_initial_state()]
    stepwise = []
    for t in range(5):  # acting: one row per sequence
        out = model(
            {
                "obs": obs[t : t + 1],
                "seq_lens": np.array([1], np.int32),
                "state_in_0": state[0],
                "state_in_1": state[1],
            }
        )
        stepwise.append(out[SampleBatch.ACTION_DIST_INPUTS].numpy()[0])
        state = [s.numpy() for s in out["state_out"]]
    padded = np.concatenate([obs, np.zeros((3, 2), np.float32)])  # one sequence, T = 8
    zeros = [s[None] for s in model.get_initial_state()]
    out = model(
        {
            "obs": padded,
            "seq_lens": np.array([5], np.int32),
            "state_in_0": zeros[0],
            "state_in_1": zeros[1],
        }
    )
    np.testing.assert_allclose(
        out[SampleBatch.ACTION_DIST_INPUTS].numpy()[:5], np.stack(stepwise), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(out["state_out"][0].numpy(), state[0], rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # PPO to 450 on CartPole: ~50k env steps, ~40 s here
def test_an_rllib_script_with_only_its_imports_changed_trains_ppo_to_450(tmp_path):
    from examples import rllib_style_ppo

    result = rllib_style_ppo.main(["--checkpoint-dir", str(tmp_path / "checkpoint")])
    assert result["env_runners"]["episode_return_mean"] >= 450
    assert result["num_env_steps_sampled_lifetime"] < 300_000
    assert (tmp_path / "checkpoint" / "algorithm_state.json").exists()

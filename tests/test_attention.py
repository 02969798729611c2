"""attention.py: RLlib's use_attention (GTrXL) keys, acting step by step equal to the
padded training forward pass, towers equal to one device, and a sampled fragment
training it."""

import numpy as np
import pytest
import tensorflow as tf
from fakes import (
    ACTION_SPACE,
    OBS_SPACE,
    PGPolicy,
    ReturnsPGPolicy,
    assert_grads_close,
    fake_gpus,
    small_config,
)

from policy_service.config import ConfigError
from policy_service.data.sample_batch import SampleBatch
from policy_service.distributed.rollout_worker import RolloutWorker
from policy_service.policy.attention import GTrXLModel
from policy_service.policy.policy_config import ModelConfig

MEMORY, DIM = 3, 8
ATTENTION = {
    "use_attention": True,
    "attention_dim": DIM,
    "attention_num_heads": 2,
    "attention_head_dim": 4,
    "attention_position_wise_mlp_dim": 8,
    "attention_num_transformer_units": 2,
    "attention_memory_inference": MEMORY,
    "attention_memory_training": MEMORY,
    "max_seq_len": 5,
}


def attention_policy(**config):
    model = {**ATTENTION, **config.pop("model", {})}
    return PGPolicy(OBS_SPACE, ACTION_SPACE, small_config(model=model, **config))


def test_rllibs_attention_defaults():
    config = ModelConfig()
    assert (config.use_attention, config.attention_num_transformer_units) == (False, 1)
    assert (config.attention_dim, config.attention_num_heads, config.attention_head_dim) == (
        64,
        1,
        32,
    )
    assert config.attention_memory_inference == config.attention_memory_training == 50
    assert config.attention_position_wise_mlp_dim == 32
    assert config.attention_init_gru_gate_bias == 2.0
    assert config.attention_use_n_prev_actions == config.attention_use_n_prev_rewards == 0


@pytest.mark.parametrize(
    "model, message",
    [
        ({"use_lstm": True}, "config.model.use_attention and use_lstm are two memories"),
        ({"attention_use_n_prev_actions": 2}, "attention_use_n_prev_actions must be 0 or 1"),
        ({"attention_memory_training": 4}, "attention_memory_training must be <= attention_m"),
    ],
)
def test_attention_keys_out_of_range_are_one_line(model, message):
    with pytest.raises(ConfigError) as err:
        attention_policy(model=model)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_state_is_each_units_memory_window():
    policy = attention_policy()
    assert isinstance(policy.model, GTrXLModel)
    assert [s.shape for s in policy.get_initial_state()] == [(MEMORY * DIM,)] * 2
    obs = np.random.default_rng(0).uniform(-1, 1, (4, 4)).astype(np.float32)
    _, state, _ = policy.compute_actions(obs)
    assert [s.shape for s in state] == [(4, MEMORY * DIM)] * 2
    # the window moved by one: the old last two entries (zeros) first, a new input last
    window = state[0].reshape(4, MEMORY, DIM)
    assert not window[:, :-1].any() and window[:, -1].any()


@pytest.mark.parametrize("prev", [False, True])
def test_padded_sequences_equal_acting_step_by_step(prev):
    """Sequences longer than the memory: training's forward pass (training=False) gives
    the outputs and final memory that acting one step at a time gives."""
    uses = {"attention_use_n_prev_actions": int(prev), "attention_use_n_prev_rewards": int(prev)}
    policy = attention_policy(model=uses)
    rng = np.random.default_rng(1)
    seq_lens, steps = [5, 2, 4], 5
    obs = rng.uniform(-1, 1, (3, steps, 4)).astype(np.float32)
    prev_actions = rng.integers(0, 3, (3, steps))
    prev_rewards = rng.normal(size=(3, steps)).astype(np.float32)
    memories = [rng.normal(size=(3, MEMORY * DIM)).astype(np.float32) for _ in range(2)]
    valid = (np.arange(steps)[None, :] < np.asarray(seq_lens)[:, None]).reshape(-1)
    out = policy.model(
        {
            "obs": tf.constant(obs.reshape(-1, 4) * valid[:, None]),
            "prev_actions": tf.constant(prev_actions.reshape(-1) * valid),
            "prev_rewards": tf.constant(prev_rewards.reshape(-1) * valid),
            "state_in_0": tf.constant(memories[0]),
            "state_in_1": tf.constant(memories[1]),
            "seq_lens": tf.constant(seq_lens, tf.int32),
        },
        training=False,
    )
    logits = out["action_dist_inputs"].numpy().reshape(3, steps, 3)
    for i, length in enumerate(seq_lens):
        state = [m[i : i + 1] for m in memories]
        for t in range(length):
            _, state, extra = policy.compute_actions(
                obs[i, t : t + 1],
                state,
                prev_actions[i, t : t + 1],
                prev_rewards[i, t : t + 1],
                explore=False,
            )
            np.testing.assert_allclose(
                extra["action_dist_inputs"][0], logits[i, t], rtol=1e-4, atol=1e-5
            )
        for unit in range(2):
            np.testing.assert_allclose(
                state[unit][0], out["state_out"][unit].numpy()[i], rtol=1e-4, atol=1e-5
            )


def attention_batch(episode_lengths, seed=0):
    """Rows of several episodes with the memory each row was acted with (state_in_*)."""
    rng = np.random.default_rng(seed)
    n = sum(episode_lengths)
    batch = SampleBatch(
        {
            SampleBatch.OBS: rng.uniform(-1, 1, (n, 4)).astype(np.float32),
            SampleBatch.ACTIONS: rng.integers(0, 3, n),
            SampleBatch.ADVANTAGES: rng.normal(size=n).astype(np.float32),
            SampleBatch.VALUE_TARGETS: rng.normal(size=n).astype(np.float32),
            SampleBatch.EPS_ID: np.repeat(np.arange(len(episode_lengths)), episode_lengths),
        }
    )
    for unit in range(2):
        batch[f"state_in_{unit}"] = rng.normal(size=(n, MEMORY * DIM)).astype(np.float32)
    return batch


@pytest.mark.slow  # two attention policies traced on their towers: ~10 s (48 s at load 35)
def test_gradient_on_two_fake_gpus_equals_one_device():
    one = attention_policy()
    two = attention_policy(**fake_gpus(2))
    batch = attention_batch([7, 3, 1, 6])  # uneven episodes cut at 5
    g1, s1 = one.compute_gradients(batch)
    g2, s2 = two.compute_gradients(batch)
    assert s1["valid_rows"] == s2["valid_rows"] == 17
    assert_grads_close(g1, g2)


@pytest.mark.slow  # 200 steps through the GTrXL and a step on them: ~10 s
def test_a_sampled_fragment_trains_the_transformer_units():
    """Acting in a real env carries each episode's memory, and a step on the fragment
    (chopped and padded by the policy) moves the units. PPO learning with attention:
    test_attention_learning.py."""
    config = {"seed": 1, "model": {"fcnet_hiddens": [16], **ATTENTION, "max_seq_len": 10}}
    worker = RolloutWorker("CartPole-v1", ReturnsPGPolicy, config, seed=1)
    try:
        batch, _ = worker.sample()
        policy = worker.policy
        before = policy.get_weights()
        stats = policy.learn_on_batch(batch)
        assert np.isfinite(stats["total_loss"]) and stats["valid_rows"] == batch.count == 200
        after = policy.get_weights()
        moved = [
            k
            for k in after
            if "transformer_unit_1" in k and not np.array_equal(before[k], after[k])
        ]
        assert moved
    finally:
        worker.stop()

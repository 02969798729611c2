"""Tiny environments and a tiny policy shared by the service and rollout tests.

`ScriptedEpisodesEnv` has episode boundaries the test controls, and its
observations say where they come from, so a test can check every recorded
transition against the episode it belongs to.

This module imports no TensorFlow at the top: async vector envs import it in
fresh subprocesses to build envs. The test policies (`PGPolicy`,
`FaultyPolicy`) are built on first access.

Ray workers cannot import this module by name (pytest puts tests/ on the
path only in its own process), so tests register it with
`ray.cloudpickle.register_pickle_by_value` before sending its classes.
"""
from __future__ import annotations

import time

import gymnasium as gym
import numpy as np

OBS_HIGH = 1000.0


class ScriptedEpisodesEnv(gym.Env):
    """Episodes of scripted lengths and endings; obs = [episode number, t, tag].

    config:
      lengths: episode lengths, cycled (episode k has lengths[k % len]).
      endings: "terminated" or "truncated" per episode, cycled.
      tag: a number copied into every observation (to tell envs apart).
      bad_obs_at_step: on this step of the env's life (counting from 1), the
        observation is out of bounds (-1 in every entry).
      step_sleep_s: sleep in every step (a slow env).
    Reward of the step from t to t+1 is t + 1, so an episode of length L
    returns L(L+1)/2.
    """

    metadata = {"render_modes": ()}

    def __init__(self, config: dict | None = None):
        config = dict(config or {})
        self.lengths = list(config.get("lengths", [5]))
        self.endings = list(config.get("endings", ["terminated"]))
        self.tag = float(config.get("tag", 0.0))
        self.bad_obs_at_step = config.get("bad_obs_at_step")
        self.step_sleep_s = float(config.get("step_sleep_s", 0.0))
        self.observation_space = gym.spaces.Box(0.0, OBS_HIGH, (3,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.episode = -1
        self.t = 0
        self.total_steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode += 1
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        if self.step_sleep_s:
            time.sleep(self.step_sleep_s)
        assert self.action_space.contains(np.int64(action)), action
        self.t += 1
        self.total_steps += 1
        length = self.lengths[self.episode % len(self.lengths)]
        ending = self.endings[self.episode % len(self.endings)]
        done = self.t >= length
        obs = self._obs()
        if self.bad_obs_at_step is not None and self.total_steps == self.bad_obs_at_step:
            obs = np.full(3, -1.0, np.float32)
        return (obs, float(self.t), done and ending == "terminated",
                done and ending == "truncated", {})

    def _obs(self):
        return np.array([self.episode, self.t, self.tag], np.float32)


class ContinuousEnv(gym.Env):
    """Box(-1, 1) actions; the observation echoes the last action *as received*."""

    def __init__(self, config: dict | None = None):
        config = dict(config or {})
        self.length = int(config.get("length", 4))
        self.observation_space = gym.spaces.Box(-10.0, 10.0, (2,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        obs = np.asarray(action, np.float32).reshape(2)
        return obs, 0.0, self.t >= self.length, False, {}


class BrokenEnvWorker:
    """Stands in for a rollout worker whose env raises in sample() (a bug, not a death)."""

    def sample(self):
        raise ValueError("env 'Broken' returned an observation outside its observation space")

    def stop(self):
        pass


# ----- tiny policies (TensorFlow loaded on first use) ----------------------------------

_POLICIES: dict = {}


def __getattr__(name):
    if name in ("PGPolicy", "FaultyPolicy", "POISON"):
        if not _POLICIES:
            _POLICIES.update(_build_policies())
        return _POLICIES[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _build_policies() -> dict:
    from policy_service import TFPolicy, masked_mean
    from policy_service.sample_batch import SampleBatch

    class PGPolicy(TFPolicy):
        """Policy gradient on discounted returns; postprocessing bootstraps unfinished chunks.

        Adds "value_targets" (discounted return-to-go, plus gamma^k * V(last new_obs)
        unless the chunk's last row is terminated), "advantages" and, for tests,
        "bootstrap_value" (the V used, 0 when terminated).
        """

        def loss(self, model, dist_class, train_batch):
            out = model(train_batch, training=True)
            logp = dist_class(out[SampleBatch.ACTION_DIST_INPUTS]).logp(
                train_batch[SampleBatch.ACTIONS])
            return -masked_mean(logp * train_batch[SampleBatch.ADVANTAGES],
                                train_batch["loss_mask"])

        def postprocess_trajectory(self, batch, other_agent_batches=None, episode=None):
            batch = batch.copy(shallow=True)
            gamma = self.config.gamma
            bootstrap = 0.0
            if not bool(batch[SampleBatch.TERMINATEDS][-1]):
                states = [batch[f"state_out_{i}"][-1:] for i in range(self.num_state_tensors())]
                _, _, extra = self.compute_actions(
                    batch[SampleBatch.NEXT_OBS][-1:], states or None,
                    batch[SampleBatch.ACTIONS][-1:], batch[SampleBatch.REWARDS][-1:],
                    explore=False)
                bootstrap = float(extra[SampleBatch.VF_PREDS][0])
            rewards = np.asarray(batch[SampleBatch.REWARDS], np.float64)
            targets = np.zeros(len(rewards), np.float32)
            running = bootstrap
            for i in reversed(range(len(rewards))):
                running = rewards[i] + gamma * running
                targets[i] = running
            batch[SampleBatch.VALUE_TARGETS] = targets
            batch[SampleBatch.ADVANTAGES] = targets - batch[SampleBatch.VF_PREDS]
            batch["bootstrap_value"] = np.full(len(rewards), bootstrap, np.float32)
            return batch

    poison = 666.0

    class FaultyPolicy(PGPolicy):
        """Fails a whole forward pass when any observation holds POISON (a bug that
        request validation cannot catch)."""

        def compute_actions(self, obs_batch, *args, **kwargs):
            if np.any(np.asarray(obs_batch) == poison):
                raise RuntimeError("poisoned observation in this forward pass")
            return super().compute_actions(obs_batch, *args, **kwargs)

    for cls in (PGPolicy, FaultyPolicy):
        cls.__module__, cls.__qualname__ = __name__, cls.__name__
    return {"PGPolicy": PGPolicy, "FaultyPolicy": FaultyPolicy, "POISON": poison}

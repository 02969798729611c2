"""Tiny environments shared by the service and rollout tests.

`ScriptedEpisodesEnv` has episode boundaries the test controls, and its
observations say where they come from, so a test can check every recorded
transition against the episode it belongs to.

This module imports no TensorFlow: async vector envs import it in fresh
subprocesses to build envs. The test policies live in fakes.py.

Ray workers cannot import this module by name (pytest puts tests/ on the
path only in its own process), so tests register it with
`ray.cloudpickle.register_pickle_by_value` before sending its classes.
"""

from __future__ import annotations

import os
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
        return (
            obs,
            float(self.t),
            done and ending == "terminated",
            done and ending == "truncated",
            {},
        )

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


class MaskedPickEnv(gym.Env):
    """Each step a random subset of the `n` actions is legal (obs["action_mask"]) and
    one of them is the target (one-hot in obs["observation"]), paid 1; an illegal
    action raises. Episodes of `length` steps."""

    def __init__(self, config: dict | None = None):
        config = dict(config or {})
        self.n, self.length = int(config.get("n", 6)), int(config.get("length", 10))
        self.observation_space = gym.spaces.Dict(
            {
                "observation": gym.spaces.Box(0.0, 1.0, (self.n,), np.float32),
                "action_mask": gym.spaces.Box(0, 1, (self.n,), np.int8),
            }
        )
        self.action_space = gym.spaces.Discrete(self.n)

    def _obs(self) -> dict:
        self.mask = (self.np_random.random(self.n) < 0.5).astype(np.int8)
        self.mask[self.np_random.integers(self.n)] = 1
        self.target = int(self.np_random.choice(np.flatnonzero(self.mask)))
        return {
            "observation": np.eye(self.n, dtype=np.float32)[self.target],
            "action_mask": self.mask,
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        if not self.mask[int(action)]:
            raise ValueError(f"illegal action {action} under mask {self.mask.tolist()}")
        reward = float(int(action) == self.target)
        self.t += 1
        return self._obs(), reward, self.t >= self.length, False, {}


class TargetAndAimEnv(gym.Env):
    """Tuple(Discrete(3), Box(-1, 1, (2,))) actions that both count.

    Each step shows a class c in {0, 1, 2} (one-hot); the reward is
    [choice == c] - |aim - AIMS[c]|^2. So a step is worth 1 at best; a policy
    ignoring the aim (the best constant aim, the AIMS' mean) earns at most
    1 - AIM_VARIANCE = 0.35 a step, one ignoring the choice at most 1/3.
    config: length (steps per episode, default 10).
    """

    AIMS = np.array([[0.8, 0.0], [-0.4, 0.7], [-0.4, -0.7]], np.float32)
    AIM_VARIANCE = float(np.mean(np.sum((AIMS - AIMS.mean(0)) ** 2, axis=1)))

    def __init__(self, config: dict | None = None):
        self.length = int(dict(config or {}).get("length", 10))
        self.observation_space = gym.spaces.Box(0.0, 1.0, (3,), np.float32)
        self.action_space = gym.spaces.Tuple(
            (gym.spaces.Discrete(3), gym.spaces.Box(-1.0, 1.0, (2,), np.float32))
        )
        self.t, self.target = 0, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        choice, aim = action
        reward = float(int(choice) == self.target) - float(
            np.sum((np.asarray(aim, np.float32) - self.AIMS[self.target]) ** 2)
        )
        self.t += 1
        return self._obs(), reward, False, self.t >= self.length, {}

    def _obs(self):
        self.target = int(self.np_random.integers(3))
        return np.eye(3, dtype=np.float32)[self.target]


def env_held_outside_the_driver(config: dict):
    """config["make"](config) (default: ScriptedEpisodesEnv), made (in any process but
    config["driver_pid"]) only once the file config["hold"] is gone: remote workers that
    stay starting until a test lets them go, while the driver's own copies are made at
    once."""
    if os.getpid() != config["driver_pid"]:
        while os.path.exists(config["hold"]):
            time.sleep(0.05)
    return config.get("make", ScriptedEpisodesEnv)(config)


def release_held_workers(group, hold, timeout_s: float = 300.0) -> None:
    """Remove the `hold` file of env_held_outside_the_driver, then wait until the
    group's workers are up and its stand-in has handed over to them."""
    os.unlink(hold)
    deadline = time.monotonic() + timeout_s
    while group.samples_in_driver():
        assert time.monotonic() < deadline, f"the workers did not start in {timeout_s:.0f} s"
        time.sleep(0.1)


class BrokenEnvWorker:
    """Stands in for a rollout worker whose env raises in sample() (a bug, not a death)."""

    def sample(self):
        raise ValueError("env 'Broken' returned an observation outside its observation space")

    def stop(self):
        pass


class FrameEnv(gym.Env):
    """Tiny uint8 frames (`size` x `size`) drawn at random every step: an Atari-like
    image stream for frame stacking (wrap it in FrameStackObservation).

    config: size (6), lengths: episode lengths, cycled (default [9, 14]), and
    endings: "terminated" / "truncated" per episode, cycled; seed: the frames'
    random stream (reset(seed=...) reseeds it). Reward 1 per step; action 1 ends
    nothing, it is only there for a Discrete(2) space.
    """

    metadata = {"render_modes": ()}

    def __init__(self, config: dict | None = None):
        config = dict(config or {})
        self.size = int(config.get("size", 6))
        self.lengths = list(config.get("lengths", [9, 14]))
        self.endings = list(config.get("endings", ["terminated", "truncated"]))
        self.observation_space = gym.spaces.Box(0, 255, (self.size, self.size), np.uint8)
        self.action_space = gym.spaces.Discrete(2)
        self.frames = np.random.default_rng(config.get("seed", 0))
        self.episode, self.t = -1, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.frames = np.random.default_rng(seed)
        self.episode, self.t = self.episode + 1, 0
        return self._frame(), {}

    def step(self, action):
        self.t += 1
        done = self.t >= self.lengths[self.episode % len(self.lengths)]
        ending = self.endings[self.episode % len(self.endings)]
        return (
            self._frame(),
            1.0,
            done and ending == "terminated",
            done and ending == "truncated",
            {},
        )

    def _frame(self):
        return self.frames.integers(0, 256, (self.size, self.size), dtype=np.uint8)

"""Atari envs ("ALE/Pong-v5", any "ALE/..." id of ale-py) with DeepMind's preprocessing.

    make = AtariEnvCreator("ALE/Pong-v5")          # picklable: env_config -> gymnasium.Env
    env = make({"repeat_action_probability": 0.0})
    env.observation_space                           # Box(0, 255, (84, 84, 4), uint8)

The preprocessing (Mnih et al. 2015, as gymnasium's AtariPreprocessing does it): each
agent step repeats the action for 4 emulator frames (the env's own frameskip is set to
1) and max-pools the last two, the screen becomes 84x84 grayscale (`screen_size`: RLlib's
`model.dim`, e.g. 42 for a 4x cheaper CNN), up to 30 no-ops
start an episode, and a lost life does not end it; the last 4 such frames are stacked
on the channel axis, channels last as the model's convolutions read images. Observations
stay uint8 (the policy casts them to float32 where the model takes them).
"""

from __future__ import annotations

import importlib
from typing import TypeGuard

import gymnasium as gym
import numpy as np

from policy_service.errors import UserError

NAMESPACE = "ALE/"
FRAME_SKIP = 4  # emulator frames per agent step
SCREEN_SIZE = 84
FRAME_STACK = 4
NOOP_MAX = 30


class AtariSetupError(UserError, ValueError):
    """An ALE id without ale-py installed, or an env_config the preprocessing cannot take."""


def is_atari_id(name: object) -> TypeGuard[str]:
    """Whether `name` is an ale-py id ("ALE/Pong-v5", or "ale_py:ALE/Pong-v5")."""
    return isinstance(name, str) and name.rpartition(":")[2].startswith(NAMESPACE)


def register_ale_envs(name: str) -> None:
    """Import ale-py, which registers the "ALE/..." ids with gymnasium; an error naming
    `name` and the extra to install when it is missing. ale-py is the one module imported
    for such a name, whoever wrote it (a user or a checkpoint's file)."""
    try:
        importlib.import_module("ale_py")
    except ImportError:
        raise AtariSetupError(
            f"environment {name!r} needs ale-py: pip install 'policy-service[atari]'"
        ) from None


def deepmind_preprocessing(
    env: gym.Env,
    frame_skip: int = FRAME_SKIP,
    screen_size: int = SCREEN_SIZE,
    frame_stack: int = FRAME_STACK,
    noop_max: int = NOOP_MAX,
) -> gym.Env:
    """An ALE env made with frameskip=1 -> DeepMind's preprocessing, observations
    <uint8>[screen_size, screen_size, frame_stack] (oldest frame first)."""
    env = gym.wrappers.AtariPreprocessing(
        env,
        noop_max=noop_max,
        frame_skip=frame_skip,
        screen_size=screen_size,
        terminal_on_life_loss=False,
        grayscale_obs=True,
        scale_obs=False,
    )
    return FramesLast(gym.wrappers.FrameStackObservation(env, frame_stack))


class FramesLast(gym.ObservationWrapper):
    """Stacked frames <uint8>[stack, H, W] -> <uint8>[H, W, stack] (channels last)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        space = env.observation_space
        assert isinstance(space, gym.spaces.Box) and len(space.shape) == 3, space
        self.observation_space = gym.spaces.Box(
            np.moveaxis(space.low, 0, -1),
            np.moveaxis(space.high, 0, -1),
            dtype=space.dtype,
        )

    def observation(self, observation):
        return np.ascontiguousarray(np.moveaxis(np.asarray(observation), 0, -1))


class AtariEnvCreator:
    """env_config -> the ALE env `env_id`, preprocessed when `deepmind` (the default)
    into `screen_size` x `screen_size` frames.

    Picklable, so it travels to remote env runners, which import ale-py themselves.
    env_config holds the ALE env's own options (repeat_action_probability,
    full_action_space, ...); with the preprocessing its frameskip must be 1 or absent.
    """

    def __init__(self, env_id: str, deepmind: bool = True, screen_size: int = SCREEN_SIZE):
        self.env_id = env_id
        self.deepmind = deepmind
        self.screen_size = screen_size
        self.__name__ = env_id + (
            f" (deepmind preprocessing, {screen_size}x{screen_size})" if deepmind else ""
        )

    def __call__(self, env_config: dict) -> gym.Env:
        register_ale_envs(self.env_id)
        options = dict(env_config)
        if self.deepmind:
            check_env_config(self.env_id, options)
            options["frameskip"] = 1  # the preprocessing skips frames itself, max-pooling
        env = gym.make(self.env_id.rpartition(":")[2], **options)
        if not self.deepmind:
            return env
        return deepmind_preprocessing(env, screen_size=self.screen_size)

    def __repr__(self) -> str:
        return (
            f"AtariEnvCreator({self.env_id!r}, deepmind={self.deepmind}, "
            f"screen_size={self.screen_size})"
        )


def check_env_config(env_id: str, env_config: dict) -> None:
    """The preprocessing skips frames itself: env_config's frameskip is 1 or absent."""
    frameskip = env_config.get("frameskip", 1)
    if frameskip != 1:
        raise AtariSetupError(
            f"config.env_config.frameskip must be 1 or absent for {env_id!r} with "
            f"preprocessor_pref 'deepmind' (which skips {FRAME_SKIP} frames itself), "
            f"got {frameskip!r}"
        )

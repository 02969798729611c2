"""Packaging for policy-service: a TF2 RL policy library and service on Ray."""

from setuptools import find_packages, setup

# exporting to ONNX (tf2onnx, onnx) and running the result (onnxruntime); the tests
# check every export in onnxruntime, so "dev" includes them
ONNX = ["tf2onnx>=1.17", "onnx>=1.16", "onnxruntime>=1.17"]
# `policy-service serve` (Ray Serve's HTTP proxy and replicas; it relies on Serve 2.60's
# async constructors and streamed request bodies); tests/test_serving.py starts real
# servers, so "dev" includes it
SERVE = ["ray[serve]>=2.60"]
# continuous control on gymnasium's MuJoCo envs (HalfCheetah-v5, Hopper-v5; the mujoco
# wheel); in "dev" so that CI's venv can run SAC on them
MUJOCO = ["gymnasium[mujoco]>=1.0"]
# Atari (ALE/Pong-v5, any "ALE/..." id) with DeepMind's preprocessing: ale-py ships the
# ROMs, gymnasium's AtariPreprocessing resizes with OpenCV (headless: no GUI libraries);
# in "dev" so that CI runs tests/test_atari.py rather than skipping it
ATARI = ["ale-py>=0.9", "opencv-python-headless>=4.8"]
# PettingZoo envs (Parallel and AEC) as MultiAgentEnvs, and the MPE envs (simple_spread),
# which moved from pettingzoo.mpe to the mpe2 package in PettingZoo 1.27. mpe2 requires
# pygame-ce, which installs the same `pygame` package the classic games import: listing
# pygame too would put two distributions' files in one directory
MULTIAGENT = ["pettingzoo>=1.24", "mpe2>=1.1.1", "pygame-ce>=2.3"]
# sweeps: every registered algorithm is a Ray Tune trainable (`policy-service tune`)
TUNE = ["ray[tune]>=2.40"]
# offline data: experiences written as Parquet (Arrow) and read through Ray Data; RLlib's
# JSON lines pack each column as an LZ4 frame, so reading them needs lz4
OFFLINE = ["ray[data]>=2.40", "pyarrow>=14", "lz4>=4"]
# Minari datasets as input ("minari:<id>"): its Arrow format, no download client
MINARI = ["minari[arrow]>=0.5"]

setup(
    name="policy-service",
    version="0.1.0",
    description="TensorFlow 2 reinforcement-learning policies: multi-GPU towers, "
    "batched remote inference and training jobs on Ray.",
    python_requires=">=3.10",
    packages=find_packages(
        include=["policy_service", "policy_service.*", "algorithms", "algorithms.*"]
    ),
    install_requires=[
        "tensorflow>=2.16",
        "keras>=3.0",
        "ray[default]>=2.40",
        "numpy>=1.26",
        "gymnasium>=1.0",
        "dm-tree>=0.1.8",
        "pyyaml>=6.0",
        "tqdm>=4.60",
        # every run writes TensorBoard event files and suggests `tensorboard --logdir`;
        # TensorFlow 2.21 no longer brings it
        "tensorboard>=2.16",
    ],
    extras_require={
        "dev": [
            "pytest>=8",
            "pytest-timeout>=2.3",
            "pytest-xdist>=3.5",
            "hypothesis>=6.100",
            "ruff>=0.17.6",
            "mypy>=2.4.1",
            *ONNX,
            *SERVE,
            *MUJOCO,
            *MULTIAGENT,
            *ATARI,
            *TUNE,
            *OFFLINE,
            *MINARI,
        ],
        "onnx": ONNX,
        "serve": SERVE,
        "mujoco": MUJOCO,
        "multiagent": MULTIAGENT,
        "atari": ATARI,
        "tune": TUNE,
        "offline": OFFLINE,
        "minari": MINARI,
        "bench": ["matplotlib>=3.8"],
        "gpu": ["tensorflow[and-cuda]>=2.16"],
        "compare": ["ray[rllib]>=2.40"],
    },
    entry_points={"console_scripts": ["policy-service=policy_service.cli.commands:main"]},
)

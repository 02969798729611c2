"""`policy-service train sac` on gymnasium's MuJoCo envs (the mujoco extra, in "dev"):
one short iteration of HalfCheetah-v5 with its tuned config and of Hopper-v5 (SAC's
defaults), each a real process, both started at once. Learning itself:
tests/test_continuous_learning.py (slow)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_processes import finish, progress, ray_token, start  # noqa: F401

pytest.importorskip("mujoco", reason="the mujoco extra: pip install -e '.[mujoco]'")

HALFCHEETAH_YAML = Path(__file__).resolve().parents[1] / "algorithms/tuned/halfcheetah_sac.yaml"
SHORT = [
    "--stop-iters",
    "1",
    "--seed",
    "0",
    "--set",
    "min_sample_timesteps_per_iteration=64",
    "--set",
    "num_steps_sampled_before_learning_starts=32",
    "--set",
    "train_batch_size=16",
    "--set",
    "replay_buffer_capacity=1000",
    "--set",
    "q_model_config={fcnet_hiddens: [16], fcnet_activation: relu}",
    "--set",
    "policy_model_config={fcnet_hiddens: [16], fcnet_activation: relu}",
]


@pytest.mark.slow  # two training commands: ~9 s here
def test_halfcheetah_and_hopper_train_one_iteration_from_the_command_line(tmp_path):
    runs = {
        "HalfCheetah-v5": ["--config", str(HALFCHEETAH_YAML)],
        "Hopper-v5": [],
    }
    processes = {
        env: start(
            "train", "sac", "--env", env, *extra, "--output-dir", str(tmp_path / env), *SHORT
        )
        for env, extra in runs.items()
    }
    for env, process in processes.items():
        code, _, err = finish(process)
        assert code == 0, f"{env}: {err[-3000:]}"
        (row,) = progress(tmp_path / env)
        assert row["timesteps_total"] >= 64, (env, row)
        assert row["num_sgd_steps_total"] > 0, (env, row)

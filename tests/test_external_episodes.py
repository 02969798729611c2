"""Which algorithms take external episodes (`external_env: true`): PPO (test_external_env)
and DQN; every other algorithm is refused in one line, from Python and from the command
line, before Ray, a server or a run directory exists."""

from __future__ import annotations

import subprocess
import sys

import pytest
from cli_processes import command_env
from fakes import assert_one_line
from test_external_env import REPO

from algorithms import get_algorithm_class
from policy_service.config import ConfigError

REFUSED = {"sac": "Pendulum-v1", "td3": "Pendulum-v1", "impala": "CartPole-v1"}
REFUSED.update(appo="CartPole-v1", a3c="CartPole-v1")
TAKEN_BY = "(external_env runs: PPO, DQN)"


def refusal(algo_name: str) -> str:
    return f"external_env: {algo_name.upper()} does not take external episodes {TAKEN_BY}"


def test_the_refusals_name_exactly_the_registered_algorithms_that_take_them():
    from algorithms import ALGORITHMS
    from algorithms.algorithm import EXTERNAL_ENV_RUNS

    classes = [get_algorithm_class(name) for name in ALGORITHMS]
    taking = [cls.__name__ for cls in classes if cls.config_class.takes_external_episodes]
    assert taking == list(EXTERNAL_ENV_RUNS) == ["PPO", "DQN"]


# ----- refused: one line, before anything starts ------------------------------------------


@pytest.mark.parametrize("algo_name", sorted(REFUSED))
def test_algorithms_without_external_episodes_refuse_them_in_one_line(algo_name):
    algo_cls = get_algorithm_class(algo_name)
    with pytest.raises(ConfigError) as refused:
        algo_cls({"env": REFUSED[algo_name], "external_env": True})
    assert_one_line(refused.value, f"config.{refusal(algo_name)}")


@pytest.mark.parametrize("algo_name", sorted(REFUSED))
def test_train_external_env_refuses_them_with_exit_2(algo_name, tmp_path, capsys):
    from policy_service.cli import commands as cli

    run_dir = tmp_path / "run"
    args = ["train", algo_name, "--env", REFUSED[algo_name], "--external-env"]
    code = cli.main([*args, "--output-dir", str(run_dir)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("policy-service: error:") and refusal(algo_name) in lines[0]
    assert not run_dir.exists()  # refused before the run directory (and Ray, and the server)


@pytest.mark.slow  # ~10-20 s: the process imports TensorFlow
def test_the_refusal_is_the_process_exit_status(tmp_path):
    args = ["train", "sac", "--env", "Pendulum-v1", "--external-env"]
    done = subprocess.run(  # this tree's code (CLI's entry point may import another checkout)
        [
            sys.executable,
            "-m",
            "policy_service.cli.commands",
            *args,
            "--output-dir",
            str(tmp_path / "run"),
        ],
        cwd=REPO,
        env=command_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and done.stdout == "", done.stderr[-3000:]
    assert_one_line(done.stderr.strip(), refusal("sac"))

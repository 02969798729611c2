"""Which algorithms take external episodes (`external_env: true`): PPO (test_external_env)
and DQN, whose replay buffer fills from client processes playing CartPole-v1 over HTTP;
every other algorithm is refused in one line, from Python and from the command line,
before Ray, a server or a run directory exists.

The DQN runs are slow (Ray and Serve start in this process, the clients import
TensorFlow); the refusals are fast.
"""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from cli_processes import command_env
from fakes import assert_one_line, weights_differ
from test_external_env import REPO, TOKEN, clients, free_port

from algorithms import get_algorithm_class
from algorithms.dqn import DQN
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


# ----- DQN: the replay buffer fills from client processes -----------------------------------


def dqn_config(tmp_path, **overrides) -> dict:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    return {
        "env": "CartPole-v1",
        "external_env": True,
        "external_env_port": free_port(),
        "external_env_token_file": str(token_file),
        "seed": 0,
        "model": {"fcnet_hiddens": [64, 64]},
        "hiddens": [],
        **overrides,
    }


def playing(config: dict, count: int) -> list[subprocess.Popen]:
    """`count` client processes playing CartPole-v1 episodes in remote mode."""
    port = config["external_env_port"]
    return clients("cartpole", port, count, "--mode", "remote", "--seconds", "600")


@pytest.mark.slow
def test_one_dqn_iteration_learns_on_replayed_client_steps(ray_local, tmp_path):
    config = dqn_config(
        tmp_path,
        train_batch_size=32,
        num_steps_sampled_before_learning_starts=100,
        min_sample_timesteps_per_iteration=300,
    )
    algo = DQN(config)
    procs = playing(config, 1)
    try:
        before = algo.get_policy().get_weights()
        result = algo.train()
        after = algo.get_policy().get_weights()
    finally:
        for proc in procs:
            proc.kill()
        algo.stop()
    assert result["timesteps_total"] >= 300 and result["episodes_this_iter"] >= 1
    assert result["replay_buffer_size"] == result["timesteps_total"]  # every step kept
    assert result["num_sgd_steps_total"] > 0 and weights_differ(before, after)
    assert result["cur_epsilon"] < 1.0  # the server's schedule moved with the steps


def random_policy_return(episodes: int = 100) -> float:
    env = gym.make("CartPole-v1")
    env.action_space.seed(0)
    returns = []
    for k in range(episodes):
        env.reset(seed=k)
        done, total = False, 0.0
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    return float(np.mean(returns))


@pytest.mark.slow
def test_dqn_learns_cartpole_from_four_client_processes(ray_local, tmp_path):
    random_return = random_policy_return()  # ~22
    target = 4 * random_return
    # the tuned CartPole config (algorithms/tuned/cartpole_dqn.yaml), its 256-step rounds
    # taken from the clients, epsilon down in 5k steps
    config = dqn_config(
        tmp_path,
        lr=1e-3,
        grad_clip=10.0,
        train_batch_size=64,
        n_step=3,
        target_network_update_freq=128,
        training_intensity=32,
        rollout_fragment_length=256,
        metrics_num_episodes_for_smoothing=20,
        exploration_config={
            "type": "EpsilonGreedy",
            "initial_epsilon": 1.0,
            "final_epsilon": 0.02,
            "epsilon_timesteps": 5000,
        },
    )
    algo = DQN(config)
    procs = playing(config, 4)
    try:
        while True:
            result = algo.train()
            if result["episode_return_mean"] >= target or result["timesteps_total"] >= 15_000:
                break
    finally:
        for proc in procs:
            proc.kill()
        algo.stop()
    print(
        f"\nexternal DQN: 20-episode mean {result['episode_return_mean']:.1f} after "
        f"{result['timesteps_total']} steps ({result['time_total_s']:.0f} s); "
        f"random policy {random_return:.1f}"
    )
    assert result["episode_return_mean"] >= target

"""Which algorithms take external episodes (`external_env: true`): PPO (test_external_env),
DQN, whose replay buffer fills from client processes playing CartPole-v1 over HTTP, and
SAC and TD3 (Box actions, clipped by the server as env runners clip them), shown by SAC
learning Pendulum-v1 from client processes; every other algorithm is refused in one
line, from Python and from the command line, before Ray, a server or a run directory
exists.

The DQN and SAC runs are slow (Ray and Serve start in this process, the clients import
TensorFlow); the refusals are fast.
"""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import yaml
from cli_processes import command_env
from external_env_processes import REPO, TOKEN, clients
from fakes import assert_one_line, weights_differ
from ports import free_port

from algorithms import get_algorithm_class
from algorithms.dqn import DQN
from algorithms.sac import SAC
from algorithms.td3 import TD3
from policy_service.config import ConfigError

REFUSED = {"impala": "CartPole-v1", "appo": "CartPole-v1", "a3c": "CartPole-v1"}
TAKEN_BY = "(external_env runs: PPO, DQN, SAC, TD3)"


def refusal(algo_name: str) -> str:
    return f"external_env: {algo_name.upper()} does not take external episodes {TAKEN_BY}"


def test_the_refusals_name_exactly_the_registered_algorithms_that_take_them():
    from algorithms import ALGORITHMS
    from algorithms.algorithm import EXTERNAL_ENV_RUNS

    classes = [get_algorithm_class(name) for name in ALGORITHMS]
    taking = [cls.__name__ for cls in classes if cls.config_class.takes_external_episodes]
    assert taking == list(EXTERNAL_ENV_RUNS) == ["PPO", "DQN", "SAC", "TD3"]


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
    args = ["train", "impala", "--env", "CartPole-v1", "--external-env"]
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
    assert_one_line(done.stderr.strip(), refusal("impala"))


# ----- DQN: the replay buffer fills from client processes -----------------------------------


def external_config(tmp_path, **settings) -> dict:
    """settings, served to clients on a free port with the test's token."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    return {
        "external_env": True,
        "external_env_port": free_port(),
        "external_env_token_file": str(token_file),
        "seed": 0,
        **settings,
    }


def dqn_config(tmp_path, **overrides) -> dict:
    return external_config(
        tmp_path, env="CartPole-v1", model={"fcnet_hiddens": [64, 64]}, hiddens=[], **overrides
    )


def playing(config: dict, count: int) -> list[subprocess.Popen]:
    """`count` client processes playing the config's env in remote mode."""
    port, env = config["external_env_port"], config["env"]
    return clients("play", port, count, "--env", env, "--mode", "remote", "--seconds", "1200")


ONE_ITERATION = {
    "train_batch_size": 32,
    "num_steps_sampled_before_learning_starts": 100,
    "min_sample_timesteps_per_iteration": 300,
}


def one_iteration(algo, config: dict) -> tuple[dict, dict, dict]:
    """One iteration from one client process -> (result, weights before, after)."""
    procs = playing(config, 1)
    try:
        before = algo.get_policy().get_weights()
        result = algo.train()
        return result, before, algo.get_policy().get_weights()
    finally:
        for proc in procs:
            proc.kill()
        algo.stop()


@pytest.mark.slow
def test_one_td3_iteration_learns_on_replayed_client_steps(ray_local, tmp_path):
    """TD3 (deterministic actions plus clipped noise, Box) from a Pendulum client."""
    small = {"actor_hiddens": [32], "critic_hiddens": [32]}
    config = external_config(tmp_path, env="Pendulum-v1", **small, **ONE_ITERATION)
    result, before, after = one_iteration(TD3(config), config)
    assert result["timesteps_total"] >= 300 and result["episodes_this_iter"] >= 1
    assert result["replay_buffer_size"] == result["timesteps_total"]
    assert result["num_sgd_steps_total"] > 0 and weights_differ(before, after)


def random_policy_return(env_id: str = "CartPole-v1", episodes: int = 100) -> float:
    env = gym.make(env_id)
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
def test_dqn_learns_cartpole_from_four_client_processes_replaying_every_step(ray_local, tmp_path):
    """DQN's replay buffer holds every step the clients played, it learns on them, its
    epsilon schedule moves with them, and it learns CartPole. (A test of one iteration
    from one client checked the first three apart, building the same DQN and server.)"""
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
    result, before, after = trained_by_four_clients(DQN(config), config, target, 15_000)
    print(
        f"\nexternal DQN: 20-episode mean {result['episode_return_mean']:.1f} after "
        f"{result['timesteps_total']} steps ({result['time_total_s']:.0f} s); "
        f"random policy {random_return:.1f}"
    )
    assert result["replay_buffer_size"] == result["timesteps_total"]  # every step kept
    assert result["num_sgd_steps_total"] > 0 and weights_differ(before, after)
    assert result["cur_epsilon"] < 1.0  # the server's schedule moved with the steps
    assert result["episode_return_mean"] >= target


def trained_by_four_clients(
    algo, config: dict, target: float, max_steps: int
) -> tuple[dict, dict, dict]:
    """algo trained from 4 client processes until its mean return reaches target or
    max_steps env steps -> (its last result, its weights before, after)."""
    procs = playing(config, 4)
    try:
        before = algo.get_policy().get_weights()
        while True:
            result = algo.train()
            if result["episode_return_mean"] >= target or result["timesteps_total"] >= max_steps:
                return result, before, algo.get_policy().get_weights()
    finally:
        for proc in procs:
            proc.kill()
        algo.stop()


# ----- SAC: Box actions, clipped by the server for the clients ---------------------------------


@pytest.mark.slow
def test_sac_learns_pendulum_from_four_client_processes(ray_local, tmp_path):
    random_return = random_policy_return("Pendulum-v1", 20)  # ~ -1200
    target = random_return / 2  # half way from a random policy's return to the best (0)
    # the tuned config (algorithms/tuned/pendulum_sac.yaml: -133 after 8k env steps)
    tuned = yaml.safe_load((REPO / "algorithms" / "tuned" / "pendulum_sac.yaml").read_text())
    config = external_config(tmp_path, **tuned)
    result, _, _ = trained_by_four_clients(SAC(config), config, target, 20_000)
    print(
        f"\nexternal SAC: 10-episode mean {result['episode_return_mean']:.1f} after "
        f"{result['timesteps_total']} steps ({result['time_total_s']:.0f} s); "
        f"random policy {random_return:.1f}"
    )
    assert result["episode_return_mean"] >= target

"""algorithms/periodic_evaluation.py: evaluation during training with RLlib's keys, equal to
`policy-service evaluate` of the same iteration's checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import multi_agent_envs
import numpy as np
import pytest
from cli_processes import TINY, progress, ray_token, run, tensorboard_scalars  # noqa: F401
from multi_agent_envs import TwoMapsEnv, two_maps_config

from algorithms.ppo import PPO
from policy_service.config import ConfigError

TINY_CONFIG = {
    "env": "CartPole-v1",
    "seed": 0,
    "train_batch_size": 256,
    "minibatch_size": 64,
    "num_epochs": 2,
    "model": {"fcnet_hiddens": [32, 32]},
}
EVALUATION = [
    "--set",
    "evaluation_interval=2",
    "--set",
    "evaluation_duration=10",
    "--set",
    "evaluation_config={explore: false}",
]


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            {"evaluation_interval": 0},
            "config.evaluation_interval must be None or an integer >= 1, got 0",
        ),
        (
            {"evaluation_interval": -1},
            "config.evaluation_interval must be None or an integer >= 1, got -1",
        ),
        ({"evaluation_duration_unit": "days"}, "config.evaluation_duration_unit must be one of"),
        (
            {"evaluation_config": {"lr": 1.0}},
            "config.evaluation_config must be None or a dict of explore",
        ),
        (
            {"evaluation_interval": 1, "evaluation_parallel_to_training": True},
            "config.evaluation_parallel_to_training needs evaluation runner actors",
        ),
    ],
)
def test_bad_evaluation_keys_are_one_line_before_anything_starts(changes, message):
    with pytest.raises(ConfigError) as raised:
        PPO({**TINY_CONFIG, **changes})
    assert message in str(raised.value) and "\n" not in str(raised.value)


EVALUATION_SCALARS = [
    f"evaluation/{name}"
    for name in (
        "episode_return_mean",
        "episode_return_min",
        "episode_return_max",
        "episode_len_mean",
        "num_episodes",
        "num_env_steps",
    )
]


def evaluate(checkpoint: Path, capsys) -> dict:
    """`policy-service evaluate CHECKPOINT --episodes 10`'s report (seeded as the run's
    evaluations are, by default), from the function the command runs, in this process
    (no TensorFlow import per checkpoint)."""
    from algorithms import evaluation

    capsys.readouterr()
    assert evaluation.evaluate(str(checkpoint), episodes=10) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.slow  # a 4-iteration `train` process, then two evaluations here: ~25 s here
def test_evaluation_at_iteration_k_equals_evaluate_of_its_checkpoint(tmp_path, capsys):
    """... and its metrics are in progress.jsonl, TensorBoard and result.json."""
    run_dir = tmp_path / "run"
    code, _, err = run(
        # evaluate's default seed is the run's: 3 here, not 0
        "train", "ppo", "--env", "CartPole-v1", "--seed", "3", "--stop-iters", "4",
        "--checkpoint-every", "2", "--output-dir", str(run_dir), *EVALUATION, *TINY,
    )  # fmt: skip
    assert code == 0, err
    rows = progress(run_dir)
    assert ["evaluation/episode_returns" in r for r in rows] == [False, True, False, True]
    for row in rows[1::2]:
        assert row["evaluation/num_episodes"] == 10
        checkpoint = run_dir / "checkpoints" / f"checkpoint_{row['iteration']:06d}"
        evaluated = evaluate(checkpoint, capsys)
        assert row["evaluation/episode_returns"] == evaluated["episode_returns"]  # bit for bit
        assert row["evaluation/episode_return_mean"] == evaluated["episode_return_mean"]
    # the same figures in TensorBoard (at step = iteration) and, the last, in result.json
    scalars = tensorboard_scalars(run_dir)
    for key in EVALUATION_SCALARS:
        assert scalars[key] == {r["iteration"]: np.float32(r[key]) for r in rows[1::2]}, key
    result = json.loads((run_dir / "result.json").read_text())
    assert {k: v for k, v in result.items() if k.startswith("evaluation/")} == {
        k: v for k, v in rows[-1].items() if k.startswith("evaluation/")
    }


@pytest.mark.slow  # 2 iterations with an evaluation runner actor: ~40 s here
def test_parallel_evaluation_plays_the_weights_the_iteration_started_with(tmp_path, capsys):
    run_dir = tmp_path / "run"
    code, _, err = run(
        "train", "ppo", "--env", "CartPole-v1", "--seed", "0", "--stop-iters", "2",
        "--checkpoint-every", "1", "--output-dir", str(run_dir), *EVALUATION,
        "--set", "evaluation_num_env_runners=2", "--set", "evaluation_parallel_to_training=true",
        *TINY,
    )  # fmt: skip
    assert code == 0, err
    row = progress(run_dir)[1]
    # evaluated in the runner actors while iteration 2 trained: iteration 1's weights
    evaluated = evaluate(run_dir / "checkpoints" / "checkpoint_000001", capsys)
    assert sorted(row["evaluation/episode_returns"]) == sorted(evaluated["episode_returns"])


@pytest.mark.slow  # an evaluation runner actor started three times: ~35 s here
def test_a_killed_evaluation_runner_is_replaced_and_plays_its_share_again():
    """... and one past evaluation_sample_timeout_s is counted out: its episodes are
    missing (evaluation/timed_out), the run goes on, and it is stopped and replaced, so
    the next evaluation does not wait behind what it was playing. The env is a name
    given to register_env in this process: the runners get its creator."""
    import gymnasium as gym
    import ray

    from algorithms import register_env

    register_env("cartpole_by_creator", lambda env_config: gym.make("CartPole-v1"))
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    algo = PPO(
        {
            **TINY_CONFIG,
            "env": "cartpole_by_creator",
            "evaluation_num_env_runners": 1,
            "evaluation_duration": 4,
        }
    )
    try:
        algo.train()
        first = algo.evaluate()
        assert algo.evaluation is not None
        ray.kill(algo.evaluation.runners[0], no_restart=True)
        second = algo.evaluate()
        assert second["evaluation/num_runner_restarts"] == 1
        assert second["evaluation/episode_returns"] == first["evaluation/episode_returns"]
        assert second["evaluation/num_episodes"] == 4
        assert second["evaluation/timed_out"] is False

        [busy] = algo.evaluation.runners
        # kept busy (a million episodes) past a timeout of 1 s
        hog = busy.play.remote(algo.learners.get_state(), list(range(10**6)), False)
        config = algo.evaluation.config
        algo.evaluation.config = config.copy().evaluation(evaluation_sample_timeout_s=1.0)
        timed_out = algo.evaluate()
        assert timed_out["evaluation/timed_out"] is True
        assert timed_out["evaluation/num_episodes"] == 0
        assert timed_out["evaluation/episode_returns"] == []
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(hog, timeout=60)  # the runner counted out was stopped
        [replacement] = algo.evaluation.runners
        assert replacement is not busy
        algo.evaluation.config = config  # 120 s: the replacement plays its share
        third = algo.evaluate()
        assert third["evaluation/timed_out"] is False
        assert third["evaluation/episode_returns"] == first["evaluation/episode_returns"]
    finally:
        algo.stop()
        ray.shutdown()


@pytest.mark.parametrize(
    "runners", [0, pytest.param(1, marks=pytest.mark.slow)], ids=["in the driver", "in a runner"]
)
def test_a_run_with_policies_evaluates_every_agent_as_evaluate_of_its_checkpoint(
    runners, tmp_path, capsys
):
    """Each agent plays with the policy the run's mapping gives it; the evaluation of
    iteration 1 equals `policy-service evaluate` of iteration 1's checkpoint, per policy
    too (the driver's and a runner actor's alike)."""
    import ray

    from algorithms import evaluation, register_env

    register_env("two_maps", lambda env_config: TwoMapsEnv(env_config))
    if runners:
        ray.init(address="local", num_cpus=2, include_dashboard=False)
        ray.cloudpickle.register_pickle_by_value(multi_agent_envs)  # a test-only env
    small = {"train_batch_size": 64, "minibatch_size": 32, "num_epochs": 1}
    algo = PPO(
        two_maps_config(
            **small,
            model={"fcnet_hiddens": [8]},
            evaluation_interval=1,
            evaluation_duration=6,
            evaluation_num_env_runners=runners,
            evaluation_config={"explore": False},
        )
    )
    try:
        result = algo.train()
        path = algo.save(str(tmp_path / "checkpoint_000001"))
    finally:
        algo.stop()
        if runners:
            ray.cloudpickle.unregister_pickle_by_value(multi_agent_envs)
            ray.shutdown()
    assert result["evaluation/num_episodes"] == 6
    assert set(result["evaluation/policy_reward_mean"]) == {"pa", "pb"}
    evaluation.evaluate(path, episodes=6, seed=0, policy_id="pa")
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["episode_returns"] == result["evaluation/episode_returns"]
    assert report["policy_reward_mean"] == result["evaluation/policy_reward_mean"]


@pytest.mark.slow  # one evaluation runner actor: ~10 s here
def test_an_evaluation_runner_whose_env_cannot_be_made_ends_the_run_in_one_line_at_once():
    """Its constructor raised, so a replacement would too: no restarts, one line."""
    import ray

    from policy_service.errors import RunFailure

    ray.init(address="local", num_cpus=2, include_dashboard=False)
    algo = PPO(
        {
            **TINY_CONFIG,
            "evaluation_num_env_runners": 1,
            "evaluation_config": {"env_config": {"no_such_argument": 1}},
        }
    )
    try:
        with pytest.raises(RunFailure) as failed:
            algo.evaluate()
        assert "\n" not in str(failed.value)
        assert "evaluation env runner 1 could not start" in str(failed.value)
        assert "no_such_argument" in str(failed.value)
        assert algo.evaluation is not None and algo.evaluation.num_runner_restarts == 0
    finally:
        algo.stop()
        ray.shutdown()


def test_a_custom_evaluation_function_replaces_the_evaluation_its_metrics_under_evaluation(
    monkeypatch,
):
    """custom_evaluation_function(algorithm, evaluation) -> metrics: called instead of the
    built-in evaluation (which it may run itself), its keys under evaluation/, in train()'s
    result and evaluate()'s."""
    from algorithms.periodic_evaluation import Evaluation

    finished = []  # every evaluation played, the built-in's or the function's
    finish = Evaluation.finish
    monkeypatch.setattr(Evaluation, "finish", lambda self: finished.append(1) or finish(self))
    calls = []

    def custom(algorithm, evaluation):
        calls.append((algorithm, evaluation))
        played = evaluation.run()
        return {"my_metric": len(calls), "mean": played["evaluation/episode_return_mean"]}

    small = {"train_batch_size": 64, "minibatch_size": 32, "num_epochs": 1}
    algo = PPO(
        {
            **TINY_CONFIG,
            **small,
            "evaluation_interval": 1,
            "evaluation_duration": 2,
            "evaluation_config": {"explore": False},
            "custom_evaluation_function": custom,
        }
    )
    try:
        result = algo.train()
        assert calls == [(algo, algo.evaluation)]
        assert len(finished) == 1  # the function's own run, no built-in one beside it
        assert result["evaluation/my_metric"] == 1
        assert result["evaluation/mean"] > 0  # CartPole: every episode returns >= 1
        assert {k for k in result if k.startswith("evaluation/")} == {
            "evaluation/my_metric",
            "evaluation/mean",
        }  # the built-in evaluation's metrics only as the function returns them
        again = algo.evaluate()  # the same weights, greedy, the same seeds
        assert again == {"evaluation/my_metric": 2, "evaluation/mean": result["evaluation/mean"]}
        assert len(finished) == 2
    finally:
        algo.stop()


def test_a_timesteps_duration_plays_whole_episodes_until_that_many_steps():
    """evaluation_duration_unit "timesteps": the episodes an "episodes" evaluation plays
    (the same seeds, in order), whole, up to the first that reaches the duration."""
    from algorithms.periodic_evaluation import Evaluation

    algo = PPO({**TINY_CONFIG, "evaluation_duration": 4, "evaluation_config": {"explore": False}})
    try:
        by_episodes = algo.evaluate()
        lengths = [int(n) for n in by_episodes["evaluation/episode_returns"]]  # CartPole
        duration = lengths[0] + 1  # the first episode falls short by one step
        config = algo.config.copy().evaluation(
            evaluation_duration_unit="timesteps", evaluation_duration=duration
        )
        by_timesteps = Evaluation(config, algo.learners.get_state)
        try:
            by_steps = by_timesteps.run()
        finally:
            by_timesteps.stop()
    finally:
        algo.stop()
    assert by_steps["evaluation/episode_returns"] == by_episodes["evaluation/episode_returns"][:2]
    assert by_steps["evaluation/num_episodes"] == 2
    assert by_steps["evaluation/num_env_steps"] == lengths[0] + lengths[1] > duration


def filter_stats(stat) -> tuple:
    """A RunningStat as plain values, compared exactly."""
    return stat.count, stat.mean.tolist(), stat.m2.tolist()


def training_state(algo) -> tuple:
    """What evaluation must never change: the env runners' merged filter statistics, the
    learner policy's copy of them, and the learner's weights."""
    from policy_service.data import observation_filters

    [learner_stats] = algo.learners.foreach_policy(observation_filters.policy_filter_stats)
    weights = {name: value.tolist() for name, value in algo.learners.get_weights().items()}
    return filter_stats(algo.env_runner_group().filter_stats), filter_stats(learner_stats), weights


@pytest.mark.parametrize(
    "runners, parallel",
    [(0, False), pytest.param(1, True, marks=pytest.mark.slow)],
    ids=["in the driver", "in a runner, parallel"],
)
def test_evaluation_plays_the_training_filter_statistics_and_never_writes_them(
    runners, parallel, tmp_path, capsys, monkeypatch
):
    """With a MeanStdFilter: the evaluation's policy copies hold the learner's filter
    statistics of the moment the evaluation starts (after the iteration; in parallel,
    before it) and keep them while playing (no update); the training after it is exactly
    a run's without evaluation (filter statistics and weights, the same seed); and the
    returns equal `evaluate` of the checkpoint of those statistics, which applies them."""
    import ray
    import tensorflow as tf

    from algorithms.periodic_evaluation import EvaluationPlayer
    from policy_service.data import observation_filters

    played = []  # in the driver: each evaluation's statistics, given and held after play
    play = EvaluationPlayer.play

    def recorded_play(self, state, *args, **kwargs):
        result = play(self, state, *args, **kwargs)
        given = observation_filters.RunningStat.from_arrays(
            state[observation_filters.STATE_KEY], (4,), "the state played"
        )
        held = self.policies[None].observation_filter.stats
        played.append((filter_stats(given), filter_stats(held)))
        return result

    if runners:  # the runner actor's class is shipped as it is: asked directly instead
        ray.init(address="local", num_cpus=2, include_dashboard=False)
    else:
        monkeypatch.setattr(EvaluationPlayer, "play", recorded_play)
    config = {
        **TINY_CONFIG,
        "train_batch_size": 128,
        "minibatch_size": 64,
        "num_epochs": 1,
        "observation_filter": "MeanStdFilter",
    }
    evaluated = {
        **config,
        "evaluation_interval": 1,
        "evaluation_duration": 10,
        "evaluation_num_env_runners": runners,
        "evaluation_parallel_to_training": parallel,
        "evaluation_config": {"explore": False},
    }
    states = {}
    try:
        for name, run_config in (("plain", config), ("evaluated", evaluated)):
            algo = PPO(run_config)
            try:
                algo.train()
                checkpoint = algo.save(str(tmp_path / name / "checkpoint_000001"))
                at_start = training_state(algo)  # what a parallel evaluation starts from
                result = algo.train()
                if name == "evaluated":
                    [learner_stats] = algo.learners.foreach_policy(
                        observation_filters.policy_filter_stats
                    )
                    if runners:
                        [runner] = algo.evaluation.runners
                        held = filter_stats(
                            ray.get(
                                runner.__ray_call__.remote(
                                    lambda player: player.policies[None].observation_filter.stats
                                )
                            )
                        )
                        # its TF thread pools sized to its CPUs (0.5: 1 each), as an env
                        # runner's, so it does not crowd the training it runs beside
                        threads = runner.__ray_call__.remote(
                            lambda _: (
                                tf.config.threading.get_intra_op_parallelism_threads(),
                                tf.config.threading.get_inter_op_parallelism_threads(),
                            )
                        )
                        assert ray.get(threads) == (1, 1)
                    else:
                        assert [g == h for g, h in played] == [True, True]  # play kept them
                        held = played[-1][1]
                    # the statistics of the moment the evaluation started
                    started = at_start[1] if parallel else filter_stats(learner_stats)
                    assert held == started and held[0] > 0
                    if parallel:  # iteration 2 sampled more: the evaluation did not take them
                        assert held[0] < filter_stats(learner_stats)[0]
                    else:
                        checkpoint = algo.save(str(tmp_path / name / "checkpoint_000002"))
                    # evaluate applies the checkpoint's statistics, as the evaluation did
                    evaluated_again = evaluate(Path(checkpoint), capsys)
                    assert (
                        evaluated_again["episode_returns"] == result["evaluation/episode_returns"]
                    )
                states[name] = training_state(algo)
            finally:
                algo.stop()
    finally:
        if runners:
            ray.shutdown()
    assert states["evaluated"] == states["plain"]  # nothing came back from the evaluation

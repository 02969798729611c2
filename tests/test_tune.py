"""Ray Tune: every registered algorithm as a trainable (algorithms/tune.py), search
spaces and PBT mutations checked before any trial (algorithms/tune_search.py), and
`policy-service tune` (policy_service/cli/tune_command.py).

The sweeps are PPO on CartPole with tiny settings on the module's 2-CPU Ray."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from pathlib import Path

import pytest
from cli_processes import (
    command_env,
    kill_group,
    ray_token,  # noqa: F401 - the module's own Ray token
)
from waiting import wait_until

ray = pytest.importorskip("ray")
tune = pytest.importorskip("ray.tune")

from algorithms import ALGORITHMS  # noqa: E402
from algorithms.ppo import PPO, PPOConfig  # noqa: E402
from algorithms.tune import (  # noqa: E402
    LINEAGE_FILE,
    register_trainables,
    trainable,
    trainable_name,
)
from algorithms.tune_search import (  # noqa: E402
    ClampToMutations,
    check_search_space,
    population_based_training,
    search_space_from_yaml,
)
from policy_service.config import ConfigError  # noqa: E402
from policy_service.io.checkpoints import list_checkpoints  # noqa: E402

TINY = {
    "env": "CartPole-v1",
    "seed": 0,
    "train_batch_size": 512,
    "minibatch_size": 128,
    "num_epochs": 2,
    "lr": 3e-3,
    "model": {"fcnet_hiddens": [32]},
    "metrics_num_episodes_for_smoothing": 20,
}
FRESH_RAY = True  # trials place groups of up to every CPU: nothing of another module may wait
TESTS = Path(__file__).parent


# ----- without Ray: names, bundles, bad input ---------------------------------------


def test_every_registered_algorithm_is_a_named_trainable():
    from ray.tune.registry import get_trainable_cls

    register_trainables()  # a Ray another test file started and stopped took them with it
    for name in ALGORITHMS:
        cls = trainable(name)
        assert issubclass(cls, tune.Trainable)
        assert get_trainable_cls(trainable_name(name)) is cls
    assert trainable(PPO) is trainable("ppo")
    assert trainable_name("ppo") == "policy_service.PPO"


def test_resources_are_the_driver_learner_and_env_runner_bundles():
    request = trainable(PPO).default_resource_request(
        {**TINY, "num_learners": 2, "num_cpus_per_learner": 0.5, "num_env_runners": 3}
    )
    bundles = request.bundles
    assert bundles[0] == {"CPU": 1.0}  # the trial's own actor
    assert sorted(map(json.dumps, bundles[1:])) == sorted(
        map(json.dumps, [{"CPU": 0.5}] * 3 + [{"CPU": 0.5}] * 2)
    )
    assert request.strategy == "PACK"
    assert trainable(PPO).default_resource_request(TINY).bundles == [{"CPU": 1.0}]


@pytest.mark.parametrize(
    "space, named",
    [
        ({"lrr": tune.grid_search([1e-3, 1e-4])}, "'lrr' (did you mean 'lr'?)"),
        ({"model": {"fcnet_hidens": tune.choice([[8]])}}, "config.model key 'fcnet_hidens'"),
        ({"lr": tune.grid_search([1e-3, -1.0])}, "config.lr must be"),
        ({"gamma": tune.uniform(0.9, 1.2)}, "(gamma = 1.2 of uniform(0.9, 1.2))"),
        ({"gamma": tune.randn(0.99, 0.01)}, "got -inf (gamma = -inf of randn(0.99, 0.01))"),
        ({"num_epochs": tune.randint(0, 3)}, "config.num_epochs must be"),
        ({"evaluation_interval": -1}, "config.evaluation_interval must be None or an integer >= 1"),
        ({"evaluation_interval": tune.grid_search([2, 0])}, "config.evaluation_interval must be"),
        (
            {"evaluation_interval": tune.choice([1, -2])},
            "config.evaluation_interval must be None or an integer >= 1, got -2 "
            "(evaluation_interval = -2 of choice([1, -2]))",
        ),
        (
            {"evaluation_duration_unit": tune.choice(["episodes", "days"])},
            "config.evaluation_duration_unit must be one of",
        ),
    ],
)
def test_a_search_space_out_of_a_keys_range_is_one_line_naming_it(space, named):
    with pytest.raises(ConfigError) as err:
        check_search_space(PPOConfig, {**TINY, **space})
    assert named in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("by", ["name", "class", "subclass"])
@pytest.mark.parametrize(
    "space, named",
    [
        ({"lrr": tune.grid_search([1e-3, 1e-4])}, "param_space: unknown config key 'lrr'"),
        # a range drawn trial by trial: only some of its values are out of gamma's range
        ({"gamma": tune.uniform(0.9, 1.2)}, "param_space: config.gamma must be"),
    ],
)
def test_a_tuner_of_an_algorithm_refuses_a_bad_param_space_when_made(by, space, named, tmp_path):
    """tune.Tuner itself, before any trial (no Ray is running here): one line naming
    the key; a space that fits makes a Tuner, and other trainables are left alone."""
    register_trainables()
    trainable_cls = {
        "name": "policy_service.PPO",
        "class": trainable(PPO),
        "subclass": PlacementProbe,
    }[by]
    run_config = tune.RunConfig(storage_path=str(tmp_path))
    with pytest.raises(ConfigError) as err:
        tune.Tuner(trainable_cls, param_space={**TINY, **space}, run_config=run_config)
    assert str(err.value).startswith(named) and "\n" not in str(err.value)
    assert not ray.is_initialized()
    fits = {**TINY, "gamma": tune.uniform(0.9, 0.99)}
    tune.Tuner(trainable_cls, param_space=fits, run_config=run_config)
    tune.Tuner(lambda config: None, param_space={"lrr": 1}, run_config=run_config)


def test_a_pbt_mutation_out_of_a_keys_range_is_one_line_naming_it():
    with pytest.raises(ConfigError) as err:
        population_based_training(PPOConfig, {"gamma": tune.uniform(0.9, 1.5)}, TINY)
    message = str(err.value)
    assert message.startswith("PBT mutation: config.gamma must be") and "\n" not in message
    with pytest.raises(ConfigError, match="'lrr'"):
        population_based_training(PPOConfig, {"lrr": [1e-3, 1e-4]}, TINY)


def test_an_algorithm_class_stands_for_its_config_class():
    """Both took the Algorithm class (PPO) before the config classes loaded without
    TensorFlow; callers written then still get the one-line refusal."""
    from algorithms.ppo import PPO

    with pytest.raises(ConfigError, match="config.gamma must be"):
        check_search_space(PPO, {**TINY, "gamma": tune.uniform(0.9, 1.2)})
    with pytest.raises(ConfigError, match="^PBT mutation: config.gamma must be"):
        population_based_training(PPO, {"gamma": tune.uniform(0.9, 1.5)}, TINY)


def test_pbt_explore_stays_inside_each_mutations_range():
    clamp = ClampToMutations({"gamma": tune.uniform(0.9, 0.999), "num_epochs": tune.randint(1, 4)})
    assert clamp({"gamma": 0.999 * 1.2, "num_epochs": 7, "lr": 5.0}) == {
        "gamma": 0.999,
        "num_epochs": 3,
        "lr": 5.0,
    }
    assert clamp({"gamma": 0.9 * 0.8, "num_epochs": 0})["gamma"] == 0.9


def test_yaml_search_space_words_and_bad_leaves():
    space = search_space_from_yaml(
        {
            "lr": {"loguniform": [1e-4, 1e-2]},
            "num_epochs": {"grid_search": [1, 2]},
            "model": {"fcnet_hiddens": {"choice": [[16], [32]]}},
            "train_batch_size": {"randint": [256, 1024]},
            "gamma": {"uniform": [0.9, 0.99]},
        },
        "--search s.yaml",
    )
    assert space["num_epochs"] == {"grid_search": [1, 2]}
    assert space["lr"].lower == 1e-4 and space["train_batch_size"].upper == 1024
    check_search_space(PPOConfig, {**TINY, **space})
    for bad, named in (
        ({"lr": 0.1}, "--search s.yaml: lr must be a mapping of one of"),
        ({"lr": {"uniform": [1]}}, "--search s.yaml: lr: uniform takes [low, high]"),
        ({"model": {"x": {"randint": [1.5, 3]}}}, "--search s.yaml: model.x: randint takes"),
    ):
        with pytest.raises(ConfigError) as err:
            search_space_from_yaml(bad, "--search s.yaml")
        assert str(err.value).startswith(named)


def test_tune_command_refuses_bad_search_before_ray_starts(tmp_path, capsys):
    from policy_service.cli.commands import main

    search = tmp_path / "space.yaml"
    search.write_text("lrr:\n  grid_search: [0.001, 0.0001]\n")
    status = main(["tune", "ppo", "--env", "CartPole-v1", "--search", str(search)])
    err = capsys.readouterr().err.strip()
    assert status == 2
    assert err.startswith(f"policy-service: error: --search {search}: unknown config key 'lrr'")
    assert "\n" not in err
    assert not ray.is_initialized()
    search.write_text("gamma:\n  uniform: [0.9, 1.1]\n")
    status = main(
        ["tune", "ppo", "--env", "CartPole-v1", "--search", str(search), "--scheduler", "pbt"]
    )
    assert status == 2 and "config.gamma must be" in capsys.readouterr().err


def test_a_logger_whose_package_is_missing_is_one_line(tmp_path, capsys):
    from policy_service.cli.commands import main

    if importlib.util.find_spec("mlflow") is not None:
        pytest.skip("mlflow is installed here")
    status = main(["tune", "ppo", "--env", "CartPole-v1", "--mlflow-uri", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert status == 2
    assert (
        err == "policy-service: error: --mlflow-uri: mlflow is not installed (pip install mlflow)"
    )


# ----- sweeps on the module's Ray ---------------------------------------------------


@pytest.fixture(scope="module")
def tune_ray(ray_local):
    """The module's Ray, with this module's trainables sent to trials by value."""
    register_trainables()  # into this Ray's store (an earlier Ray's went with it)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def _tuner(
    trainable_cls,
    space,
    path: Path,
    stop: dict,
    keep=1,
    metric="episode_return_mean",
    **tune_config,
) -> tune.Tuner:
    return tune.Tuner(
        trainable_cls,
        param_space=space,
        tune_config=tune.TuneConfig(metric=metric, mode="max", **tune_config),
        run_config=tune.RunConfig(
            storage_path=str(path),
            name="sweep",
            stop=stop,
            checkpoint_config=tune.CheckpointConfig(
                num_to_keep=keep,
                checkpoint_score_attribute=metric,
                checkpoint_at_end=True,
            ),
            verbose=0,
        ),
    )


EVALUATED = "evaluation/episode_return_mean"  # the greedy evaluation's mean return
EVALUATING = {  # each iteration ends with an evaluation, greedy, episodes seeded seed + i
    "evaluation_interval": 1,
    "evaluation_duration": 3,
    "evaluation_config": {"explore": False},
}


@pytest.mark.slow
def test_a_grid_of_four_trials_and_the_best_checkpoint_evaluates_to_its_return(
    tune_ray, tmp_path, capsys
):
    """The sweep chooses by the evaluation return, and `policy-service evaluate` of the
    best checkpoint (the config's seed, as many episodes, greedy) gives exactly it."""
    from algorithms import evaluation

    space = {
        **TINY,
        **EVALUATING,
        "lr": tune.grid_search([3e-3, 1e-3]),
        "num_epochs": tune.grid_search([2, 4]),
    }
    check_search_space(PPOConfig, space)
    results = _tuner(
        "policy_service.PPO",
        space,
        tmp_path,
        stop={EVALUATED: 100, "training_iteration": 15},
        metric=EVALUATED,
    ).fit()
    assert not results.errors and len(results) == 4
    grid = sorted((r.config["lr"], r.config["num_epochs"]) for r in results)
    assert grid == [(1e-3, 2), (1e-3, 4), (3e-3, 2), (3e-3, 4)]
    best = results.get_best_result()
    assert best.metrics[EVALUATED] == max(r.metrics[EVALUATED] for r in results)
    assert best.metrics[EVALUATED] >= 100  # it learned: a random policy's return is ~22
    for result in results:  # Tune's loggers: TensorBoard, CSV, JSON
        names = [p.name for p in Path(result.path).iterdir()]
        assert "progress.csv" in names and "result.json" in names
        assert any(name.startswith("events.out.tfevents") for name in names)
    [(checkpoint, reported)] = best.best_checkpoints  # keep=1: the best by EVALUATED
    assert checkpoint.path == best.get_best_checkpoint(EVALUATED, "max").path
    assert (Path(checkpoint.path) / LINEAGE_FILE).exists()
    [saved] = list_checkpoints(Path(checkpoint.path))  # the algorithm's, named by its iteration
    assert saved.name == f"checkpoint_{reported['training_iteration']:06d}"
    for path in (checkpoint.path, saved):  # Tune's directory, and the algorithm's in it
        capsys.readouterr()
        episodes = EVALUATING["evaluation_duration"]
        evaluation.evaluate(str(path), episodes=episodes, seed=TINY["seed"])
        evaluated = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert evaluated["episode_returns"] == reported["evaluation/episode_returns"]
        assert evaluated["episode_return_mean"] == reported[EVALUATED]  # bit for bit


@pytest.mark.slow
def test_asha_stops_the_trial_with_a_bad_lr_early(tune_ray, tmp_path):
    from ray.tune.schedulers import ASHAScheduler

    # one trial at a time, the good lr first: the bad one meets its rung after it
    space = {**TINY, "lr": tune.grid_search([3e-3, 1e-8])}
    scheduler = ASHAScheduler(
        time_attr="training_iteration", max_t=8, grace_period=4, reduction_factor=2
    )
    results = _tuner(
        trainable(PPO), space, tmp_path, stop={}, scheduler=scheduler, max_concurrent_trials=1
    ).fit()
    assert not results.errors
    iterations = {r.config["lr"]: r.metrics["training_iteration"] for r in results}
    assert iterations == {3e-3: 8, 1e-8: 4}


@pytest.mark.slow
def test_pbt_exploits_another_trials_checkpoint_and_keeps_lr_in_range(tune_ray, tmp_path):
    mutations = {"lr": tune.loguniform(1e-5, 1e-2)}
    space = {**TINY, "lr": tune.grid_search([3e-3, 1e-5])}
    scheduler = population_based_training(
        PPOConfig,
        mutations,
        space,
        time_attr="training_iteration",
        perturbation_interval=1,
        quantile_fraction=0.5,
        synch=True,
    )
    results = _tuner(
        trainable(PPO),
        space,
        tmp_path,
        # one perturbation (after iteration 1; two trials at quantile 0.5: one is
        # exploited even on a tie) and an iteration run with the explored lr
        {"training_iteration": 2},
        keep=4,
        scheduler=scheduler,
        reuse_actors=True,
    ).fit()
    assert not results.errors and len(results) == 2
    ids = {r.metrics["trial_id"] for r in results}
    lineages = {r.metrics["trial_id"]: r.metrics["checkpoint_lineage"].split(",") for r in results}
    exploited = [r for r in results if lineages[r.metrics["trial_id"]][0] != r.metrics["trial_id"]]
    assert exploited, lineages
    for result in exploited:
        lineage = lineages[result.metrics["trial_id"]]
        assert lineage[-1] == result.metrics["trial_id"] and set(lineage) <= ids
    for result in results:
        lr = result.config["lr"]
        assert 1e-5 <= lr <= 1e-2
        # what the optimizer ran with is the explored lr, not the donor's
        assert result.metrics["cur_lr"] == pytest.approx(lr, rel=1e-6)


class PlacementProbe(trainable(PPO)):  # type: ignore[misc]
    """PPO's trainable reporting which placement group its learner actor runs in."""

    def step(self):
        result = super().step()
        learner = self.algo.learners.actors[0]
        result["trial_group"] = ray.util.get_current_placement_group().id.hex()
        result["learner_group"] = ray.get(
            learner.__ray_call__.remote(
                lambda _: ray.get_runtime_context().get_placement_group_id()
            )
        )
        return result


@pytest.mark.slow
def test_a_trials_learner_actor_runs_in_the_trials_placement_group(tune_ray, tmp_path):
    # 0.5 CPU: the driver's bundle (1) and the learner's fit the 2-CPU Ray with room to
    # spare, which Algorithm's cluster check (resources.check_cluster_fits) still asks for
    space = {**TINY, "num_learners": 1, "num_cpus_per_learner": 0.5}
    assert PlacementProbe.default_resource_request(space).bundles == [{"CPU": 1.0}, {"CPU": 0.5}]
    results = _tuner(PlacementProbe, space, tmp_path, {"training_iteration": 1}).fit()
    assert not results.errors
    metrics = results[0].metrics
    assert metrics["num_learners"] == 1
    assert metrics["learner_group"] == metrics["trial_group"]


@pytest.mark.slow
def test_a_trial_whose_bundles_hold_the_whole_cluster_starts_its_env_runner(tune_ray, tmp_path):
    """The trial's placement group reserved the driver's CPU and the runner's: the
    algorithm's cluster check must not wait for them to be free again (they never are)."""
    space = {**TINY, "num_env_runners": 1, "num_cpus_per_env_runner": 1}
    results = _tuner("policy_service.PPO", space, tmp_path, {"training_iteration": 1}).fit()
    assert not results.errors
    assert results[0].metrics["training_iteration"] == 1


@pytest.mark.slow
def test_the_tune_command_samples_with_asha_and_its_best_checkpoint_is_what_commands_take(
    tune_ray, tmp_path, capsys, monkeypatch
):
    """`policy-service tune` in the module's Ray: --num-samples 2 trials, --scheduler asha,
    Tune's progress table; the best trial (by --metric, the greedy evaluation's return),
    config and checkpoint it prints at the end; `evaluate` of that checkpoint gives the
    printed return, and `export` and `serve` (its checkpoint loading) take it."""
    from cli_processes import finish, start

    from policy_service.cli.commands import main
    from policy_service.serving import server

    config = tmp_path / "base.yaml"
    config.write_text(
        "seed: 0\ntrain_batch_size: 256\nminibatch_size: 64\nnum_epochs: 1\n"
        "model: {fcnet_hiddens: [16]}\n"
        "evaluation_interval: 1\nevaluation_duration: 3\nevaluation_config: {explore: false}\n"
    )
    search = tmp_path / "space.yaml"
    search.write_text("lr: {loguniform: [1.0e-4, 1.0e-2]}\n")
    sweep = tmp_path / "sweep"
    code, out, err = finish(
        start(
            "tune",
            "ppo",
            "--env",
            "CartPole-v1",
            "--config",
            str(config),
            "--search",
            str(search),
            "--num-samples",
            "2",
            "--scheduler",
            "asha",
            "--stop-iters",
            "2",
            "--metric",
            EVALUATED,
            "--output-dir",
            str(sweep),
            joined=True,
        )
    )
    assert code == 0, err[-3000:]
    # Tune's box and progress table: the scheduler, the trials sampled, their states
    assert re.search(r"Scheduler +AsyncHyperBandScheduler", out), out[-3000:]
    assert re.search(r"Number of trials +2\b", out), out[-3000:]
    assert "Trial status: 2 TERMINATED" in out, out[-3000:]
    trials = sorted(d for d in sweep.iterdir() if d.is_dir())
    assert len(trials) == 2
    for trial in trials:
        assert 1e-4 <= json.loads((trial / "params.json").read_text())["lr"] <= 1e-2
    printed = dict(
        line.split(":", 1) for line in out.splitlines()[-4:] if line.split(":", 1)[0].strip()
    )
    best_name, metric, value = printed["best trial"].split()
    [best] = [trial for trial in trials if trial.name == best_name]
    assert metric == EVALUATED
    # the metric its checkpoint (the last iteration's: Tune's checkpoint at the end) reported
    last = json.loads((best / "result.json").read_text().splitlines()[-1])
    assert (last["training_iteration"], last[EVALUATED]) == (2, float(value))
    assert json.loads(printed["config"]) == json.loads((best / "params.json").read_text())
    checkpoint = printed["checkpoint"].strip()
    assert Path(checkpoint).parent.parent == best  # Tune's checkpoint_*/ holds the algorithm's
    assert Path(checkpoint).name == "checkpoint_000002"
    assert printed["evaluate"].strip() == f"policy-service evaluate {checkpoint}"

    capsys.readouterr()
    assert main(["evaluate", checkpoint, "--episodes", "3", "--seed", "0"]) == 0
    evaluated = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert evaluated["checkpoint"] == checkpoint
    assert evaluated["episode_return_mean"] == float(value)  # exactly what it reported
    exported = tmp_path / "exported"
    assert main(["export", checkpoint, "--out", str(exported)]) == 0
    assert (exported / "saved_model.pb").exists()
    served = []  # serve loads the policy, then run_server would start Ray Serve: stopped there
    monkeypatch.setattr(
        server,
        "run_server",
        lambda state, *args, announce="", **kwargs: served.append((state, announce)) or 0,
    )
    token = tmp_path / "token"
    token.write_text("a-token\n")
    assert main(["serve", checkpoint, "--token-file", str(token)]) == 0
    [(state, announce)] = served
    assert announce.startswith(f"policy {checkpoint};")
    assert state["config"]["lr"] == json.loads(printed["config"])["lr"]  # the best trial's


def _trial_states(sweep: Path) -> dict[str, str]:
    """trial id -> status, from Tune's newest experiment state file in `sweep`."""
    states: dict[str, str] = {}
    for path in sorted(sweep.glob("experiment_state-*.json")):
        try:
            trials = json.loads(path.read_text())["trial_data"]
        except (ValueError, KeyError):
            continue  # being written
        states = {info["trial_id"]: info["status"] for info in (json.loads(t[0]) for t in trials)}
    return states


@pytest.mark.slow
def test_a_killed_sweep_resumes_and_finished_trials_are_not_rerun(tune_ray, tmp_path, capsys):
    import subprocess

    from tune_gates import HELD_LR

    from policy_service.cli.commands import main

    config = tmp_path / "base.yaml"
    config.write_text(
        "seed: 0\ntrain_batch_size: 256\nminibatch_size: 64\nnum_epochs: 1\n"
        "model: {fcnet_hiddens: [16]}\ncallbacks: tune_gates.HoldSecondTrial\n"
    )
    search = tmp_path / "space.yaml"
    search.write_text(f"lr:\n  grid_search: [0.003, {HELD_LR}]\n")
    sweep = tmp_path / "sweep"
    command = [
        str(Path(sys.executable).parent / "policy-service"),
        "tune", "ppo", "--env", "CartPole-v1", "--config", str(config),
        "--search", str(search), "--max-concurrent", "1", "--stop-iters", "2",
        "--output-dir", str(sweep), "--import", "tune_gates",
    ]  # fmt: skip
    process = subprocess.Popen(
        command,
        cwd=TESTS,
        env={**command_env(), "TUNE_GATE_DIR": str(tmp_path)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:

        def sweep_errors() -> str:  # read only once the sweep has exited
            return process.stderr.read()[-3000:] if process.poll() is not None else ""

        wait_until(
            lambda: (tmp_path / "held").exists(),
            "the second trial",
            240.0,
            poll_s=0.2,
            process=process,
            output=sweep_errors,
        )
        wait_until(
            lambda: sorted(_trial_states(sweep).values()) == ["RUNNING", "TERMINATED"],
            "experiment state with the first trial finished",
            240.0,
            poll_s=0.2,
            process=process,
            output=sweep_errors,
        )
    finally:
        kill_group(process)
        process.communicate()
    finished = next(d for d in sweep.iterdir() if "lr=0.0030" in d.name)
    rows_before = (finished / "result.json").read_text()

    capsys.readouterr()
    status = main(["tune", "--resume", str(sweep), "--import", "tune_gates"])
    out = capsys.readouterr().out
    assert status == 0
    assert sorted(_trial_states(sweep).values()) == ["TERMINATED", "TERMINATED"]
    assert (finished / "result.json").read_text() == rows_before  # not run again
    held = next(d for d in sweep.iterdir() if d.is_dir() and d != finished)
    rows = [json.loads(line) for line in (held / "result.json").read_text().splitlines()]
    assert [row["training_iteration"] for row in rows][-1] == 2
    best = out.split("checkpoint:")[1].split()[0]
    assert (Path(best) / "algorithm_state.json").exists()  # what `evaluate` takes
    assert os.path.commonpath([best, str(sweep)]) == str(sweep)

"""`policy-service train / evaluate / export` end to end, as subprocesses.

Tiny budgets: PPO on CartPole-v1 with 256-step train batches. The first run
uses two fake GPUs; the resume test uses a rollout worker actor, so it runs
on an embedded Ray and is SIGKILLed with Ray's processes around it.
Independent commands run at once: each spends most of its time importing
TensorFlow.
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

CLI = str(Path(sys.executable).parent / "policy-service")
TIMEOUT_S = 300
TINY = ["--set", "train_batch_size=256", "--set", "minibatch_size=64",
        "--set", "num_epochs=2", "--set", "model.fcnet_hiddens=[32,32]"]


_RAY_TOKEN_FILE: list[Path] = []  # this module's own Ray token, not ~/.ray's


@pytest.fixture(scope="module", autouse=True)
def ray_token(tmp_path_factory):
    path = tmp_path_factory.mktemp("ray") / "token"
    path.write_text(secrets.token_hex(32))
    _RAY_TOKEN_FILE[:] = [path]
    yield path
    _RAY_TOKEN_FILE.clear()


def _env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    if _RAY_TOKEN_FILE:
        env["RAY_AUTH_TOKEN_PATH"] = str(_RAY_TOKEN_FILE[0])
    return env


def _start(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([CLI, *args], env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


def _finish(process: subprocess.Popen) -> tuple[int, str, str]:
    try:
        out, err = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"timed out: {process.args}\n{err[-3000:]}")
    return process.returncode, out, err


def _run(*args: str) -> tuple[int, str, str]:
    return _finish(_start(*args))


def _progress(run_dir: Path) -> list[dict]:
    """The rows of progress.jsonl (a line being written right now is left out)."""
    path = run_dir / "progress.jsonl"
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            rows.append(json.loads(line))
        except ValueError:
            break
    return rows or [{"iteration": 0}]


def _kill_group(process: subprocess.Popen) -> None:
    """SIGKILL what is left of a run started in its own session (Ray's helpers)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# ----- a short run on two fake GPUs, then its checkpoint evaluated and exported -------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("runs") / "cartpole"
    code, out, err = _run("train", "ppo", "--env", "CartPole-v1", "--stop-iters", "2",
                          "--num-gpus", "2", "--fake-gpus", "--num-env-runners", "1", "--seed", "0",
                          "--output-dir", str(run_dir), *TINY)
    assert code == 0, err
    assert str(run_dir / "checkpoints" / "checkpoint_000002") in out
    assert str(run_dir / "tensorboard") in out
    return run_dir


def test_train_writes_progress_result_and_config(trained):
    rows = _progress(trained)
    assert [r["iteration"] for r in rows] == [1, 2]
    for row in rows:
        for key in ("timesteps_total", "episode_return_mean", "time_total_s", "policy_loss"):
            assert key in row, key
    assert rows[1]["timesteps_total"] > rows[0]["timesteps_total"] >= 256
    result = json.loads((trained / "result.json").read_text())
    assert result["stop_reason"] == "stop_iters"
    assert result["iteration"] == 2
    config = json.loads((trained / "config.json").read_text())
    assert (config["num_gpus"], config["_fake_gpus"]) == (2, True)
    assert config["model"]["fcnet_hiddens"] == [32, 32]
    assert config["train_batch_size"] == 256


def test_result_records_the_resources_of_the_driver_learner_and_the_env_runner(trained):
    resources = json.loads((trained / "result.json").read_text())["resources"]
    driver = resources["driver"]
    assert driver["holds_learner"] and driver["devices"] == ["/CPU:0", "/CPU:1"]
    assert driver["CPU"] is None and driver["gpu_ids"] is None  # Ray reserves no driver
    [runner] = resources["env_runners"]
    assert (runner["CPU"], runner["GPU"], runner["gpu_ids"]) == (0.5, 0.0, [])
    assert runner["devices"] == ["/CPU:0"] and runner["pid"] != driver["pid"]
    assert resources["learners"] == [] and resources["inference_actor"] is None


def test_result_records_the_learner_actor_and_inference_actor_resources(tmp_path):
    """One learner actor on 2 fake GPUs, sampling in the driver through a PolicyActor;
    beside it, a PolicyActor asking for a GPU this machine's Ray lacks fails at once."""
    run_dir = tmp_path / "actors"
    run = _start("train", "ppo", "--env", "CartPole-v1", "--stop-iters", "1", "--fake-gpus",
                 "--set", "num_learners=1", "--set", "num_gpus_per_learner=2",
                 "--set", "num_cpus_per_learner=0.5", "--set", "remote_inference=true",
                 "--seed", "0", "--output-dir", str(run_dir), *TINY)
    too_big = _start("train", "ppo", "--env", "CartPole-v1", "--stop-iters", "1",
                     "--set", "remote_inference=true", "--set", "num_gpus_per_policy_actor=1",
                     "--output-dir", str(tmp_path / "too_big"), *TINY)
    code, _, err = _finish(run)
    assert code == 0, err
    code_too_big, _, err_too_big = _finish(too_big)
    assert code_too_big == 2, err_too_big
    assert err_too_big.strip().splitlines()[-1] == (
        "policy-service: error: the PolicyActor needs GPU 1 (num_gpus_per_policy_actor=1); "
        "the cluster has GPU 0 (0 available)")
    resources = json.loads((run_dir / "result.json").read_text())["resources"]
    assert not resources["driver"]["holds_learner"] and resources["driver"]["devices"] is None
    [learner] = resources["learners"]
    assert (learner["CPU"], learner["GPU"], learner["gpu_ids"]) == (0.5, 0.0, [])
    assert learner["devices"] == ["/CPU:0", "/CPU:1"]  # the actor's two fake-GPU towers
    inference = resources["inference_actor"]
    assert (inference["CPU"], inference["GPU"], inference["devices"]) == (1.0, 0.0, ["/CPU:0"])
    [runner] = resources["env_runners"]  # the driver's own sampler, acting remotely
    assert runner["in_driver"] and runner["devices"] is None
    assert len({learner["pid"], inference["pid"], resources["driver"]["pid"]}) == 3


@pytest.mark.slow  # two runs with a learner actor, one after the other
def test_resume_with_a_learner_actor_checks_the_checkpoint_against_its_policy(tmp_path):
    """The checkpoint is checked against the learner actor's policy (there is no
    local one) before the run goes on from it."""
    run_dir = tmp_path / "run"
    args = ("train", "ppo", "--env", "CartPole-v1", "--set", "num_learners=1",
            "--set", "num_cpus_per_learner=0.5", "--seed", "0", *TINY)
    code, _, err = _finish(_start(*args, "--stop-iters", "1", "--output-dir", str(run_dir)))
    assert code == 0, err
    code, _, err = _finish(_start(*args, "--stop-iters", "2", "--resume", str(run_dir)))
    assert code == 0, err
    assert "from checkpoint_000001 (iteration 1)" in err
    assert [row["iteration"] for row in _progress(run_dir)] == [1, 2]
    # a state only the policy can refuse (a weight of another shape): the learner actor's
    # check names it in one line, and the resume falls back to the checkpoint before
    import numpy as np

    from policy_service.io import checkpoints
    arrays_file = (run_dir / "checkpoints" / "checkpoint_000002" / checkpoints.POLICY_SUBDIR
                   / checkpoints.POLICY_ARRAYS)
    arrays = checkpoints.load_arrays(arrays_file)
    weight = sorted(k for k in arrays if k.startswith("weights/"))[0]
    checkpoints.save_arrays(arrays_file, {**arrays, weight: np.zeros((3, 3), np.float32)})
    code, _, err = _finish(_start(*args, "--stop-iters", "2", "--resume", str(run_dir)))
    assert code == 0, err
    [skipped] = [line for line in err.splitlines() if "skipped" in line]
    assert skipped.startswith("policy-service: skipped checkpoint_000002: ") and \
        "has shape (3, 3), expected" in skipped and "Traceback" not in err, err
    assert "ray::" not in skipped and "pid=" not in skipped, skipped  # the actor's error itself
    assert "from checkpoint_000001 (iteration 1)" in err


def test_train_writes_a_checkpoint_and_tensorboard_scalars(trained):
    checkpoint = trained / "checkpoints" / "checkpoint_000002"
    assert (checkpoint / "algorithm_state.json").exists()
    assert (checkpoint / "policy" / "policy_state.json").exists()
    import tensorflow as tf
    events = list((trained / "tensorboard").glob("events.out.tfevents.*"))
    assert events
    scalars = {}
    for event in tf.compat.v1.train.summary_iterator(str(events[0])):
        for value in event.summary.value:
            scalars.setdefault(value.tag, []).append(event.step)
    assert scalars["episode_return_mean"] == [1, 2]
    assert scalars["policy_loss"] == [1, 2]


def test_evaluate_and_export_the_checkpoint(trained, tmp_path):
    evaluate = _start("evaluate", str(trained), "--episodes", "3")
    export = _start("export", str(trained / "checkpoints" / "checkpoint_000002"),
                    "--out", str(tmp_path / "saved"))
    code, out, err = _finish(evaluate)
    assert code == 0, err
    stats = json.loads(out.strip().splitlines()[-1])
    assert stats["episodes"] == 3 and stats["env"] == "CartPole-v1"
    assert len(stats["episode_lengths"]) == 3
    assert (stats["episode_return_min"] <= stats["episode_return_mean"]
            <= stats["episode_return_max"])
    # CartPole: +1 a step
    assert stats["episode_returns"] == [float(n) for n in stats["episode_lengths"]]
    code, out, err = _finish(export)
    assert code == 0, err
    assert (tmp_path / "saved" / "saved_model.pb").exists()


# ----- resume after SIGKILL, then SIGTERM ----------------------------------------------------


def _wait_until(condition, process: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        if process.poll() is not None:
            pytest.fail(f"run exited ({process.returncode}) before {what}:\n"
                        f"{process.communicate()[1][-3000:]}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _checkpoints(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").glob("checkpoint_*"))


@pytest.mark.slow
def test_resume_after_sigkill_continues_from_the_last_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    args = ["train", "ppo", "--env", "CartPole-v1", "--seed", "1", "--checkpoint-every", "2",
            "--stop-iters", "200", "--output-dir", str(run_dir), *TINY]
    first = _start(*args, start_new_session=True)
    try:
        _wait_until(lambda: _checkpoints(run_dir), first, "the first checkpoint")
        first.kill()  # SIGKILL: no chance to checkpoint again or write result.json
        first.communicate(timeout=60)
    finally:
        _kill_group(first)
    assert not (run_dir / "result.json").exists()
    latest = _checkpoints(run_dir)[-1]
    saved_iteration = int(latest.split("_")[1])
    killed_rows = _progress(run_dir)  # may run past the checkpoint: those are redone
    before = killed_rows[:saved_iteration]
    # An iteration number the killed run never reached: written by the resumed run.
    target = max(saved_iteration + 2, len(killed_rows) + 1)

    # The same command plus --resume; then SIGTERM once it is past the killed run.
    second = _start(*args, "--resume", str(run_dir), start_new_session=True)
    try:
        _wait_until(lambda: _progress(run_dir)[-1]["iteration"] >= target, second,
                    f"iteration {target}")
        second.send_signal(signal.SIGTERM)
        code, out, err = _finish(second)
    finally:
        _kill_group(second)
    assert code == 0, err
    assert f"from {latest} (iteration {saved_iteration})" in err

    rows = _progress(run_dir)
    assert [r["iteration"] for r in rows] == list(range(1, len(rows) + 1))  # no gap, no repeat
    assert rows[:saved_iteration] == before  # what the checkpoint holds is kept as it was
    assert len(rows) >= saved_iteration + 2
    steps = [r["timesteps_total"] for r in rows]
    assert all(a < b for a, b in zip(steps, steps[1:]))
    result = json.loads((run_dir / "result.json").read_text())
    assert result["stop_reason"] == "interrupted"
    assert result["iteration"] == rows[-1]["iteration"]
    assert Path(result["checkpoint"]).name == f"checkpoint_{rows[-1]['iteration']:06d}"
    assert _checkpoints(run_dir)[-1] == Path(result["checkpoint"]).name
    assert len(_checkpoints(run_dir)) <= 3  # the latest few are kept


# ----- bad input: one line on stderr, no traceback -------------------------------------------


BAD_INPUT = {
    "unknown_algorithm": (["train", "nosuchalgo", "--env", "CartPole-v1"], "nosuchalgo"),
    "unknown_env": (["train", "ppo", "--env", "NoSuchEnv-v0"], "NoSuchEnv-v0"),
    "unknown_set_key": (["train", "ppo", "--env", "CartPole-v1", "--set", "lrr=0.1"], "lrr"),
    "unreadable_config": (["train", "ppo", "--env", "CartPole-v1", "--config",
                           "/nonexistent/ppo.yaml"], "/nonexistent/ppo.yaml"),
}


@pytest.fixture(scope="module")
def bad_input_results(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("bad")
    running = {name: _start(*args, "--output-dir", str(out_dir / name))
               for name, (args, _) in BAD_INPUT.items()}
    return {name: _finish(process) for name, process in running.items()}


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_bad_input_is_one_clear_line(bad_input_results, case):
    code, out, err = bad_input_results[case]
    lines = err.strip().splitlines()
    assert code != 0
    assert "Traceback" not in err
    assert len(lines) == 1, err
    assert lines[0].startswith("policy-service: error:")
    assert BAD_INPUT[case][1] in lines[0]


# The same handling in this process, for more kinds of bad input (no TF import per case).
MORE_BAD_INPUT = {
    "bad_set_value": (["train", "ppo", "--env", "CartPole-v1", "--set", "lr=fast"], "config.lr"),
    "set_without_value": (["train", "ppo", "--env", "CartPole-v1", "--set", "lr"], "key=value"),
    "set_into_a_number": (["train", "ppo", "--env", "CartPole-v1", "--set", "lr.x=1"], "lr"),
    "bad_nested_key": (["train", "ppo", "--env", "CartPole-v1",
                        "--set", "model.fcnet_hidens=[8]"], "fcnet_hidens"),
    "no_env": (["train", "ppo"], "--env"),
    "config_not_a_mapping": (["train", "ppo", "--env", "CartPole-v1", "--config", "{list}"],
                             "mapping"),
    "resume_nothing": (["train", "--resume", "{missing}"], "no run there"),
    "evaluate_nothing": (["evaluate", "{missing}"], "no checkpoint"),
    "submit_without_command": (["submit", "--address", "http://127.0.0.1:9"], "no command"),
}


@pytest.mark.parametrize("case", sorted(MORE_BAD_INPUT))
def test_more_bad_input_is_one_clear_line(case, tmp_path, capsys):
    from policy_service.cli import commands as cli
    args, expected = MORE_BAD_INPUT[case]
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n- 2\n")
    args = [a.format(list=listing, missing=tmp_path / "missing") for a in args]
    code = cli.main(args + (["--output-dir", str(tmp_path / "run")] if args[0] == "train" else []))
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("policy-service: error:"), err
    assert expected in lines[0]


# ----- config errors that used to surface late: one line, exit 2, as real commands -------------


LATE_CONFIG_ERRORS = {
    "optimizer_adamw": (["--set", "optimizer=adamw"],
                        "config.optimizer must be one of ['adam', 'sgd', 'rmsprop'], got 'adamw'"),
    "num_gpus_flag_negative": (["--num-gpus", "-1"], "config.num_gpus must be a finite number "
                               ">= 0, and a whole number when above 1, got -1.0"),
    "num_gpus_fraction_above_one": (["--set", "num_gpus=1.5"], "config.num_gpus must be"),
    "grad_clip_method_bogus": (["--set", "grad_clip_method=bogus"],
                               "config.grad_clip_method must be one of"),
    "fcnet_hiddens_zero": (["--set", "model.fcnet_hiddens=[0]"],
                           "config.model.fcnet_hiddens must be a list of integers >= 1, got [0]"),
    "fcnet_activation_unknown": (["--set", "model.fcnet_activation=nope"],
                                 "config.model.fcnet_activation must be the name of a Keras"),
    "exploration_type_unknown": (["--set", "exploration_config={type: Bogus}"],
                                 "config.exploration_config must be a dict whose 'type'"),
    "env_config_unknown_key": (["--set", "env_config={nope: 1}"],
                               "config.env_config key(s) ['nope'] are not options of CartPole-v1"),
    "lr_nan": (["--set", "lr=.nan"], "config.lr must be a finite number > 0, got nan"),
    "lr_negative": (["--set", "lr=-1"], "config.lr must be a finite number > 0, got -1"),
    "lr_zero": (["--set", "lr=0"], "config.lr must be a finite number > 0, got 0"),
    "grad_clip_zero": (["--set", "grad_clip=0"], "config.grad_clip must be None or a finite "
                       "number > 0, got 0"),
    "grad_clip_negative": (["--set", "grad_clip=-1"], "config.grad_clip must be None or"),
    "gamma_above_one": (["--set", "gamma=1.5"],
                        "config.gamma must be a finite number in [0, 1], got 1.5"),
    "gamma_negative": (["--set", "gamma=-0.1"], "config.gamma must be a finite number in [0, 1]"),
    "adam_epsilon_negative": (["--set", "adam_epsilon=-1"],
                              "config.adam_epsilon must be a finite number > 0, got -1"),
}
AT_ONCE = 3  # subprocesses at a time: each is mostly TensorFlow's import, on 2 shared cores


@pytest.fixture(scope="module")
def cartpole_policy_dir(tmp_path_factory) -> Path:
    """A PPO policy for CartPole-v1 spaces, as TFPolicy.export_checkpoint writes it."""
    import gymnasium as gym

    from algorithms.ppo import PPOPolicy
    env = gym.make("CartPole-v1")
    policy = PPOPolicy(env.observation_space, env.action_space,
                       {"model": {"fcnet_hiddens": [8]}, "seed": 0})
    directory = tmp_path_factory.mktemp("policy") / "cartpole_policy"
    policy.export_checkpoint(str(directory))
    return directory


@pytest.fixture(scope="module")
def late_config_results(tmp_path_factory, cartpole_policy_dir):
    """Every case as a real `policy-service` command -> (exit code, stdout, stderr, seconds,
    output dir). A case that is not caught would train one tiny iteration and exit 0."""
    out_dir = tmp_path_factory.mktemp("late")
    commands = {name: ["train", "ppo", "--env", "CartPole-v1", "--stop-iters", "1",
                       "--output-dir", str(out_dir / name), *TINY, *args]
                for name, (args, _) in LATE_CONFIG_ERRORS.items()}
    commands["evaluate_on_other_spaces"] = ["evaluate", str(cartpole_policy_dir),
                                            "--env", "MountainCar-v0", "--episodes", "1"]
    results, names = {}, sorted(commands)
    for first in range(0, len(names), AT_ONCE):
        started = {name: (_start(*commands[name]), time.monotonic())
                   for name in names[first:first + AT_ONCE]}
        for name, (process, start) in started.items():
            code, out, err = _finish(process)
            results[name] = (code, out, err, time.monotonic() - start, out_dir / name)
    return results


@pytest.mark.parametrize("case", sorted(LATE_CONFIG_ERRORS))
def test_a_bad_config_value_is_one_line_and_exit_2_before_any_work(late_config_results, case):
    code, out, err, _, run_dir = late_config_results[case]
    lines = err.strip().splitlines()
    assert code == 2, err[-3000:]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert lines[0].startswith("policy-service: error:")
    assert LATE_CONFIG_ERRORS[case][1] in lines[0]
    assert out == ""
    assert not run_dir.exists()  # rejected before the run directory, Ray or a model


def test_evaluate_in_an_env_with_other_spaces_names_both_spaces(late_config_results):
    code, out, err, _, _ = late_config_results["evaluate_on_other_spaces"]
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert lines[0].startswith("policy-service: error: environment 'MountainCar-v0' does not "
                               "fit the saved policy: observation_space Box(")
    assert "(2,), float32) (the policy's: Box(" in lines[0]
    assert "action_space Discrete(3) (the policy's: Discrete(2))" in lines[0]
    assert out == ""


# More bad values, through cli.main in this process (nothing is built: they fail first).
MORE_BAD_VALUES = {
    "clip_param_zero": (["--set", "clip_param=0"], "config.clip_param must be"),
    "lambda_above_one": (["--set", "lambda_=1.5"], "config.lambda_ must be"),
    "kl_coeff_negative": (["--set", "kl_coeff=-1"], "config.kl_coeff must be"),
    "entropy_coeff_negative": (["--set", "entropy_coeff=-0.01"], "config.entropy_coeff must be"),
    "vf_clip_param_zero": (["--set", "vf_clip_param=0"], "config.vf_clip_param must be"),
    "num_epochs_zero": (["--set", "num_epochs=0"], "config.num_epochs must be an integer >= 1"),
    "minibatch_size_zero": (["--set", "minibatch_size=0"], "config.minibatch_size must be"),
    "minibatch_above_train_batch": (["--set", "minibatch_size=512"],
                                    "config.minibatch_size must be <= train_batch_size (256)"),
    "lstm_cell_size_zero": (["--set", "model.lstm_cell_size=0"], "config.model.lstm_cell_size"),
    "max_seq_len_zero": (["--set", "model.max_seq_len=0"], "config.model.max_seq_len"),
    "conv_filters_malformed": (["--set", "model.conv_filters=[[16, 3]]"],
                               "config.model.conv_filters must be None or a non-empty list"),
    "conv_activation_unknown": (["--set", "model.conv_activation=sigmoidal"],
                                "config.model.conv_activation"),
    "exploration_option_unknown": (["--set", "exploration_config={type: EpsilonGreedy, "
                                    "epsilon: 0.1}"], "(unknown: ['epsilon'])"),
    "seed_negative": (["--seed", "-1"], "config.seed must be None or an integer in [0, "),
    "num_env_runners_negative": (["--num-env-runners", "-1"], "config.num_env_runners"),
    "vectorize_mode_unknown": (["--set", "vectorize_mode=threads"], "config.vectorize_mode"),
    "env_config_two_unknown_keys": (["--set", "env_config={size: 3, max_episode_steps: 5, "
                                     "color: red}"], "['color', 'size']"),
    "minibatch_uneven_over_towers": (["--num-gpus", "3", "--fake-gpus"],
                                     "config.minibatch_size=64 must be a multiple of 1 "
                                     "learner(s) x 3 tower(s) x 1 row(s) per sequence = 3"),
    "minibatch_cuts_lstm_sequences": (["--set", "model.use_lstm=true",
                                       "--set", "model.max_seq_len=20"],
                                      "config.minibatch_size=64 must be a multiple of 1 "
                                      "learner(s) x 1 tower(s) x 20 row(s) per sequence = 20"),
    "stop_iters_zero": (["--stop-iters", "0"], "--stop-iters must be >= 1, got 0"),
    "stop_timesteps_negative": (["--stop-timesteps", "-5"], "--stop-timesteps must be >= 1"),
    "stop_reward_nan": (["--stop-reward", "nan"], "--stop-reward must be a finite number"),
}


@pytest.mark.parametrize("case", sorted(MORE_BAD_VALUES))
def test_more_bad_values_are_one_clear_line(case, tmp_path, capsys):
    from policy_service.cli import commands as cli
    args, expected = MORE_BAD_VALUES[case]
    run_dir = tmp_path / "run"
    code = cli.main(["train", "ppo", "--env", "CartPole-v1", "--stop-iters", "1", *TINY, *args,
                     "--output-dir", str(run_dir)])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2
    assert len(lines) == 1 and lines[0].startswith("policy-service: error:"), err
    assert expected in lines[0]
    assert not run_dir.exists()


def test_env_config_keys_are_checked_against_the_env_constructor():
    from algorithms import register_env
    from algorithms.environments import EnvironmentSetupError, check_env_config
    check_env_config("CartPole-v1", {})
    check_env_config("CartPole-v1", {"render_mode": None, "sutton_barto_reward": True,
                                     "max_episode_steps": 5, "disable_env_checker": True})
    with pytest.raises(EnvironmentSetupError) as err:
        check_env_config("CartPole-v1", {"nope": 1})
    assert str(err.value) == (
        "config.env_config key(s) ['nope'] are not options of CartPole-v1; it takes "
        "['disable_env_checker', 'max_episode_steps', 'render_mode', 'sutton_barto_reward']")
    register_env("test_cli_dict_env", lambda env_config: None)  # takes the whole dict
    check_env_config("test_cli_dict_env", {"anything": 1})


def test_env_config_of_an_env_taking_any_keyword_is_not_checked():
    import gymnasium as gym

    from algorithms.environments import check_env_config

    def any_options(**kwargs):
        return gym.make("CartPole-v1")
    gym.register("TestCliAnyOptions-v0", entry_point=any_options)
    try:
        check_env_config("TestCliAnyOptions-v0", {"anything": 1})
    finally:
        gym.registry.pop("TestCliAnyOptions-v0")


def test_more_towers_than_visible_gpus_is_a_setup_error(monkeypatch):
    import tensorflow as tf

    from algorithms.ppo import PPOConfig
    from policy_service.cli.run_config import check_devices
    from policy_service.cli.run_options import TrainingSetupError
    check_devices(PPOConfig(num_gpus=2, _fake_gpus=True))  # no GPU here: two fake ones are fine
    real = tf.config.list_physical_devices
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: ["GPU:0"] if kind == "GPU" else real(kind))
    check_devices(PPOConfig(num_gpus=1))
    with pytest.raises(TrainingSetupError, match=r"^config.num_gpus: num_gpus=2.0 requested but "
                       r"only 1 GPU\(s\) found$"):
        check_devices(PPOConfig(num_gpus=2))


def test_spaces_are_checked_before_the_policy_is_built():
    import gymnasium as gym

    from algorithms.evaluation import CheckpointError, check_spaces_fit
    from policy_service.io.space_codec import space_to_json
    cartpole = gym.make("CartPole-v1")
    state = {"observation_space": space_to_json(cartpole.observation_space),
             "action_space": space_to_json(cartpole.action_space)}
    check_spaces_fit(state, gym.make("CartPole-v0"), "CartPole-v0")  # same spaces
    with pytest.raises(CheckpointError) as err:
        check_spaces_fit(state, gym.make("Acrobot-v1"), "Acrobot-v1")
    message = str(err.value)
    assert "\n" not in message and message.startswith("environment 'Acrobot-v1' does not fit")
    assert "observation_space Box(" in message and "(6,), float32)" in message
    assert "action_space Discrete(3) (the policy's: Discrete(2))" in message


def test_a_run_directory_is_never_overwritten_and_resume_keeps_its_config(trained, capsys):
    from policy_service.cli import commands as cli
    assert cli.main(["train", "ppo", "--env", "CartPole-v1", "--output-dir", str(trained)]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert cli.main(["train", "ppo", "--env", "CartPole-v1", "--num-gpus", "2", "--fake-gpus",
                     "--seed", "0", *TINY, "--set", "lr=0.5", "--resume", str(trained)]) == 2
    err = capsys.readouterr().err
    assert "'lr' would change" in err and len(err.strip().splitlines()) == 1


# ----- the runner's small parts, in this process -----------------------------------------------


def test_one_line_tells_a_remote_error_by_the_error_its_code_raised():
    from ray.exceptions import RayTaskError

    from policy_service.errors import one_line
    remote = RayTaskError("LearnerHost.foreach_policy", "Traceback (most recent call last):\n"
                          "  ...\nValueError: bad", ValueError("entry 'w'\n has shape (3, 3)"))
    assert one_line(remote.as_instanceof_cause()) == "entry 'w' has shape (3, 3)"
    assert one_line(KeyError()) == "KeyError"


def test_stop_criteria_name_the_first_limit_reached():
    from policy_service.cli.run_options import StopCriteria
    stop = StopCriteria(reward=100.0, timesteps=1000, iters=5)
    assert stop.reason({"iteration": 1, "timesteps_total": 10, "episode_return_mean": 20.0}) is None
    assert stop.reason({"iteration": 1, "timesteps_total": 10,
                        "episode_return_mean": 100.0}) == "stop_reward"
    assert stop.reason({"iteration": 2, "timesteps_total": 1000,
                        "episode_return_mean": None}) == "stop_timesteps"
    assert stop.reason({"iteration": 5, "timesteps_total": 500}) == "stop_iters"
    assert StopCriteria(iters=5).updated(StopCriteria(iters=9, reward=1.0)) == \
        StopCriteria(reward=1.0, iters=9)


def test_overrides_parse_yaml_values_and_nest_dotted_keys():
    from policy_service.cli.run_config import apply_override
    config = {"model": {"fcnet_activation": "tanh"}}
    for assignment in ("lr=3e-4", "model.fcnet_hiddens=[64, 64]", "env_config.size=3",
                       "seed=null", "explore=false", "env=ALE/Pong-v5"):
        apply_override(config, assignment)
    assert config == {"lr": 3e-4, "seed": None, "explore": False, "env": "ALE/Pong-v5",
                      "model": {"fcnet_activation": "tanh", "fcnet_hiddens": [64, 64]},
                      "env_config": {"size": 3}}


def test_metrics_become_plain_json():
    import numpy as np

    from policy_service.cli.run_config import json_safe
    assert json_safe({"a": np.float32(1.5), "b": float("nan"), "c": np.int64(3),
                       "d": (1, float("inf"))}) == {"a": 1.5, "b": None, "c": 3, "d": [1, None]}

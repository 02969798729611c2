"""policy_service/cli/commands.py: bad input to `policy-service` is one line on stderr,
exit status 2, before any work; and the runner's small parts, in this process.

Each table of bad commands runs through commands.main in one fresh process (one
TensorFlow import for them all), one case also as the real `policy-service` command.
The runs themselves: test_training.py, test_run_resources.py, test_jobs.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_processes import TINY, command_env, finish, ray_token, start  # noqa: F401

# ----- bad input: one line on stderr, no traceback -------------------------------------------


BAD_INPUT = {
    "unknown_algorithm": (["train", "nosuchalgo", "--env", "CartPole-v1"], "nosuchalgo"),
    "unknown_env": (["train", "ppo", "--env", "NoSuchEnv-v0"], "NoSuchEnv-v0"),
    "unknown_set_key": (["train", "ppo", "--env", "CartPole-v1", "--set", "lrr=0.1"], "lrr"),
    "unreadable_config": (
        ["train", "ppo", "--env", "CartPole-v1", "--config", "/nonexistent/ppo.yaml"],
        "/nonexistent/ppo.yaml",
    ),
}


# Each case's commands.main in one fresh Python process (TensorFlow imported once), with
# its own stdout and stderr file descriptors: what a `policy-service` process would print.
_MAIN_FOR_EACH_CASE = r"""
import json, os, sys, tempfile, time, traceback
from policy_service.cli import commands

def run(argv):
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush(); sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(out.fileno(), 1); os.dup2(err.fileno(), 2)
        try:
            code = commands.main(argv)
        except SystemExit as exit:  # argparse's errors, as the console script's exit
            code = exit.code if isinstance(exit.code, int) else 0 if exit.code is None else 1
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush(); sys.stderr.flush()
            os.dup2(saved[0], 1); os.dup2(saved[1], 2)
            os.close(saved[0]); os.close(saved[1])
        out.seek(0); err.seek(0)
        return code, out.read().decode(errors="replace"), err.read().decode(errors="replace")

cases, results = json.loads(open(sys.argv[1]).read()), {}
for name, argv in cases.items():
    start = time.monotonic()
    results[name] = [*run(argv), time.monotonic() - start]
    open(sys.argv[2], "w").write(json.dumps(results))
"""


def _run_cases(
    commands: dict[str, list[str]], real_command: str, work_dir: Path
) -> dict[str, tuple[int, str, str, float]]:
    """name -> (exit code, stdout, stderr, seconds): `real_command`'s case as a real
    `policy-service` process, beside one process running every other case in turn."""
    cases, results = work_dir / "cases.json", work_dir / "results.json"
    cases.write_text(json.dumps({n: a for n, a in commands.items() if n != real_command}))
    began = time.monotonic()
    real = start(*commands[real_command])
    in_one = subprocess.Popen(
        [sys.executable, "-c", _MAIN_FOR_EACH_CASE, str(cases), str(results)],
        env=command_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    code, out, err = finish(real)
    ran = {real_command: (code, out, err, time.monotonic() - began)}
    code, _, err = finish(in_one)
    assert code == 0, err[-3000:]
    ran.update((n, tuple(r)) for n, r in json.loads(results.read_text()).items())
    assert sorted(ran) == sorted(commands), err[-3000:]
    return ran


@pytest.fixture(scope="module")
def bad_input_results(command_results):
    return {name: command_results[name][:3] for name in BAD_INPUT}


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_bad_input_is_one_clear_line(bad_input_results, case):
    code, out, err = bad_input_results[case]
    lines = err.strip().splitlines()
    assert code == 2  # the input is wrong, not the run
    assert "Traceback" not in err
    assert len(lines) == 1, err
    assert lines[0].startswith("policy-service: error:")
    assert BAD_INPUT[case][1] in lines[0]


# The same handling in this process, for more kinds of bad input (no TF import per case).
MORE_BAD_INPUT = {
    "bad_set_value": (["train", "ppo", "--env", "CartPole-v1", "--set", "lr=fast"], "config.lr"),
    "set_without_value": (["train", "ppo", "--env", "CartPole-v1", "--set", "lr"], "key=value"),
    "set_into_a_number": (["train", "ppo", "--env", "CartPole-v1", "--set", "lr.x=1"], "lr"),
    "bad_nested_key": (
        ["train", "ppo", "--env", "CartPole-v1", "--set", "model.fcnet_hidens=[8]"],
        "fcnet_hidens",
    ),
    "no_env": (["train", "ppo"], "--env"),
    "config_not_a_mapping": (
        ["train", "ppo", "--env", "CartPole-v1", "--config", "{list}"],
        "mapping",
    ),
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
    "optimizer_adamw": (
        ["--set", "optimizer=adamw"],
        "config.optimizer must be one of ['adam', 'sgd', 'rmsprop'], got 'adamw'",
    ),
    "num_gpus_flag_negative": (
        ["--num-gpus", "-1"],
        "config.num_gpus must be a finite number >= 0, and a whole number when above 1, got -1.0",
    ),
    "num_gpus_fraction_above_one": (["--set", "num_gpus=1.5"], "config.num_gpus must be"),
    "grad_clip_method_bogus": (
        ["--set", "grad_clip_method=bogus"],
        "config.grad_clip_method must be one of",
    ),
    "fcnet_hiddens_zero": (
        ["--set", "model.fcnet_hiddens=[0]"],
        "config.model.fcnet_hiddens must be a list of integers >= 1, got [0]",
    ),
    "fcnet_activation_unknown": (
        ["--set", "model.fcnet_activation=nope"],
        "config.model.fcnet_activation must be the name of a Keras",
    ),
    "exploration_type_unknown": (
        ["--set", "exploration_config={type: Bogus}"],
        "config.exploration_config must be a dict whose 'type'",
    ),
    "env_config_unknown_key": (
        ["--set", "env_config={nope: 1}"],
        "config.env_config key(s) ['nope'] are not options of CartPole-v1",
    ),
    "lr_nan": (["--set", "lr=.nan"], "config.lr must be a finite number > 0, got nan"),
    "lr_negative": (["--set", "lr=-1"], "config.lr must be a finite number > 0, got -1"),
    "lr_zero": (["--set", "lr=0"], "config.lr must be a finite number > 0, got 0"),
    "grad_clip_zero": (
        ["--set", "grad_clip=0"],
        "config.grad_clip must be None or a finite number > 0, got 0",
    ),
    "grad_clip_negative": (["--set", "grad_clip=-1"], "config.grad_clip must be None or"),
    "gamma_above_one": (
        ["--set", "gamma=1.5"],
        "config.gamma must be a finite number in [0, 1], got 1.5",
    ),
    "gamma_negative": (["--set", "gamma=-0.1"], "config.gamma must be a finite number in [0, 1]"),
    "adam_epsilon_negative": (
        ["--set", "adam_epsilon=-1"],
        "config.adam_epsilon must be a finite number > 0, got -1",
    ),
}


@pytest.fixture(scope="module")
def cartpole_policy_dir(tmp_path_factory) -> Path:
    """A PPO policy for CartPole-v1 spaces, as TFPolicy.export_checkpoint writes it."""
    import gymnasium as gym

    from algorithms.ppo import PPOPolicy

    env = gym.make("CartPole-v1")
    policy = PPOPolicy(
        env.observation_space, env.action_space, {"model": {"fcnet_hiddens": [8]}, "seed": 0}
    )
    directory = tmp_path_factory.mktemp("policy") / "cartpole_policy"
    policy.export_checkpoint(str(directory))
    return directory


@pytest.fixture(scope="module")
def command_results(tmp_path_factory, cartpole_policy_dir):
    """Every case of BAD_INPUT, LATE_CONFIG_ERRORS and an evaluate in an env of other spaces
    through commands.main in one fresh process, lr_nan also as a real `policy-service`
    command -> (exit code, stdout, stderr, seconds, output dir). A late case that is not
    caught would train one tiny iteration and exit 0."""
    out_dir = tmp_path_factory.mktemp("commands")
    commands = {
        name: [*args, "--output-dir", str(out_dir / name)] for name, (args, _) in BAD_INPUT.items()
    }
    commands.update(
        {
            name: [
                "train",
                "ppo",
                "--env",
                "CartPole-v1",
                "--stop-iters",
                "1",
                "--output-dir",
                str(out_dir / name),
                *TINY,
                *args,
            ]
            for name, (args, _) in LATE_CONFIG_ERRORS.items()
        }
    )
    commands["evaluate_on_other_spaces"] = [
        "evaluate",
        str(cartpole_policy_dir),
        "--env",
        "MountainCar-v0",
        "--episodes",
        "1",
    ]
    ran = _run_cases(commands, "lr_nan", tmp_path_factory.mktemp("cases"))
    return {name: (*result, out_dir / name) for name, result in ran.items()}


@pytest.fixture(scope="module")
def late_config_results(command_results):
    return {
        name: command_results[name] for name in [*LATE_CONFIG_ERRORS, "evaluate_on_other_spaces"]
    }


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
    assert lines[0].startswith(
        "policy-service: error: environment 'MountainCar-v0' does not "
        "fit the saved policy: observation_space Box("
    )
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
    "minibatch_above_train_batch": (
        ["--set", "minibatch_size=512"],
        "config.minibatch_size must be <= train_batch_size (256)",
    ),
    "lstm_cell_size_zero": (["--set", "model.lstm_cell_size=0"], "config.model.lstm_cell_size"),
    "max_seq_len_zero": (["--set", "model.max_seq_len=0"], "config.model.max_seq_len"),
    "conv_filters_malformed": (
        ["--set", "model.conv_filters=[[16, 3]]"],
        "config.model.conv_filters must be None or a non-empty list",
    ),
    "conv_activation_unknown": (
        ["--set", "model.conv_activation=sigmoidal"],
        "config.model.conv_activation",
    ),
    "exploration_option_unknown": (
        ["--set", "exploration_config={type: EpsilonGreedy, epsilon: 0.1}"],
        "(unknown: ['epsilon'])",
    ),
    "seed_negative": (["--seed", "-1"], "config.seed must be None or an integer in [0, "),
    "num_env_runners_negative": (["--num-env-runners", "-1"], "config.num_env_runners"),
    "vectorize_mode_unknown": (["--set", "vectorize_mode=threads"], "config.vectorize_mode"),
    "env_config_two_unknown_keys": (
        ["--set", "env_config={size: 3, max_episode_steps: 5, color: red}"],
        "['color', 'size']",
    ),
    "minibatch_uneven_over_towers": (
        ["--num-gpus", "3", "--fake-gpus"],
        "config.minibatch_size=64 must be a multiple of 1 "
        "learner(s) x 3 tower(s) x 1 row(s) per sequence = 3",
    ),
    "minibatch_cuts_lstm_sequences": (
        ["--set", "model.use_lstm=true", "--set", "model.max_seq_len=20"],
        "config.minibatch_size=64 must be a multiple of 1 "
        "learner(s) x 1 tower(s) x 20 row(s) per sequence = 20",
    ),
    "stop_iters_zero": (["--stop-iters", "0"], "--stop-iters must be >= 1, got 0"),
    "stop_timesteps_negative": (["--stop-timesteps", "-5"], "--stop-timesteps must be >= 1"),
    "stop_reward_nan": (["--stop-reward", "nan"], "--stop-reward must be a finite number"),
    "stop_time_zero": (["--stop-time", "0"], "--stop-time must be a finite number of seconds > 0"),
}


@pytest.mark.parametrize("case", sorted(MORE_BAD_VALUES))
def test_more_bad_values_are_one_clear_line(case, tmp_path, capsys):
    from policy_service.cli import commands as cli

    args, expected = MORE_BAD_VALUES[case]
    run_dir = tmp_path / "run"
    code = cli.main(
        [
            "train",
            "ppo",
            "--env",
            "CartPole-v1",
            "--stop-iters",
            "1",
            *TINY,
            *args,
            "--output-dir",
            str(run_dir),
        ]
    )
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
    check_env_config(
        "CartPole-v1",
        {
            "render_mode": None,
            "sutton_barto_reward": True,
            "max_episode_steps": 5,
            "disable_env_checker": True,
        },
    )
    with pytest.raises(EnvironmentSetupError) as err:
        check_env_config("CartPole-v1", {"nope": 1})
    assert str(err.value) == (
        "config.env_config key(s) ['nope'] are not options of CartPole-v1; it takes "
        "['disable_env_checker', 'max_episode_steps', 'render_mode', 'sutton_barto_reward']"
    )
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
    monkeypatch.setattr(
        tf.config,
        "list_physical_devices",
        lambda kind=None: ["GPU:0"] if kind == "GPU" else real(kind),
    )
    check_devices(PPOConfig(num_gpus=1))
    with pytest.raises(
        TrainingSetupError,
        match=r"^config.num_gpus: num_gpus=2.0 requested but "
        r"only 1 GPU\(s\) found$",
    ):
        check_devices(PPOConfig(num_gpus=2))


def test_an_unregistered_custom_action_dist_is_one_line_where_the_config_enters():
    from algorithms.ppo import PPO
    from policy_service.cli.run_config import validate_config
    from policy_service.cli.run_options import TrainingSetupError

    config = {"env": "CartPole-v1", "model": {"custom_action_dist": "pieces_missing"}}
    with pytest.raises(TrainingSetupError, match="'pieces_missing' is not a name given to"):
        validate_config(PPO, config)


def test_a_run_asking_for_gpus_that_are_not_there_passes_the_start_check():
    from algorithms.ppo import PPOConfig
    from policy_service.cli.run_config import check_devices
    from policy_service.config import from_dict

    check_devices(from_dict(PPOConfig, {"env": "CartPole-v1", "num_gpus": 2}))


def test_spaces_are_checked_before_the_policy_is_built():
    import gymnasium as gym

    from algorithms.evaluation import CheckpointError, check_spaces_fit
    from policy_service.io.space_codec import space_to_json

    cartpole = gym.make("CartPole-v1")
    state = {
        "observation_space": space_to_json(cartpole.observation_space),
        "action_space": space_to_json(cartpole.action_space),
    }
    check_spaces_fit(state, gym.make("CartPole-v0"), "CartPole-v0")  # same spaces
    with pytest.raises(CheckpointError) as err:
        check_spaces_fit(state, gym.make("Acrobot-v1"), "Acrobot-v1")
    message = str(err.value)
    assert "\n" not in message and message.startswith("environment 'Acrobot-v1' does not fit")
    assert "observation_space Box(" in message and "(6,), float32)" in message
    assert "action_space Discrete(3) (the policy's: Discrete(2))" in message


# ----- the runner's small parts, in this process -----------------------------------------------


def test_one_line_tells_a_remote_error_by_the_error_its_code_raised():
    from ray.exceptions import RayTaskError

    from policy_service.errors import one_line

    remote = RayTaskError(
        "LearnerHost.foreach_policy",
        "Traceback (most recent call last):\n  ...\nValueError: bad",
        ValueError("entry 'w'\n has shape (3, 3)"),
    )
    assert one_line(remote.as_instanceof_cause()) == "entry 'w' has shape (3, 3)"
    assert one_line(KeyError()) == "KeyError"


def test_stop_criteria_name_the_first_limit_reached():
    from policy_service.cli.run_options import StopCriteria, TrainingSetupError

    stop = StopCriteria(reward=100.0, timesteps=1000, iters=5)
    assert stop.reason({"iteration": 1, "timesteps_total": 10, "episode_return_mean": 20.0}) is None
    assert (
        stop.reason({"iteration": 1, "timesteps_total": 10, "episode_return_mean": 100.0})
        == "stop_reward"
    )
    assert (
        stop.reason({"iteration": 2, "timesteps_total": 1000, "episode_return_mean": None})
        == "stop_timesteps"
    )
    assert stop.reason({"iteration": 5, "timesteps_total": 500}) == "stop_iters"
    timed = StopCriteria.of({"time_total_s": 3600})
    assert timed.reason({"iteration": 9, "time_total_s": 3599.5}) is None
    assert timed.reason({"iteration": 9, "time_total_s": 3600.2}) == "stop_time"
    for seconds in (0, -1.0, float("inf"), "1h"):
        with pytest.raises(TrainingSetupError, match=r"^stop\['time_total_s'\] must be a finite"):
            StopCriteria.of({"time_total_s": seconds})
    assert StopCriteria(iters=5).updated(StopCriteria(iters=9, reward=1.0)) == StopCriteria(
        reward=1.0, iters=9
    )


def test_overrides_parse_yaml_values_and_nest_dotted_keys():
    from policy_service.cli.run_config import apply_override

    config = {"model": {"fcnet_activation": "tanh"}}
    for assignment in (
        "lr=3e-4",
        "model.fcnet_hiddens=[64, 64]",
        "env_config.size=3",
        "seed=null",
        "explore=false",
        "env=ALE/Pong-v5",
    ):
        apply_override(config, assignment)
    assert config == {
        "lr": 3e-4,
        "seed": None,
        "explore": False,
        "env": "ALE/Pong-v5",
        "model": {"fcnet_activation": "tanh", "fcnet_hiddens": [64, 64]},
        "env_config": {"size": 3},
    }


def test_metrics_become_plain_json():
    import numpy as np

    from policy_service.cli.run_config import json_safe

    assert json_safe(
        {"a": np.float32(1.5), "b": float("nan"), "c": np.int64(3), "d": (1, float("inf"))}
    ) == {"a": 1.5, "b": None, "c": 3, "d": [1, None]}


# ----- export: where --out can go --------------------------------------------------------------


def _unwritable_dirs(tmp_path) -> list[tuple[Path, Path]]:
    """(an --out, the directory it cannot be written in): /proc takes no new entries,
    for root too; without root, neither does a directory of mode 0500."""
    import os

    cases = [(Path("/proc/nope/x"), Path("/proc"))] if Path("/proc").is_dir() else []
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        cases.append((locked / "deeper" / "model", locked))
    return cases


def test_export_to_an_unwritable_out_is_one_line_naming_it(tmp_path, capsys, cartpole_policy_dir):
    """Was a FileNotFoundError traceback from checkpoints.atomic_directory; the check runs
    before the checkpoint is read."""
    from policy_service.cli import commands

    cases = _unwritable_dirs(tmp_path)
    if not cases:
        pytest.skip("needs Linux's /proc, or a user other than root")
    for out, where in cases:
        assert commands.main(["export", str(cartpole_policy_dir), "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err
        assert f"--out {out}: cannot write in {where} (" in err and err.endswith(")")
        assert not out.exists()


def test_an_empty_tf_log_level_is_quiet_too(monkeypatch, capsys):
    """TF_CPP_MIN_LOG_LEVEL set but empty (`TF_CPP_MIN_LOG_LEVEL= policy-service ...`) is
    as unset: TensorFlow's start-up lines stay off the terminal."""
    from policy_service.cli import commands

    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "")
    assert commands.main(["config", "ppo"]) == 0
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "3"
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "1")  # a level the user chose stays
    assert commands.main(["config", "ppo"]) == 0
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "1"

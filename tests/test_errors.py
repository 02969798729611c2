"""policy_service/errors.py: which errors are the user's, and an error as one line."""

import importlib

import pytest

from policy_service.cli import commands
from policy_service.errors import RunFailure, UserError, one_line


class _Remote(Exception):
    """Like Ray's RayTaskError: the error the task's own code raised is `cause`."""

    def __init__(self, cause):
        super().__init__("ray::Actor.method() (pid=1)\nTraceback (most recent call last):\n  ...")
        self.cause = cause


def test_one_line_collapses_the_message_or_names_the_type():
    assert one_line(ValueError("key 'lr'\n  must be\t> 0")) == "key 'lr' must be > 0"
    assert one_line(KeyError()) == "KeyError"
    assert one_line("a text\nover two lines") == "a text over two lines"


def test_one_line_tells_a_remote_error_by_its_innermost_cause():
    assert (
        one_line(_Remote(_Remote(ValueError("entry 'w'\n has shape (3, 3)"))))
        == "entry 'w' has shape (3, 3)"
    )


def test_first_line_drops_what_follows_the_headline():
    dead = RuntimeError(
        "\n  The actor died because of an error raised in its creation task\n"
        "Traceback (most recent call last):\n  File 'x.py'\nValueError: bad"
    )
    assert (
        one_line(dead, first_line=True)
        == "The actor died because of an error raised in its creation task"
    )
    assert (
        one_line("Job failed with exit code 1, last logs:\nline 1\nline 2", first_line=True)
        == "Job failed with exit code 1, last logs:"
    )
    assert one_line(RuntimeError(" \n "), first_line=True) == "RuntimeError"


@pytest.mark.parametrize(
    "module, name, builtin",
    [
        ("policy_service.config", "ConfigError", ValueError),
        ("policy_service.config", "ConfigTypeError", TypeError),
        ("policy_service.cli.run_options", "TrainingSetupError", Exception),
        ("policy_service.io.checkpoints", "CheckpointFileError", ValueError),
        ("policy_service.io.checkpoints", "MissingCheckpointFile", FileNotFoundError),
        ("algorithms.environments", "EnvironmentSetupError", ValueError),
        ("algorithms.evaluation", "CheckpointError", Exception),
        ("algorithms.evaluation", "EnvironmentMismatch", Exception),
        ("policy_service.distributed.jobs", "JobSubmissionError", Exception),
        ("policy_service.distributed.resources", "ResourcesExceedClusterError", RuntimeError),
    ],
)
def test_the_errors_of_bad_input_are_user_errors_and_keep_their_builtin_base(module, name, builtin):
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, UserError) and issubclass(cls, builtin)


def test_a_spent_restart_budget_is_a_run_failure_not_a_user_error():
    from policy_service.distributed.env_runner_group import EnvRunnerFailure

    assert issubclass(EnvRunnerFailure, RunFailure) and issubclass(EnvRunnerFailure, RuntimeError)
    assert not issubclass(EnvRunnerFailure, UserError)


def test_resources_that_were_not_freed_in_time_are_a_run_failure():
    """Asks beyond the whole cluster are the input's (exit 2); asks that fit it but
    found its resources held by others until the wait ended are the moment's (exit 1)."""
    from policy_service.distributed.learners import LearnerResourcesError
    from policy_service.distributed.resources import ResourcesError, ResourcesNotFreedError

    for cls in (ResourcesNotFreedError, LearnerResourcesError):
        assert issubclass(cls, RunFailure) and issubclass(cls, ResourcesError)
        assert not issubclass(cls, UserError)


def test_the_command_line_prints_a_user_error_as_one_line_and_exits_2(capsys):
    assert commands.main(["submit", "--address", "http://127.0.0.1:1", "--"]) == 2
    assert capsys.readouterr().err == (
        "policy-service: error: no command to run: give it after "
        "'--', e.g. submit --address URL -- python train.py\n"
    )


def test_the_command_line_prints_a_run_failure_and_exits_1_and_lets_others_through(
    monkeypatch, capsys
):
    from policy_service.distributed import jobs

    def fails(error):
        def run_job(*args, **kwargs):
            raise error

        return run_job

    monkeypatch.setattr(jobs, "run_job", fails(RunFailure("env runner 1 died 3 times")))
    assert commands.main(["submit", "--address", "http://127.0.0.1:1", "--", "true"]) == 1
    assert capsys.readouterr().err == "policy-service: error: env runner 1 died 3 times\n"
    monkeypatch.setattr(jobs, "run_job", fails(RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="^a bug$"):
        commands.main(["submit", "--address", "http://127.0.0.1:1", "--", "true"])

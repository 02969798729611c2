"""Errors as the user sees them: which errors are the user's, and an error as one line.

Imports nothing heavy (`policy-service submit` loads no TensorFlow).
"""

from __future__ import annotations

import errno


class UserError(Exception):
    """Caused by the user's input (config, files, arguments, the cluster asked for):
    its message is one line saying what was expected and what was found. The command
    line prints it as that line and exits with status 2."""


class TrainingSetupError(UserError):
    """A run cannot start: a bad flag, config key or value, file or run directory."""


class RunFailure(Exception):
    """The run cannot go on, through no fault of its input (a restart budget spent):
    one line saying why. The command line prints it and exits with status 1."""


class DiskFullError(RunFailure, OSError):
    """A write found no space left (ENOSPC, EDQUOT): one line naming the directory;
    what was there before the write is kept."""


NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def no_space_left(err: OSError, directory, writing: str) -> DiskFullError | None:
    """`err` as a DiskFullError naming `directory` and what was being written, when
    it says the disk is full (else None: another OSError)."""
    if isinstance(err, DiskFullError):  # found deeper down: named here, where it began
        return DiskFullError(f"no space left in {directory} (writing {writing})")
    if err.errno not in NO_SPACE_ERRNOS:
        return None
    return DiskFullError(
        f"no space left in {directory} (writing {writing}: {err.strerror or one_line(err)})"
    )


JSON_KINDS = {
    dict: "an object",
    list: "an array",
    str: "a string",
    bool: "a boolean",
    int: "a number",
    float: "a number",
    type(None): "null",
}


def json_kind(value) -> str:
    """What a JSON value is, as an error message says it ("an array", "null"); any
    other value is named by its type."""
    return JSON_KINDS.get(type(value), f"a {type(value).__name__}")


def own_error(err: BaseException) -> BaseException:
    """The error code raised itself: a Ray task's error (RayTaskError) unwrapped to the
    error its code raised (the innermost, when that was a task's error too)."""
    while isinstance(cause := getattr(err, "cause", None), BaseException):
        err = cause
    return err


def one_line(err: BaseException | str, *, first_line: bool = False) -> str:
    """An error's message (or a text) on one line, its whitespace collapsed, or the
    error's type when it has none. A Ray task's error (RayTaskError) is told by the
    error its own code raised, not by Ray's task text and the remote traceback.
    `first_line`: only the first non-empty line, for texts whose later lines are a
    traceback or a log (a dead actor's, a failed job's)."""
    err = own_error(err) if isinstance(err, BaseException) else err
    text = str(err)
    if first_line:
        text = next((line for line in text.splitlines() if line.strip()), "")
    return " ".join(text.split()) or type(err).__name__


def restart_budget_spent(
    role: str, deaths: int, during: str, total: int, budgets: dict, error: BaseException
) -> str:
    """The one line a run ends with when an actor role's restart budget is spent,
    the same for env runners and learners: who died how often during which call,
    the restarts made in all, the budgets, and the last error."""
    limits = ", ".join(f"{name}={value}" for name, value in budgets.items())
    return (
        f"{role} died {deaths} times during one {during} ({total} restarts in all; "
        f"budgets: {limits}); last: {type(error).__name__}: {one_line(error, first_line=True)}"
    )

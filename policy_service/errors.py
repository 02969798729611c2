"""Errors as the user sees them: which errors are the user's, and an error as one line.

Imports nothing heavy (`policy-service submit` loads no TensorFlow).
"""

from __future__ import annotations


class UserError(Exception):
    """Caused by the user's input (config, files, arguments, the cluster asked for):
    its message is one line saying what was expected and what was found. The command
    line prints it as that line and exits with status 2."""


class RunFailure(Exception):
    """The run cannot go on, through no fault of its input (a restart budget spent):
    one line saying why. The command line prints it and exits with status 1."""


def one_line(err: BaseException | str, *, first_line: bool = False) -> str:
    """An error's message (or a text) on one line, its whitespace collapsed, or the
    error's type when it has none. A Ray task's error (RayTaskError) is told by the
    error its own code raised, not by Ray's task text and the remote traceback.
    `first_line`: only the first non-empty line, for texts whose later lines are a
    traceback or a log (a dead actor's, a failed job's)."""
    while isinstance(cause := getattr(err, "cause", None), BaseException):
        err = cause
    text = str(err)
    if first_line:
        text = next((line for line in text.splitlines() if line.strip()), "")
    return " ".join(text.split()) or type(err).__name__

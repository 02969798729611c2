"""What the fault tests share: a tiny training run's flags, the environment of a
subprocess that runs this tree, the one error line of a command's stderr, and a
process's descendants (the embedded Ray's GCS, raylet and actors)."""

from __future__ import annotations

import os
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY = [
    "--set",
    "train_batch_size=128",
    "--set",
    "minibatch_size=64",
    "--set",
    "num_epochs=1",
    "--set",
    "model.fcnet_hiddens=[16]",
]


def subprocess_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS",)}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    return env


# Ray forwards its own processes' log lines to the driver, tagged and often coloured:
# "(pid=7727) ...", "(PolicyActor pid=12) ...", "(raylet) ... is over 95% full".
RAY_FORWARDED = re.compile(r"^(?:\x1b\[[0-9;]*m)?\((?:raylet|gcs_server|[^)]*pid=\d+)[^)]*\)")


# our line for each handled death of an env runner or learner (beside Ray's own)
REPLACING = re.compile(r"policy-service: (env runner|learner) \d+ died during .*; replacing ")


def without_ray_worker_logs(err: str) -> list[str]:
    """stderr lines of this process, less the lines Ray forwards from its workers, raylet
    and GCS (a warning of theirs, such as a nearly full disk, is not this run's error),
    the progress display's "iteration N: ..." lines (stderr when not a terminal) and our
    own line for each replaced env runner or learner (a handled fault, not the error)."""
    return [
        line
        for line in err.splitlines()
        if line.strip()
        and not RAY_FORWARDED.match(line)
        and not re.match(r"iteration \d+: ", line)
        and not REPLACING.match(line)
    ]


def one_error_line(err: str) -> str:
    lines = without_ray_worker_logs(err)
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("policy-service: error: "), err
    return lines[0]


def error_line(err: str) -> str:
    """The one "policy-service: error:" line of a command run in this process, whose
    stderr also holds what the test's own Ray forwards from its actors."""
    lines = [line for line in err.splitlines() if line.startswith("policy-service: error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]

"""A user's callbacks module for tests/test_tune.py's killed sweep, imported by
`policy-service tune --import tune_gates` (the command runs in tests/)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from policy_service import Callbacks

HELD_LR = 1e-3


class HoldSecondTrial(Callbacks):
    """While $TUNE_GATE_DIR is set, the trial with lr HELD_LR writes DIR/held at its
    first result and then never returns: the sweep stands with the trials before it
    finished and this one running, until its driver is killed. Without the variable
    (the resumed sweep) it does nothing."""

    def on_train_result(self, *, algorithm, result, **kwargs):
        gate = os.environ.get("TUNE_GATE_DIR")
        if gate and algorithm.config.lr == HELD_LR:
            (Path(gate) / "held").touch()
            while True:
                time.sleep(1.0)

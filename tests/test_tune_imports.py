"""A Tune driver loads no TensorFlow: the trainables (algorithms/tune.py), the search
space checks, `policy-service tune`'s command and every registered config class import
without it (the trial's actor is where the algorithm, and TensorFlow, load)."""

from __future__ import annotations

import json
import subprocess
import sys

from algorithms import ALGORITHMS, get_algorithm_class, get_config_class

DRIVER_MODULES = (
    "algorithms",
    "algorithms.tune",
    "algorithms.tune_search",
    "algorithms.config_builder",
    "policy_service.cli.commands",
    "policy_service.cli.tune_command",
)


PROBED = ("tensorflow", "keras", "ray.tune")  # ray.tune: the probe sees what was imported


def _probed_modules_after(code: str) -> list[str]:
    """Which of PROBED a fresh interpreter holds after running `code`."""
    probe = (
        f"{code}\nimport json, sys\nprint(json.dumps([m for m in {PROBED!r} if m in sys.modules]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_tune_drivers_modules_and_config_classes_import_without_tensorflow():
    imports = "\n".join(f"import {module}" for module in DRIVER_MODULES)
    configs = "from algorithms import ALGORITHMS, get_config_class\n" + (
        "classes = [get_config_class(name) for name in ALGORITHMS]"
    )
    assert _probed_modules_after(f"{imports}\n{configs}") == ["ray.tune"]


def test_each_registered_config_class_is_its_algorithms_config_class():
    for name in ALGORITHMS:
        algo_cls = get_algorithm_class(name)
        assert get_config_class(name) is algo_cls.config_class, name
        assert algo_cls.config_class.algorithm_class is algo_cls, name

"""`--import MODULE`: the user's own modules, imported because the command line named them.

A module imported here registers what a run or checkpoint refers to by name: custom
models (`models.register_custom_model`), environments (`algorithms.register_env`,
`gymnasium.register`), multi-agent mappings (`register_policy_mapping_fn`) and policy
classes (defined, so the class allow-list finds them). Nothing is imported because a
file said so (issue 27): only names typed on this command line reach `importlib`. The
current directory is searched first, as `python -m` does.
"""

from __future__ import annotations

import importlib
import os
import sys

from policy_service.errors import UserError, one_line


class UserModuleError(UserError):
    """A module named with --import cannot be imported."""


def import_user_modules(names: list[str] | None, to_ray_workers: bool = False) -> None:
    """Import each module named with --import, in order; one that fails is one line.
    `to_ray_workers` (train): their functions and classes travel to Ray's worker
    processes by value, since a worker on another node of a cluster need not have the
    module's file (on one machine Ray's workers find it from the driver's directory)."""
    for name in names or []:
        if not name or not all(part.isidentifier() for part in name.split(".")):
            raise UserModuleError(f"--import {name!r}: expected a module name such as my_models")
        cwd = os.getcwd()
        added = cwd not in sys.path and "" not in sys.path
        if added:
            sys.path.insert(0, cwd)
        try:
            importlib.import_module(name)
        except Exception as err:  # noqa: BLE001 - the user's module: its error, told in one line
            raise UserModuleError(
                f"--import {name}: cannot import it: {type(err).__name__}: {one_line(err)}"
            ) from None
        finally:
            if added:
                sys.path.remove(cwd)
        if to_ray_workers:
            from ray import cloudpickle

            cloudpickle.register_pickle_by_value(sys.modules[name])

"""`--import MODULE`: a module named on the command line registers what a checkpoint
names (here a custom model); a name that is no module is one line."""

from __future__ import annotations

import json
import sys

import gymnasium as gym
import numpy as np
import pytest
import user_models
from fakes import PGPolicy

from policy_service.cli import commands as cli
from policy_service.policy import models

MODULE = "registers_imported_mlp"


@pytest.fixture
def checkpoint_of_an_unregistered_model(tmp_path, monkeypatch):
    """A policy directory whose custom model ("imported_mlp") this process no longer
    knows, and beside it a module that registers it; the cwd is that directory."""
    models.register_custom_model("imported_mlp", user_models.LazyMLP)
    config = {"model": {"custom_model": "imported_mlp", "custom_model_config": {"units": 8}}}
    policy = PGPolicy(gym.spaces.Box(-1, 1, (3,), np.float32), gym.spaces.Discrete(2), config)
    policy.export_checkpoint(str(tmp_path / "policy"))
    models.unregister_custom_model("imported_mlp")
    (tmp_path / f"{MODULE}.py").write_text(
        "import user_models\n"
        "from policy_service import models\n\n"
        "models.register_custom_model('imported_mlp', user_models.LazyMLP)\n"
    )
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    sys.modules.pop(MODULE, None)
    models.unregister_custom_model("imported_mlp")


def test_export_with_import_knows_the_model_the_checkpoint_names(
    checkpoint_of_an_unregistered_model, capsys
):
    assert cli.main(["export", "policy", "--out", "without"]) == cli.EXIT_BAD_INPUT
    refused = capsys.readouterr().err.strip()
    assert (
        len(refused.splitlines()) == 1
        and "'imported_mlp' is not a name given to register_custom_model" in refused
    )
    assert MODULE not in sys.modules
    assert cli.main(["export", "policy", "--out", "saved", "--import", MODULE]) == 0
    assert (checkpoint_of_an_unregistered_model / "saved" / "saved_model.pb").exists()
    assert "imported_mlp" in models.custom_model_registry()


ENV_OF_THREE_OBS = """
import gymnasium as gym
import numpy as np

from algorithms import register_env


class FiveSteps(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.full(3, 0.1 * self.t, np.float32), 1.0, False, self.t == 5, {}


register_env("five_steps", lambda env_config: FiveSteps())
"""


def test_evaluate_with_import_knows_the_model_and_the_env_it_registers(
    checkpoint_of_an_unregistered_model, capsys
):
    module = checkpoint_of_an_unregistered_model / f"{MODULE}.py"
    module.write_text(module.read_text() + ENV_OF_THREE_OBS)
    args = ["evaluate", "policy", "--env", "five_steps", "--episodes", "2"]
    assert cli.main(args) == cli.EXIT_BAD_INPUT  # neither the model nor the env is known
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert cli.main([*args, "--import", MODULE]) == 0, capsys.readouterr().err
    stats = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert stats["env"] == "five_steps" and stats["episode_returns"] == [5.0, 5.0]


@pytest.mark.parametrize(
    "name, message",
    [
        ("no_such_module_here", "--import no_such_module_here: cannot import it: "),
        ("my-models.py", "--import 'my-models.py': expected a module name"),
    ],
)
def test_an_import_that_fails_is_one_line_naming_it(name, message, tmp_path, capsys):
    assert cli.main(["evaluate", str(tmp_path), "--import", name]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err

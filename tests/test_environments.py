"""algorithms/environments.py: environments by name. A "pettingzoo:module.factory" name
resolves from the command line, its options checked against the factory's signature; a
module named in a file is imported only when allowed. (Gymnasium ids and registered
names, through the CLI: test_cli.py.)"""

import pytest

from algorithms import environments
from policy_service.multi_agent.pettingzoo_env import make_pettingzoo_env

NAME = "pettingzoo:pettingzoo_envs.parallel_two_maps"


def test_pettingzoo_names_resolve_from_the_command_line_only():
    environments.check_env_id(NAME)
    environments.check_env_config(NAME, {"episode_len": 3})
    with pytest.raises(environments.EnvironmentSetupError, match=r"\['speed'\] are not options"):
        environments.check_env_config(NAME, {"speed": 3})
    assert make_pettingzoo_env(NAME, {"episode_len": 3}).env.maps.episode_len == 3
    with pytest.raises(
        environments.EnvironmentSetupError, match="unknown environment 'pettingzoo:no_such"
    ):
        environments.check_env_id("pettingzoo:no_such_module.env")
    with pytest.raises(
        environments.EnvironmentSetupError, match="a module named in a file is not imported"
    ):
        environments.check_env_from_file(NAME, "run.json")
    environments.check_env_from_file(NAME, "run.json", allowed=(NAME,))

"""algorithms/environments.py: environments by name. A "pettingzoo:module.factory" name
resolves from the command line, its options checked against the factory's signature; a
module named in a file is imported only when allowed. (Gymnasium ids and registered
names, through the CLI: test_cli.py.) ALE ids take DeepMind's preprocessing unless
preprocessor_pref is None."""

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


PONG = "ALE/Pong-v5"


def test_ale_ids_resolve_with_the_preprocessing_unless_preprocessor_pref_is_none():
    """DeepMind's preprocessing (policy_service/envs/atari.py: test_atari.py) by default."""
    pytest.importorskip("ale_py", reason="ale-py is not installed: pip install -e '.[atari]'")
    pytest.importorskip("cv2", reason="OpenCV is not installed: pip install -e '.[atari]'")
    environments.check_env_id(PONG)
    environments.check_env_config(PONG, {"repeat_action_probability": 0.0})
    assert environments.env_maker("CartPole-v1") == "CartPole-v1"
    raw = environments.env_maker(PONG, None)({})
    try:
        assert raw.observation_space.shape == (210, 160, 3)
    finally:
        raw.close()
    environments.check_env_from_file(PONG, "checkpoint/algorithm_config.json")

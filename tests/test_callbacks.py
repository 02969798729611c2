"""policy_service/runs/callbacks.py: hooks called by name, errors named by class and hook,
config values resolved without importing anything. A run calling them (on_learn_on_batch,
the episode hooks of a multi-agent run): test_algorithm.py."""

from __future__ import annotations

import sys

import pytest

from policy_service.runs.callbacks import (
    CallbackError,
    CallbackList,
    Callbacks,
    Episode,
    callbacks_classes,
    callbacks_config_error,
    callbacks_name,
)


class Counting(Callbacks):
    def __init__(self):
        self.calls = []

    def on_train_result(self, *, algorithm, result, **kwargs):
        self.calls.append(("on_train_result", result["iteration"]))
        result["counted"] = True


class Raising(Callbacks):
    def on_sample_end(self, *, samples, **kwargs):
        raise ValueError(f"no\nsamples {samples}")


def test_a_list_calls_each_member_that_overrides_the_hook_in_order():
    first, second = Counting(), Counting()
    callbacks = CallbackList([first, Raising(), second])
    result = {"iteration": 3}
    callbacks.call("on_train_result", algorithm=None, result=result)
    assert first.calls == second.calls == [("on_train_result", 3)] and result["counted"]
    assert callbacks.overrides("on_sample_end") and not callbacks.overrides("on_episode_end")
    callbacks.call("on_episode_end", episode=None, env_index=0)  # nobody has it: nothing runs


def test_a_hook_that_raises_is_one_line_naming_the_class_and_the_hook():
    with pytest.raises(CallbackError) as raised:
        CallbackList([Raising()]).call("on_sample_end", samples=7)
    assert str(raised.value) == ("callbacks Raising.on_sample_end raised ValueError: no samples 7")


def test_names_resolve_only_in_modules_already_imported(monkeypatch):
    name = f"{__name__}.Counting"
    assert callbacks_classes(name) == [Counting]
    assert callbacks_classes([Counting, name]) == [Counting, Counting]
    assert callbacks_name([Counting]) == [name]
    with pytest.raises(ValueError, match=r"names a module that is not imported.*--import nowhere"):
        callbacks_classes("nowhere.Callbacks")
    assert "nowhere" not in sys.modules  # nothing was imported for a name
    with pytest.raises(ValueError, match="has no 'Missing'"):
        callbacks_classes(f"{__name__}.Missing")
    with pytest.raises(ValueError, match="expected a subclass of policy_service.Callbacks"):
        callbacks_classes(f"{__name__}.Episode")
    assert callbacks_config_error(None) is None and callbacks_config_error("mod.Class") is None
    assert "a subclass of policy_service.Callbacks" in callbacks_config_error(int)


def test_an_episode_counts_its_steps_and_rewards():
    episode = Episode(episode_id=5, env_index=1, obs=[0.0])
    episode.step([1.0], 0, 1.5, {"x": 1})
    episode.step([2.0], 1, -0.5, {})
    assert (episode.length, episode.total_reward, episode.last_obs) == (2, 1.0, [2.0])
    assert (episode.last_action, episode.last_reward, episode.last_info) == (1, -0.5, {})

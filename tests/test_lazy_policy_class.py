"""LazyPolicyClass: read (config class, name) without loading the class, built as the class."""

import json
import pickle
import subprocess
import sys

from fakes import KLPGPolicy, PGPolicy

from policy_service.config import config_for
from policy_service.distributed.lazy_policy_class import LazyPolicyClass


class Plain:
    config_class = None

    def __init__(self, observation_space, action_space, config):
        self.built_with = (observation_space, action_space, config)


def test_an_unpickled_one_types_a_config_without_importing_the_policys_module():
    pickled = pickle.dumps(LazyPolicyClass(PGPolicy))  # tests/fakes.py imports TensorFlow
    code = f"""
import json, pickle, sys
from policy_service.config import config_for
lazy = pickle.loads({pickled!r})
config = config_for(lazy, {{"lr": 0.01}})
result = [lazy.__name__, type(config).__name__, config.lr]
result += [m in sys.modules for m in ("fakes", "tensorflow")]
print(json.dumps(result))
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [
        "PGPolicy",
        "PolicyConfig",
        0.01,
        False,
        False,
    ]


def test_it_loads_and_builds_as_the_class_does_by_reference_or_by_value():
    def local_class():  # not importable by name: travels by value (cloudpickle), as in Ray
        class Local(Plain):
            pass

        return Local

    for policy_cls in (Plain, local_class(), KLPGPolicy):
        lazy = pickle.loads(pickle.dumps(LazyPolicyClass(policy_cls)))
        assert lazy.config_class is getattr(policy_cls, "config_class", None)
        loaded = lazy.load()
        assert loaded.__qualname__ == policy_cls.__qualname__ and lazy.load() is loaded
        if policy_cls is not KLPGPolicy:
            built = lazy("obs", "act", {"lr": 1})
            assert type(built) is loaded and built.built_with == ("obs", "act", {"lr": 1})
    typed = config_for(LazyPolicyClass(KLPGPolicy), {"kl_coeff": 0.5})
    assert typed == config_for(KLPGPolicy, {"kl_coeff": 0.5}) and typed.kl_coeff == 0.5
    assert LazyPolicyClass(LazyPolicyClass(Plain)).load() is Plain

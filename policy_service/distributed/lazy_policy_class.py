"""LazyPolicyClass: a policy class that a Ray process loads only where it builds a policy.

A class reaches an actor by reference, so unpickling it imports its module there, and
a TFPolicy's module imports TensorFlow (seconds of CPU and its memory per process). An
env runner acting through a PolicyActor or a learner builds no policy: it reads the
config class alone. So the class travels as its own pickle beside its config class,
and is loaded (once per process) when a policy is built:

    policy_cls = LazyPolicyClass(PPOPolicy)               # in the driver
    config_for(policy_cls, config)                        # anywhere: imports no policy module
    policy = policy_cls(obs_space, act_space, config)     # loads PPOPolicy, builds it
"""

from __future__ import annotations

from typing import Any

from ray import cloudpickle


class LazyPolicyClass:
    """Builds policies as `policy_cls` does; its `config_class` and `__name__` are read
    without loading it."""

    def __init__(self, policy_cls: type | LazyPolicyClass) -> None:
        if isinstance(policy_cls, LazyPolicyClass):
            policy_cls = policy_cls.load()
        self.config_class = getattr(policy_cls, "config_class", None)
        self.__name__ = policy_cls.__name__
        # cloudpickle, as Ray's own: a class defined in __main__ or a test travels by value
        self._pickled = cloudpickle.dumps(policy_cls)
        self._loaded: type | None = policy_cls

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_loaded": None}

    def load(self) -> type:
        """The policy class (its module imported in this process on the first call)."""
        if self._loaded is None:
            self._loaded = cloudpickle.loads(self._pickled)
        return self._loaded

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.load()(*args, **kwargs)

    def __repr__(self) -> str:
        return f"LazyPolicyClass({self.__name__})"

"""ActingLearnerHost: a learner actor that also answers compute_actions (SEED RL).

With `inference: "learners"` the env runners act through the learner actors
themselves (runner i through learner (i - 1) % N): same device, same weights, so no
weights are broadcast and a fragment lags by at most the updates made while it
was sampled. Acting is a PolicyHost around the learner's own policy (concurrent
requests batched into one forward pass); the asynchronous update runs in the
same single policy thread a part at a time, so forward passes fall between SGD steps,
and so do reads and writes of its weights and state:

    host = ray.remote(ActingLearnerHost).remote(policy_cls, obs_space, act_space, config)
    # a RolloutWorker(policy_actor=host) calls, concurrently with the learner thread:
    actions, state_outs, extra = ray.get(host.compute_actions.remote(obs))
    ray.get(host.update_on_fragments.remote(fragment_refs, version, 1))

It is a Ray async actor: its other (plain) methods run on the event loop.
"""

from __future__ import annotations

from collections.abc import Callable

from policy_service.distributed.learner import FragmentUpdate
from policy_service.distributed.learner_actor import LearnerHost
from policy_service.distributed.policy_actor import PolicyHost


def serves_actions(config) -> bool:
    """Whether a learner group's actors act for the env runners (inference: learners)."""
    return getattr(config, "inference", None) == "learners"


def _acting(served: Callable):
    """An async actor method, of the same name, that awaits the PolicyHost method
    `served` of self.acting."""

    async def method(self, *args, **kwargs):
        return await served(self.acting, *args, **kwargs)

    return _named_as(method, served)


def _between_steps(learner_method: Callable):
    """An async actor method, of the same name, running the LearnerHost method
    `learner_method` in the policy thread, so it reads or writes the weights between
    SGD steps and forward passes, never beside one (a frozen self-play copy is set
    while the runners act through it)."""

    async def method(self, *args, **kwargs):
        return await self.acting.in_policy_thread(lambda: learner_method(self, *args, **kwargs))

    return _named_as(method, learner_method)


def _named_as(method: Callable, source: Callable) -> Callable:
    """`method` under `source`'s name (what Ray calls it by) and docstring."""
    name = source.__name__
    method.__name__, method.__qualname__, method.__doc__ = name, name, source.__doc__
    return method


class ActingLearnerHost(LearnerHost):
    """A LearnerHost whose policy also serves batched compute_actions."""

    def connect(self, rank: int, addresses: list[str]) -> dict:
        info = super().connect(rank, addresses)
        self.acting = PolicyHost.for_policy(self.policy)
        return info

    async def update_on_fragments(  # type: ignore[override]  # a Ray async actor's method
        self,
        fragments: list,
        learner_version: int,
        num_sgd_steps: int,
        policy_id: str | None = None,
    ) -> dict:
        """The learner's update, in the policy thread a part at a time (FragmentUpdate):
        the runners' forward passes wait for one SGD step, not the whole update. The
        actions answered between its steps carry `learner_version`, later ones + 1."""
        in_policy_thread = self.acting.in_policy_thread
        update = await in_policy_thread(
            lambda: FragmentUpdate(self, fragments, learner_version, policy_id)
        )
        for _ in range(num_sgd_steps):
            await in_policy_thread(update.sgd_step)

        def finish():
            stats = update.finish()
            self.acting.mark_version(learner_version + 1)
            return stats

        return await in_policy_thread(finish)

    def mark_version(self, version: int) -> None:
        """Later actions carry `version`: a replacement learner goes on from its group's."""
        self.acting.mark_version(version)

    # the acting side of a PolicyHost, answered by this learner's own policy
    compute_actions = _acting(PolicyHost.compute_actions)
    postprocess_trajectories = _acting(PolicyHost.postprocess_trajectories)
    get_initial_state = _acting(PolicyHost.get_initial_state)
    get_spaces = _acting(PolicyHost.get_spaces)
    weights_version = _acting(PolicyHost.weights_version)

    # the learner's weights and state, touched only between steps
    get_weights = _between_steps(LearnerHost.get_weights)
    set_weights = _between_steps(LearnerHost.set_weights)
    get_state = _between_steps(LearnerHost.get_state)
    set_state = _between_steps(LearnerHost.set_state)

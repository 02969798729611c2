"""ActingLearnerHost: a learner actor that also answers compute_actions (SEED RL).

With `inference: "learners"` the env runners act through the learner actors
themselves (runner i through learner i % N): same device, same weights, so no
weights are broadcast and a fragment lags by at most the updates made while it
was sampled. Acting is a PolicyHost around the learner's own policy (concurrent
requests batched into one forward pass); the asynchronous update runs in the
same single policy thread, so forward passes fall between SGD steps:

    host = ray.remote(ActingLearnerHost).remote(policy_cls, obs_space, act_space, config)
    # a RolloutWorker(policy_actor=host) calls, concurrently with the learner thread:
    actions, state_outs, extra = ray.get(host.compute_actions.remote(obs))
    ray.get(host.update_on_fragments.remote(fragment_refs, version, 1))

It is a Ray async actor: its other (plain) methods run on the event loop.
"""

from __future__ import annotations

from policy_service.distributed.learner_actor import LearnerHost
from policy_service.distributed.policy_actor import PolicyHost


def serves_actions(config) -> bool:
    """Whether a learner group's actors act for the env runners (inference: learners)."""
    return getattr(config, "inference", None) == "learners"


class ActingLearnerHost(LearnerHost):
    """A LearnerHost whose policy also serves batched compute_actions."""

    def connect(self, rank: int, addresses: list[str]) -> dict:
        info = super().connect(rank, addresses)
        self.acting = PolicyHost.for_policy(self.policy)
        return info

    async def update_on_fragments(  # type: ignore[override]  # a Ray async actor's method
        self, fragments: list, learner_version: int, num_sgd_steps: int
    ) -> dict:
        """The learner's update, in the policy thread; later actions carry version + 1."""

        def update():
            stats = LearnerHost.update_on_fragments(self, fragments, learner_version, num_sgd_steps)
            self.acting.mark_version(learner_version + 1)
            return stats

        return await self.acting.in_policy_thread(update)

    async def compute_actions(
        self,
        obs_batch,
        state_batches=None,
        *,
        explore=None,
        timestep=None,
        prev_action_batch=None,
        prev_reward_batch=None,
    ):
        return await self.acting.compute_actions(
            obs_batch,
            state_batches,
            explore=explore,
            timestep=timestep,
            prev_action_batch=prev_action_batch,
            prev_reward_batch=prev_reward_batch,
        )

    async def postprocess_trajectories(self, batches: list) -> list:
        return await self.acting.postprocess_trajectories(batches)

    async def get_initial_state(self) -> list:
        return await self.acting.get_initial_state()

    async def get_spaces(self) -> tuple:
        return await self.acting.get_spaces()

    async def weights_version(self) -> int:
        return await self.acting.weights_version()

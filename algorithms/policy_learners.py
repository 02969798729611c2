"""PolicyLearners: a run's learners by policy id, for one policy or many.

    learners = PolicyLearners.of_policies(agent_policies)   # a run with `policies`
    learners = PolicyLearners.single(LearnerGroup(...))     # one policy of a gymnasium env
    learners.update_each(update, {"pa": rows, ...}, timestep)  # each trained policy on its rows
    learners.groups["pa"]                                   # one policy's LearnerGroup

Each policy is its own learner role (num_learners: 0 puts its learner in the driver);
only the policies in `policies_to_train` are updated. `keyed` is the run's layout: a
run with `policies` names every policy in its statistics ("<policy id>/<stat>"), its
state and its checkpoints (policies/<policy id>/, and "policy_ids" in
algorithm_state.json); a run of one policy of a gymnasium env keeps that policy's
layout (unprefixed statistics, policy/), which its checkpoints have always had.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from policy_service.errors import one_line
from policy_service.io import checkpoints
from policy_service.io.checkpoints import CheckpointFileError
from policy_service.multi_agent.policies import DEFAULT_POLICY_ID, AgentPolicies
from policy_service.multi_agent.self_play import check_same_layout
from policy_service.policy.learning_results import NUM_SAMPLES_TRAINED

if TYPE_CHECKING:
    from policy_service.distributed.learner_group import LearnerGroup


class PolicyIdsMismatch(CheckpointFileError):
    """A checkpoint's policies are not the ones of the algorithm restoring it."""


def check_policy_ids(checkpoint, found: list | None, expected: list | None) -> None:
    """The checkpoint's policy ids (None: a checkpoint of one policy of a gymnasium env)
    are the run's (None: such a run); else PolicyIdsMismatch naming both."""
    if (found is None) == (expected is None) and sorted(found or []) == sorted(expected or []):
        return

    def named(ids):
        return "one policy (no config.policies)" if ids is None else f"policies {sorted(ids)}"

    raise PolicyIdsMismatch(
        f"{checkpoint}: holds {named(found)}, but this run's config expects {named(expected)}"
    )


def pop_samples_trained(stats: dict) -> int:
    """The samples an update trained on, taken out of its statistics."""
    if NUM_SAMPLES_TRAINED not in stats:
        raise KeyError(
            f"the learner update returned no {NUM_SAMPLES_TRAINED!r} (have "
            f"{sorted(stats)}); LearnerGroup.update reports it"
        )
    return int(stats.pop(NUM_SAMPLES_TRAINED))


def _learner_group(spec) -> LearnerGroup:
    """A policy's LearnerGroup from its complete PolicySpec."""
    from policy_service.distributed.learner_group import LearnerGroup

    assert spec.observation_space is not None and spec.action_space is not None
    return LearnerGroup(spec.built_class(), spec.observation_space, spec.action_space, spec.config)


class PolicyLearners:
    """A LearnerGroup per policy id; `update_each` updates the trained ones only."""

    def __init__(self, groups: dict, policies_to_train: list, keyed: bool = True) -> None:
        self.groups: dict = groups
        self.policies_to_train = list(policies_to_train)
        self.keyed = keyed

    @classmethod
    def of_policies(cls, policies: AgentPolicies) -> PolicyLearners:
        """A LearnerGroup for every policy of a run with `policies`."""
        learners = cls({}, policies.policies_to_train)
        try:
            for policy_id, spec in policies.specs.items():
                learners.groups[policy_id] = _learner_group(spec)
        except BaseException:
            learners.stop()
            raise
        return learners

    @classmethod
    def single(cls, group: LearnerGroup) -> PolicyLearners:
        """The learners of one policy of a gymnasium env, DEFAULT_POLICY_ID's."""
        return cls({DEFAULT_POLICY_ID: group}, [DEFAULT_POLICY_ID], keyed=False)

    def only_group(self) -> LearnerGroup:
        """The LearnerGroup of a run's only policy (what one policy's training steps use)."""
        if len(self.groups) != 1:
            raise ValueError(
                f"learners: this run has policies {sorted(self.groups)}; take one policy's "
                "LearnerGroup from policy_learners.groups[policy_id]"
            )
        return next(iter(self.groups.values()))

    @property
    def num_learners(self) -> int:
        return next(iter(self.groups.values())).num_learners

    @property
    def num_towers(self) -> int:
        return next(iter(self.groups.values())).num_towers

    @property
    def num_restarts(self) -> int:
        return sum(group.num_restarts for group in self.groups.values())

    def add(self, policy_id: str, spec, state: dict | None = None) -> None:
        """A LearnerGroup for a new policy (Algorithm.add_policy), from `state` if given."""
        group = _learner_group(spec)
        try:
            if state is not None:
                group.set_state(state)
        except BaseException:
            group.stop()
            raise
        self.groups[policy_id] = group

    def remove(self, policy_id: str) -> None:
        """Stop and drop a policy's learners (Algorithm.remove_policy)."""
        self.groups.pop(policy_id).stop()

    @property
    def actors(self) -> dict:
        """policy id -> its learner actors (with inference: learners, they act for it)."""
        return {policy_id: group.actors for policy_id, group in self.groups.items()}

    def replace_dead_learners(self) -> None:
        """LearnerGroup.replace_dead_learners of every policy's learners."""
        for group in self.groups.values():
            group.replace_dead_learners()

    def trained(self) -> dict:
        """policy id -> LearnerGroup, of the policies in policies_to_train."""
        return {policy_id: self.groups[policy_id] for policy_id in self.policies_to_train}

    def set_global_timestep(self, timestep: int) -> None:
        """Every policy's learners at the run's env steps (what schedules read)."""
        for group in self.groups.values():
            group.set_global_timestep(timestep)

    def set_acting_version(self, version: int) -> None:
        """LearnerGroup.set_acting_version of every policy's learners."""
        for group in self.groups.values():
            group.set_acting_version(version)

    def stat_name(self, policy_id: str, stat: str) -> str:
        """The name a policy's statistic has in the run's results."""
        return f"{policy_id}/{stat}" if self.keyed else stat

    def update_each(self, update: Callable, rows: dict, timestep: int) -> dict:
        """update(group, its rows) for every trained policy with rows in `rows` (policy
        id -> SampleBatch), each group at the global `timestep` (what schedules read) ->
        their statistics (named by stat_name), and the samples trained summed."""
        stats: dict = {NUM_SAMPLES_TRAINED: 0}
        for policy_id in self.policies_to_train:
            policy_rows = rows.get(policy_id)
            if policy_rows is None or not policy_rows.count:
                continue
            self.groups[policy_id].set_global_timestep(timestep)
            result = dict(update(self.groups[policy_id], policy_rows))
            stats[NUM_SAMPLES_TRAINED] += pop_samples_trained(result)
            stats.update({self.stat_name(policy_id, k): v for k, v in result.items()})
        return stats

    def get_weights(self) -> dict:
        return {policy_id: group.get_weights() for policy_id, group in self.groups.items()}

    def weights_for_runners(self, policy_ids: list | None = None) -> tuple[dict, int | None]:
        """(weights, num_grad_updates) the env runners are synced with: one policy's
        weights and the SGD steps that made them (LearnerGroup.weights_for_runners), or,
        keyed, policy id -> weights of `policy_ids` (None: every policy's) and None (the
        batches name no SGD steps)."""
        if not self.keyed:
            return self.only_group().weights_for_runners()
        ids = self.groups if policy_ids is None else policy_ids
        return {policy_id: self.groups[policy_id].get_weights() for policy_id in ids}, None

    def copy_frozen(self, frozen_copies: dict, check: bool = False) -> dict:
        """Each frozen policy id of `frozen_copies` takes its source's weights (in order)
        -> frozen id -> the weights it took; `check`: first that both have the same
        weight names and shapes."""
        copied = {}
        for frozen, source in frozen_copies.items():
            weights = self.groups[source].get_weights()
            if check:
                check_same_layout(frozen, self.groups[frozen].get_weights(), source, weights)
            self.groups[frozen].set_weights(weights)
            copied[frozen] = weights
        return copied

    def last_gradients(self) -> dict:
        """policy id -> LearnerGroup.last_gradients."""
        return {policy_id: group.last_gradients() for policy_id, group in self.groups.items()}

    # ----- state and checkpoints, in the run's layout ---------------------------------

    def _in_layout(self, states: dict):
        return states if self.keyed else states[DEFAULT_POLICY_ID]

    def get_state(self):
        """The learners' state (TFPolicy.get_state): policy id -> state, or unkeyed the
        one policy's state."""
        return self._in_layout({p: group.get_state() for p, group in self.groups.items()})

    def newest_state(self):
        """get_state's layout of LearnerGroup.newest_state; None when any is lost."""
        states = {policy_id: group.newest_state() for policy_id, group in self.groups.items()}
        return None if any(s is None for s in states.values()) else self._in_layout(states)

    def save(self, checkpoint: Path, state) -> None:
        """Write `state` (get_state's layout) into checkpoint (a new dir): each policy's
        into policies/<policy id>/, or unkeyed the one policy's into policy/."""
        if not self.keyed:
            self.only_group().save(str(checkpoint / checkpoints.POLICY_SUBDIR), state)
            return
        for policy_id, policy_state in state.items():
            checkpoints.write_policy_state(
                checkpoints.policy_state_dir(checkpoint, policy_id), policy_state
            )

    def check_policy_ids(self, checkpoint: Path, saved: dict) -> None:
        """The checkpoint's policy ids (`saved`: its algorithm_state.json) are this run's."""
        check_policy_ids(
            checkpoint, saved.get("policy_ids"), list(self.groups) if self.keyed else None
        )

    def read_checked(self, checkpoint: Path, saved: dict):
        """The learners' state in `checkpoint` (get_state's layout), its files read;
        keyed, each policy's state is checked against its policy too (unkeyed, set_state
        checks the one); nothing is assigned."""
        self.check_policy_ids(checkpoint, saved)
        if not self.keyed:
            return checkpoints.read_policy_state(checkpoint / checkpoints.POLICY_SUBDIR)
        states = checkpoints.read_policy_states(checkpoint, saved["policy_ids"])
        for policy_id, state in states.items():
            try:  # names the entry; a learner actor's error too (a RayTaskError)
                self.groups[policy_id].foreach_policy(
                    lambda policy, s: policy.check_state(s), state
                )
            except (ValueError, TypeError, KeyError) as err:
                where = checkpoints.policy_state_dir(checkpoint, policy_id)
                raise CheckpointFileError(f"{where}: {one_line(err)}") from None
        return states

    def set_state(self, state) -> None:
        """Set a state read_checked returned on every policy's learners."""
        states = state if self.keyed else {DEFAULT_POLICY_ID: state}
        for policy_id, policy_state in states.items():
            self.groups[policy_id].set_state(policy_state)

    def stop(self) -> None:
        for group in self.groups.values():
            group.stop()

"""A multi-agent run's two halves, called as the loop calls an EnvRunnerGroup and a
LearnerGroup: `multi_agent_env_runners` builds its EnvRunnerGroup (sampling in
the driver, or in env runner actors each acting with a CPU copy of every policy, or
through one MultiPolicyActor), `MultiAgentLearners` holds a LearnerGroup per policy
(each policy its own learner role; num_learners: 0 puts them in the driver) and updates
only the policies in `policies_to_train` on their own rows.

A checkpoint of such a run holds policies/<policy id>/ for every policy (each as a
single-agent checkpoint's policy/) and, in algorithm_state.json, "policy_ids" and
"agent_policy_ids" (each possible agent's policy, what `evaluate` maps them by)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from algorithms.environments import env_maker
from policy_service.errors import one_line
from policy_service.io import checkpoints
from policy_service.io.checkpoints import CheckpointFileError
from policy_service.multi_agent import pettingzoo_env
from policy_service.multi_agent.batch import MultiAgentBatch
from policy_service.multi_agent.env import MultiAgentEnv, MultiAgentEnvError
from policy_service.multi_agent.policies import (
    AgentPolicies,
    agent_policies,
    mapping_function_registered,
    registered_mapping_name,
)
from policy_service.multi_agent.self_play import check_same_layout
from policy_service.policy.learning_results import NUM_SAMPLES_TRAINED

if TYPE_CHECKING:
    from policy_service.distributed.env_runner_group import EnvRunnerGroup

MULTI_AGENT_KEYS = (
    "policies",
    "policy_mapping_fn",
    "policies_to_train",
    "count_steps_by",
    "frozen_copies",
    "frozen_copies_every",
)
# what a policy's own config leaves out of the run's: the keys above, and the env, which
# is every agent's (a policy config naming a "pettingzoo:" env without policies is refused)
RUN_ONLY_KEYS = (*MULTI_AGENT_KEYS, "env", "env_config")


def multi_agent_env_creator(name: str) -> Callable[[dict], MultiAgentEnv]:
    """What env runners make the env from: a register_env name's creator, resolved here
    (an actor's registry is empty), or a "pettingzoo:" name's maker."""
    if pettingzoo_env.is_pettingzoo_name(name):
        return functools.partial(pettingzoo_env.make_pettingzoo_env, name)
    maker = env_maker(name)
    if not callable(maker):
        raise _not_multi_agent(name, "a gymnasium id")
    return maker


def make_multi_agent_env(name: str, env_config: dict) -> MultiAgentEnv:
    """A register_env name's creator(env_config), or a "pettingzoo:" name's env."""
    env = multi_agent_env_creator(name)(env_config)
    if not isinstance(env, MultiAgentEnv):
        raise _not_multi_agent(name, type(env).__name__)
    return env


def _not_multi_agent(name: str, made: str) -> MultiAgentEnvError:
    return MultiAgentEnvError(
        f"config.policies needs a multi-agent env, but {name!r} made {made}; give a name "
        f"passed to register_env whose creator returns a policy_service.MultiAgentEnv, or "
        f"'pettingzoo:<module>.<env_fn>'"
    )


def resolve_policies(config, default_class: type) -> tuple[MultiAgentEnv, AgentPolicies]:
    """The env and every policy's complete spec (its config: the run's, less
    RUN_ONLY_KEYS, updated with the PolicySpec's), checked against the env's agents
    before the run."""
    env = make_multi_agent_env(config.env, dict(config.env_config))
    base = {k: v for k, v in config.to_dict().items() if k not in RUN_ONLY_KEYS}
    found = agent_policies(
        config.policies,
        config.policy_mapping_fn,
        config.policies_to_train,
        env,
        default_class,
        base,
    )
    return env, found


def json_config(config) -> dict:
    """The multi-agent keys of `config` as JSON for a checkpoint: a PolicySpec as its
    class ("module:QualName") and config (its spaces are in its policy's state), the
    mapping function by name (a prefix dict as itself); code is never loaded from these
    (`from_checkpoint`)."""
    mapping_fn = config.policy_mapping_fn
    return {
        "policies": {
            policy_id: None
            if spec is None
            else {
                "policy_class": spec.policy_class and checkpoints.class_path(spec.policy_class),
                "config": spec.config,
            }
            for policy_id, spec in config.policies.items()
        },
        "policy_mapping_fn": mapping_fn
        if mapping_fn is None or isinstance(mapping_fn, dict | str)
        else registered_mapping_name(mapping_fn)
        or f"{mapping_fn.__module__}:{mapping_fn.__qualname__}",
    }


def loadable_config(config: dict, checkpoint: str) -> dict:
    """A checkpoint's config (json_config's form), if it builds the run again: every
    policy None and no mapping function (a prefix dict, or the name of a mapping this
    process registered, is data); else a one-line CheckpointFileError."""
    policies = config.get("policies")
    mapping = config.get("policy_mapping_fn")
    if isinstance(mapping, str) and mapping_function_registered(mapping):
        mapping = None  # a registered mapping's name is data
    if not (mapping is None or isinstance(mapping, dict)) or any((policies or {}).values()):
        raise CheckpointFileError(
            f"{checkpoint}: its run had a policy_mapping_fn or PolicySpecs (code, not loaded "
            "from a file); build the algorithm with that config, then call restore(), or "
            "--import the module that registers its mapping by name"
        )
    return config


class PolicyIdsMismatch(CheckpointFileError):
    """A checkpoint's policies are not the ones of the algorithm restoring it."""


def check_policy_ids(checkpoint, found: list | None, expected: list | None) -> None:
    """The checkpoint's policy ids (None: a single-agent checkpoint) are the run's
    (None: a single-agent run); else PolicyIdsMismatch naming both."""
    if (found is None) == (expected is None) and sorted(found or []) == sorted(expected or []):
        return

    def named(ids):
        return "one policy (no config.policies)" if ids is None else f"policies {sorted(ids)}"

    raise PolicyIdsMismatch(
        f"{checkpoint}: holds {named(found)}, but this run's config expects {named(expected)}"
    )


def multi_agent_env_runners(
    config,
    policies: AgentPolicies,
    seed: int | None,
    inference_actors: dict | None = None,
    callbacks: list | None = None,
) -> EnvRunnerGroup:
    """The run's env runners (AlgorithmConfig.env_runner_settings); `seed` seeds the
    episodes and the acting copies' sampling (None: the policies' config seed);
    `inference_actors` (MultiAgentLearners.actors): each policy acts through its learners;
    `callbacks`: the classes whose runner hooks run in the env runners."""
    from policy_service.distributed.env_runner_group import EnvRunnerGroup

    return EnvRunnerGroup(
        multi_agent_env_creator(config.env),
        policies,
        inference_actors=inference_actors,
        callbacks=callbacks,
        **config.env_runner_settings(seed),
    )


class MultiAgentLearners:
    """A LearnerGroup per policy id; `update_each` updates the trained ones only."""

    def __init__(self, policies: AgentPolicies) -> None:
        from policy_service.distributed.learner_group import LearnerGroup

        self.policies_to_train = policies.policies_to_train
        self.groups: dict = {}
        try:
            for policy_id, spec in policies.specs.items():
                assert spec.observation_space is not None and spec.action_space is not None
                self.groups[policy_id] = LearnerGroup(
                    spec.built_class(), spec.observation_space, spec.action_space, spec.config
                )
        except BaseException:
            self.stop()
            raise
        first = next(iter(self.groups.values()))
        self.num_learners, self.num_towers = first.num_learners, first.num_towers

    @property
    def num_restarts(self) -> int:
        return sum(group.num_restarts for group in self.groups.values())

    def add(self, policy_id: str, spec, state: dict | None = None) -> None:
        """A LearnerGroup for a new policy (Algorithm.add_policy), from `state` if given."""
        from policy_service.distributed.learner_group import LearnerGroup

        assert spec.observation_space is not None and spec.action_space is not None
        group = LearnerGroup(
            spec.built_class(), spec.observation_space, spec.action_space, spec.config
        )
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

    def update_each(self, update: Callable, batch: MultiAgentBatch, timestep: int) -> dict:
        """update(group, rows) for every trained policy with rows, each group at the
        global `timestep` (what schedules read) -> stats as "<policy id>/<stat>", and
        the samples trained summed."""
        stats: dict = {NUM_SAMPLES_TRAINED: 0}
        for policy_id in self.policies_to_train:
            rows = batch.policy_batches.get(policy_id)
            if rows is None or not rows.count:
                continue
            self.groups[policy_id].set_global_timestep(timestep)
            result = dict(update(self.groups[policy_id], rows))
            stats[NUM_SAMPLES_TRAINED] += int(result.pop(NUM_SAMPLES_TRAINED))
            stats.update({f"{policy_id}/{k}": v for k, v in result.items()})
        return stats

    def get_weights(self) -> dict:
        return {policy_id: group.get_weights() for policy_id, group in self.groups.items()}

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

    def get_states(self) -> dict:
        """policy id -> its learners' state (TFPolicy.get_state)."""
        return {policy_id: group.get_state() for policy_id, group in self.groups.items()}

    def newest_states(self) -> dict | None:
        """policy id -> LearnerGroup.newest_state; None when any of them is lost."""
        states = {policy_id: group.newest_state() for policy_id, group in self.groups.items()}
        return None if any(s is None for s in states.values()) else states

    def save(self, checkpoint: Path, states: dict) -> None:
        """Write each policy's state into checkpoint/policies/<policy id>/ (a new dir)."""
        for policy_id, state in states.items():
            checkpoints.write_policy_state(
                checkpoints.policy_state_dir(checkpoint, policy_id), state
            )

    def read_checked(self, checkpoint: Path, saved: dict) -> dict:
        """Every policy's state of `checkpoint` (`saved`: its algorithm_state.json),
        files read and each state checked against its policy; nothing is assigned.
        Ids other than this run's are a PolicyIdsMismatch, before any file is read."""
        check_policy_ids(checkpoint, saved.get("policy_ids"), list(self.groups))
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

    def set_states(self, states: dict) -> None:
        """Set states read_checked returned on every policy's learners."""
        for policy_id, state in states.items():
            self.groups[policy_id].set_state(state)

    def stop(self) -> None:
        for group in self.groups.values():
            group.stop()

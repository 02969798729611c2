"""A run with `policies` and `input`: each policy trains on its own logged rows, the rows
a multi-agent run's `output` wrote under its policy id (RLlib's multi-agent datasets).

    config = {"input": "logs/", "policies": {"pa": None, "pb": None}}   # no env needed
    runners, policies = offline_multi_agent_runners(config, BCPolicy, seed=0)
    batch, metrics = runners.sample()   # a MultiAgentBatch: train_batch_size rows each

Every policy's spaces come from the dataset's manifest (from the env when one is given,
checked against the manifest), and each policy reads through its own OfflineRunners
(policy_service/offline/offline_runner_type.py), with its own config. A policy of the
config without rows in the dataset, or whose PolicySpec spaces disagree with the
manifest's, is one line before anything trains.
"""

from __future__ import annotations

from typing import cast

import gymnasium as gym

from algorithms.multi_agent import RUN_ONLY_KEYS, resolve_policies
from policy_service.config import from_dict
from policy_service.multi_agent.batch import MultiAgentBatch
from policy_service.multi_agent.policies import AgentPolicies, mapping_function
from policy_service.offline.columns import OfflineDataError
from policy_service.offline.offline_runner_type import OfflineRunners, required_columns
from policy_service.offline.read_position import ReadPosition
from policy_service.offline.reader import Experiences, open_experiences
from policy_service.policy.policy_spec import PolicySpec
from policy_service.policy.tf_policy import TFPolicy


def offline_multi_agent_runners(
    config, default_class: type, seed: int | None
) -> tuple[OfflineMultiAgentRunners, AgentPolicies]:
    """The runners reading every policy's rows, and the policies, spaces filled in."""
    prefix = config.key_prefix
    if config.env:  # evaluation plays it: its agents' spaces must be the dataset's
        env, resolved = resolve_policies(config, default_class)
        env.close()
        policies = AgentPolicies(
            {p: s._replace(config=_policy_config(s.config)) for p, s in resolved.specs.items()},
            resolved.mapping_fn,
            resolved.policies_to_train,
            resolved.agent_policy_ids,
        )
        given = {p: (s.observation_space, s.action_space) for p, s in policies.specs.items()}
    else:
        given = {  # a PolicySpec's spaces, checked against the manifest's
            p: (spec.observation_space, spec.action_space)
            for p, spec in config.policies.items()
            if spec is not None and (spec.observation_space or spec.action_space)
        }
    classes = {
        p: (spec.policy_class if spec is not None and spec.policy_class else default_class)
        for p, spec in config.policies.items()
    }
    experiences = open_experiences(
        config.input,
        spaces=given,
        require=tuple(c for p in classes for c in required_columns(config, classes[p])),
        name=f"{prefix}.input",
    )
    _check_every_policy_has_rows(experiences, list(config.policies), prefix)
    if not config.env:
        policies = _policies_from_manifest(config, experiences, classes)
    runners: dict[str, OfflineRunners] = {}
    try:
        for index, (policy_id, spec) in enumerate(policies.specs.items()):
            policy_cls = cast("type[TFPolicy]", spec.built_class())
            policy_config = from_dict(policy_cls.config_class, spec.config)
            runners[policy_id] = OfflineRunners(
                experiences[policy_id],
                (spec.observation_space, spec.action_space),
                policy_config,
                policy_cls,
                None if seed is None else seed + index,
            )
    except BaseException:  # a later policy's one-line refusal: the readers built are closed
        for built in runners.values():
            built.stop()
        raise
    return OfflineMultiAgentRunners(runners, policies), policies


def _check_every_policy_has_rows(experiences: Experiences, policy_ids: list, prefix: str):
    for policy_id in policy_ids:
        if policy_id not in experiences.policy_ids or not experiences[policy_id].num_rows:
            raise OfflineDataError(
                f"{prefix}.policies: policy {policy_id!r} has no rows in {prefix}.input "
                f"(its policies: {sorted(experiences.policy_ids)})"
            )


def _policies_from_manifest(config, experiences: Experiences, classes: dict) -> AgentPolicies:
    """Each policy's complete PolicySpec, its spaces the manifest's (RLlib's own JSON
    files name none: then the env must)."""
    base = {k: v for k, v in config.to_dict().items() if k not in RUN_ONLY_KEYS}
    specs = {}
    for policy_id, given in config.policies.items():
        dataset = experiences[policy_id]
        spaces = (dataset.observation_space, dataset.action_space)
        if not all(isinstance(s, gym.Space) for s in spaces):
            raise OfflineDataError(
                f"{dataset.files[0]}: no manifest names policy {policy_id!r}'s spaces "
                f"(RLlib's own JSON files): give {config.key_prefix}.env, whose spaces they are"
            )
        own = {} if given is None or given.config is None else given.config
        specs[policy_id] = PolicySpec(classes[policy_id], *spaces, _policy_config({**base, **own}))
    return AgentPolicies(
        specs, mapping_function(config.policy_mapping_fn), config.policies_to_train
    )


def _policy_config(config: dict) -> dict:
    """A policy's config less the run's evaluation_interval: the run evaluates (in the
    env it names, which a policy's config leaves out: an offline config evaluating
    without env is refused)."""
    return {k: v for k, v in config.items() if k != "evaluation_interval"}


class OfflineMultiAgentRunners:
    """The multi-agent env runners of an offline run: a policy's OfflineRunners each."""

    num_env_runners = 0
    num_restarts = 0
    filter_stats = None

    def __init__(self, runners: dict[str, OfflineRunners], agent_policies: AgentPolicies):
        self.runners = runners
        self.agent_policies = agent_policies

    def sample(self) -> tuple[MultiAgentBatch, dict]:
        """Each policy's next rows_per_sample rows; they count as that many env steps
        (one sample of a run), their sum as agent steps."""
        parts = {p: runners.sample() for p, runners in self.runners.items()}
        batches = {p: batch for p, (batch, _) in parts.items()}
        env_steps = max(batch.count for batch in batches.values())
        metrics = {
            **next(iter(parts.values()))[1],
            "env_steps": env_steps,
            "agent_steps": sum(batch.count for batch in batches.values()),
            "policy_episode_returns": {},
            "sample_time_s": sum(m["sample_time_s"] for _, m in parts.values()),
        }
        return MultiAgentBatch(batches, env_steps), metrics

    def sync_weights(
        self,
        weights: dict,
        version: int | None = None,
        wait: bool = True,
        num_grad_updates: int | None = None,
    ) -> int:
        """Each policy's postprocessing copy takes its weights (policy id -> weights)."""
        versions = [
            self.runners[p].sync_weights(w, version, wait, num_grad_updates)
            for p, w in weights.items()
        ]
        return max(versions, default=0)

    def read_positions(self) -> dict[str, ReadPosition]:
        """policy id -> where its reading stands (read_position.py)."""
        return {p: runners.read_positions()[p] for p, runners in self.runners.items()}

    def check_read_positions(self, positions: dict[str, ReadPosition]) -> None:
        if set(positions) != set(self.runners):
            raise ValueError(
                f"read positions of policies {sorted(positions)}, this run reads "
                f"{sorted(self.runners)}"
            )
        for policy_id, runners in self.runners.items():
            runners.check_read_positions({policy_id: positions[policy_id]})

    def set_read_positions(self, positions: dict[str, ReadPosition]) -> None:
        for policy_id, runners in self.runners.items():
            runners.set_read_positions({policy_id: positions[policy_id]})

    def set_global_timestep(self, timestep: int) -> None:
        """Nothing acts here."""

    def weights_versions(self) -> list[int]:
        return [v for runners in self.runners.values() for v in runners.weights_versions()]

    def wait_started(self) -> None:
        """The files are open already."""

    def stop(self) -> None:
        for runners in self.runners.values():
            runners.stop()

"""Which policy acts for which agent: config `policies` (id -> None or PolicySpec),
`policy_mapping_fn(agent_id, episode, **kwargs)`, `policies_to_train` (RLlib's names).
`policy_mapping_fn` may also be data, a dict of agent-id prefix -> policy id
(`PrefixMapping`), or the name of a mapping a user module registered
(`register_policy_mapping_fn`), which a config file or checkpoint can hold: no code
comes from a file.

`check_policies_config` runs where the config enters (its dataclass); `AgentPolicies`
is built once the env's agents and spaces are known, before the run starts: every
possible agent is mapped, each policy's spaces are filled in from its agents or checked
against them. An id the mapping returns later for a new agent is checked on that step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from policy_service.config import ConfigError
from policy_service.io.checkpoints import check_policy_id
from policy_service.policy.policy_spec import PolicySpec

DEFAULT_POLICY_ID = "default_policy"


class MultiAgentConfigError(ConfigError):
    """Policies, a mapping or policies_to_train that cannot work together."""


def default_policy_mapping_fn(agent_id, episode, **kwargs) -> str:
    """RLlib's default: every agent acts with "default_policy"."""
    return DEFAULT_POLICY_ID


class PrefixMapping:
    """policy_mapping_fn as data: an agent acts with the policy of the longest of
    `prefixes` (agent-id prefix -> policy id) its id starts with, e.g. {"adversary_":
    "adversaries", "agent_": "agents"}; an id matching none is a one-line error."""

    def __init__(self, prefixes: dict[str, str]) -> None:
        self.prefixes = dict(prefixes)
        self._longest_first = sorted(self.prefixes, key=len, reverse=True)

    def __call__(self, agent_id, episode, **kwargs) -> str:
        for prefix in self._longest_first:
            if str(agent_id).startswith(prefix):
                return self.prefixes[prefix]
        raise MultiAgentConfigError(
            f"policy_mapping_fn: agent {agent_id!r} starts with none of the prefixes "
            f"{sorted(self.prefixes)}"
        )

    def __repr__(self) -> str:
        return f"PrefixMapping({self.prefixes!r})"


_REGISTERED_MAPPINGS: dict[str, Callable] = {}


def register_policy_mapping_fn(name: str, fn: Callable) -> None:
    """Make `policy_mapping_fn: name` (in a config file, `--set` or a checkpoint) map
    agents with `fn`: a mapping that is code reaches the command line through a module
    the user names with `--import`, which registers it; a file only names it."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"a policy mapping's name must be a non-empty str, got {name!r}")
    if not callable(fn):
        raise TypeError(f"policy mapping {name!r} must be callable, got {fn!r}")
    _REGISTERED_MAPPINGS[name] = fn


def mapping_function_registered(name: str) -> bool:
    return name in _REGISTERED_MAPPINGS


def registered_mapping_name(fn: Callable) -> str | None:
    """The name `fn` was registered under, if any (what a checkpoint records)."""
    return next((name for name, f in _REGISTERED_MAPPINGS.items() if f is fn), None)


def mapping_function(policy_mapping_fn: Callable | dict | str | None) -> Callable:
    """The config's policy_mapping_fn as a function (a dict: by agent-id prefix; a str:
    the mapping registered under that name)."""
    if policy_mapping_fn is None:
        return default_policy_mapping_fn
    if isinstance(policy_mapping_fn, dict):
        return PrefixMapping(policy_mapping_fn)
    if isinstance(policy_mapping_fn, str):
        return _REGISTERED_MAPPINGS[policy_mapping_fn]
    return policy_mapping_fn


def check_policies_config(
    policies: dict | None,
    policy_mapping_fn: Callable | dict | str | None,
    policies_to_train: list | None,
    prefix: str = "config",
) -> None:
    """The multi-agent keys fit each other; else a one-line error naming the key."""
    if policies is None:
        for key, value in (
            ("policy_mapping_fn", policy_mapping_fn),
            ("policies_to_train", policies_to_train),
        ):
            if value is not None:
                raise MultiAgentConfigError(f"{prefix}.{key} is set but {prefix}.policies is not")
        return
    if not policies:
        raise MultiAgentConfigError(f"{prefix}.policies must name at least one policy, got {{}}")
    for policy_id, spec in policies.items():
        if not isinstance(policy_id, str) or not (spec is None or isinstance(spec, PolicySpec)):
            raise MultiAgentConfigError(
                f"{prefix}.policies[{policy_id!r}] must map a str id to None or a PolicySpec, "
                f"got {type(spec).__name__}"
            )
        try:  # checkpoints keep each policy in a directory of its id
            check_policy_id(policy_id)
        except ValueError as err:
            raise MultiAgentConfigError(f"{prefix}.policies: {err}") from None
    for policy_id in policies_to_train or ():
        if policy_id not in policies:
            raise MultiAgentConfigError(
                f"{prefix}.policies_to_train names {policy_id!r}, which is no policy in "
                f"{prefix}.policies {sorted(policies)}"
            )
    if isinstance(policy_mapping_fn, dict):
        _check_prefixes(policy_mapping_fn, policies, f"{prefix}.policy_mapping_fn")
    elif isinstance(policy_mapping_fn, str):
        if policy_mapping_fn in _REGISTERED_MAPPINGS:
            return
        raise MultiAgentConfigError(
            f"{prefix}.policy_mapping_fn {policy_mapping_fn!r} is no registered mapping "
            f"(registered: {sorted(_REGISTERED_MAPPINGS)}); register it with "
            f"policy_service.register_policy_mapping_fn in a module given to --import"
        )
    elif not (policy_mapping_fn is None or callable(policy_mapping_fn)):
        raise MultiAgentConfigError(
            f"{prefix}.policy_mapping_fn must be a function, a dict of agent-id prefix -> "
            f"policy id or a registered mapping's name, got {type(policy_mapping_fn).__name__}"
        )


def _check_prefixes(prefixes: dict, policies: dict, key: str) -> None:
    if not prefixes:
        raise MultiAgentConfigError(
            f"{key} must map at least one agent-id prefix to a policy id, got {{}}"
        )
    for agent_prefix, policy_id in prefixes.items():
        if not isinstance(agent_prefix, str) or not agent_prefix:
            raise MultiAgentConfigError(
                f"{key}: an agent-id prefix must be a non-empty str, got {agent_prefix!r}"
            )
        if policy_id not in policies:
            raise MultiAgentConfigError(
                f"{key} maps prefix {agent_prefix!r} to {policy_id!r}, which is no policy "
                f"in {key.rpartition('.')[0]}.policies {sorted(policies)}"
            )


class AgentPolicies:
    """Complete PolicySpecs by id, the mapping from agents to them and the ids trained;
    `agent_policy_ids`: each possible agent's policy as mapped before the run."""

    def __init__(
        self,
        specs: dict[str, PolicySpec],
        mapping_fn: Callable,
        policies_to_train: list[str] | None,
        agent_policy_ids: dict[str, str] | None = None,
    ) -> None:
        self.specs = specs
        self.mapping_fn = mapping_fn
        self.agent_policy_ids = dict(agent_policy_ids or {})
        self.policies_to_train = (
            list(specs) if policies_to_train is None else list(policies_to_train)
        )

    def policy_id(self, agent_id, episode, **kwargs) -> str:
        """The policy `agent_id` acts with in `episode`; an unknown id is a one-line error."""
        policy_id = self.mapping_fn(agent_id, episode, **kwargs)
        if policy_id not in self.specs:
            raise MultiAgentConfigError(
                f"policy_mapping_fn maps agent {agent_id!r} to policy {policy_id!r}, which is "
                f"no policy in config.policies {sorted(self.specs)}"
            )
        return policy_id

    def spaces(self) -> tuple[dict, dict]:
        """(policy id -> observation space, policy id -> action space)."""
        return (
            {p: spec.observation_space for p, spec in self.specs.items()},
            {p: spec.action_space for p, spec in self.specs.items()},
        )


def refuse_policy_config_beside(policy_config: Any, holder: str) -> None:
    """An AgentPolicies holds each policy's config: one more, given to the `holder` built
    from it (a worker, a group), would be ignored, so it is refused in one line."""
    if policy_config is not None:
        raise ValueError(
            "policy_config: an AgentPolicies holds each policy's config, got "
            f"one for the {holder} too ({type(policy_config).__name__})"
        )


def agent_policies(
    policies: dict[str, PolicySpec | None],
    policy_mapping_fn: Callable | dict | str | None,
    policies_to_train: list[str] | None,
    env,
    default_class: type,
    base_config: dict,
) -> AgentPolicies:
    """Every policy as a complete PolicySpec (class, spaces, its config: `base_config`
    updated with the spec's), checked against the env's agents mapped to it."""
    mapping = AgentPolicies(
        {p: PolicySpec() for p in policies},
        mapping_function(policy_mapping_fn),
        policies_to_train,
    )
    agents_of: dict[str, list] = {p: [] for p in policies}
    agent_policy_ids = {}
    for agent in env.possible_agents:
        agent_policy_ids[str(agent)] = policy_id = mapping.policy_id(agent, None)
        agents_of[policy_id].append(agent)
    specs = {}
    for policy_id, given in policies.items():
        given = given or PolicySpec()
        spaces = {}
        for kind, env_spaces in (
            ("observation", env.observation_spaces),
            ("action", env.action_spaces),
        ):
            space = getattr(given, f"{kind}_space")
            for agent in agents_of[policy_id]:
                if space is None:
                    space = env_spaces[agent]
                elif env_spaces[agent] != space:
                    raise MultiAgentConfigError(
                        f"agent {agent!r} has {kind} space {env_spaces[agent]} but its policy "
                        f"{policy_id!r} has {space}"
                    )
            if space is None:
                raise MultiAgentConfigError(
                    f"policy {policy_id!r} has no {kind} space: no agent maps to it and its "
                    f"PolicySpec gives none"
                )
            spaces[kind] = space
        config: dict[str, Any] = {**base_config, **(given.config or {})}
        specs[policy_id] = PolicySpec(
            given.policy_class or default_class, spaces["observation"], spaces["action"], config
        )
    return AgentPolicies(specs, mapping.mapping_fn, policies_to_train, agent_policy_ids)

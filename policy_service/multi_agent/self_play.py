"""Self-play against frozen copies (issue 24): `frozen_copies` maps each frozen policy id
to the trained policy whose weights it takes every `frozen_copies_every` iterations, and
at the start. A frozen policy is never trained, so the learner meets a fixed past self
that is replaced in steps. It is a callback (FrozenCopies), as RLlib users write it."""

from __future__ import annotations

from policy_service.multi_agent.policies import MultiAgentConfigError
from policy_service.runs.callbacks import Callbacks


def check_frozen_copies(
    frozen_copies: dict | None,
    policies: dict | None,
    policies_to_train: list | None,
    prefix: str = "config",
) -> None:
    """The copies name policies of the run and no frozen policy is trained; else one line."""
    if frozen_copies is None:
        return
    key = f"{prefix}.frozen_copies"
    if policies is None:
        raise MultiAgentConfigError(f"{key} is set but {prefix}.policies is not")
    if not isinstance(frozen_copies, dict) or not frozen_copies:
        raise MultiAgentConfigError(
            f"{key} must map a frozen policy id to the policy id it copies, got {frozen_copies!r}"
        )
    trained = list(policies) if policies_to_train is None else list(policies_to_train)
    for frozen, source in frozen_copies.items():
        for role, policy_id in (("frozen", frozen), ("copied", source)):
            if policy_id not in policies:
                raise MultiAgentConfigError(
                    f"{key} names {role} policy {policy_id!r}, which is no policy in "
                    f"{prefix}.policies {sorted(policies)}"
                )
        if frozen == source:
            raise MultiAgentConfigError(f"{key} copies policy {frozen!r} into itself")
        if frozen in trained:
            given = "None (None: all)" if policies_to_train is None else repr(policies_to_train)
            raise MultiAgentConfigError(
                f"{key}: policy {frozen!r} is frozen, so {prefix}.policies_to_train must leave "
                f"it out, got {given}"
            )


def check_same_layout(frozen: str, frozen_weights: dict, source: str, source_weights: dict) -> None:
    """A frozen policy takes its source's weights as they are: same names and shapes."""
    layout = {name: tuple(w.shape) for name, w in frozen_weights.items()}
    source_layout = {name: tuple(w.shape) for name, w in source_weights.items()}
    if layout == source_layout:
        return
    differ = sorted(set(layout) ^ set(source_layout)) or sorted(
        name for name in layout if layout[name] != source_layout[name]
    )
    name = differ[0]
    raise MultiAgentConfigError(
        f"config.frozen_copies: policy {frozen!r} cannot take the weights of policy {source!r}: "
        f"{name!r} is {layout.get(name, 'missing')} in {frozen!r} and "
        f"{source_layout.get(name, 'missing')} in {source!r}"
    )


class FrozenCopies(Callbacks):
    """frozen_copies as a callback: after every `every`-th iteration each frozen policy
    takes its source's weights (Algorithm.copy_policy_weights); the env runners act with
    them from the next iteration."""

    def __init__(self, frozen_copies: dict, every: int):
        self.frozen_copies = dict(frozen_copies)
        self.every = int(every)

    def on_train_result(self, *, algorithm, result, **kwargs) -> None:
        if algorithm.iteration % self.every == 0:
            algorithm.copy_policy_weights(self.frozen_copies)

"""`policy-service estimate CHECKPOINT --input DIR`: the value of a checkpoint's policy
estimated from experiences another policy logged (off-policy estimation), without
playing an episode.

    policy-service estimate runs/bc-offline-.../ --input logs/ --methods wis,dr

Prints one JSON line: the checkpoint, the episodes and steps read, and per method
(RLlib's names, policy_service/offline/estimators.py) v_target (the estimate of the
policy's discounted return), v_behavior (the logged policy's), v_gain, v_delta, their
spreads, and what each took. The data's manifest spaces must be the policy's; a
column a method needs (action_logp for IS, WIS and DR) missing is one line naming the
file. Exit status 2 on bad input, as every command.
"""

from __future__ import annotations

import argparse
import json
import time

from policy_service.errors import UserError

ALL_METHODS = (
    "ImportanceSampling",
    "WeightedImportanceSampling",
    "DirectMethod",
    "DoublyRobust",
)
SHORT_NAMES = {
    "is": "ImportanceSampling",
    "wis": "WeightedImportanceSampling",
    "dm": "DirectMethod",
    "dr": "DoublyRobust",
}


class EstimateSetupError(UserError, ValueError):
    """An option of `estimate` that cannot work: one line naming it."""


def add_parser(sub) -> None:
    estimate = sub.add_parser(
        "estimate",
        help="estimate a checkpoint's value from logged experiences (off-policy estimation)",
        description="Estimate the discounted return of the policy in CHECKPOINT from "
        "experiences another policy logged (--input: Parquet or JSON-lines files with "
        "action_logp), by importance sampling (is, wis), a fitted Q model (dm) or both (dr). "
        "Prints one JSON line.",
    )
    estimate.add_argument("checkpoint", metavar="CHECKPOINT")
    estimate.add_argument(
        "--input",
        required=True,
        action="append",
        metavar="DIR",
        help="logged experiences: a directory, a glob or a file; repeatable",
    )
    estimate.add_argument(
        "--methods",
        default="is,wis,dm,dr",
        help="comma-separated: is, wis, dm, dr or RLlib's names (default: all four; dm and "
        "dr for discrete actions only)",
    )
    estimate.add_argument("--gamma", type=float, help="discount (default: the policy's)")
    estimate.add_argument(
        "--held-out",
        type=float,
        metavar="F",
        help="only the held-out episodes of a run that trained on --input with "
        "off_policy_estimation_held_out F",
    )
    estimate.add_argument(
        "--max-steps", type=int, metavar="N", help="read at most about N steps (default all)"
    )
    estimate.add_argument("--policy", metavar="ID", help="the policy of a multi-agent checkpoint")
    estimate.add_argument(
        "--import",
        dest="imports",
        action="append",
        metavar="MODULE",
        help="import MODULE first (custom models and policies); repeatable",
    )


def methods_of(text: str) -> dict[str, dict]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise EstimateSetupError(f"--methods: expected is, wis, dm or dr, got {text!r}")
    methods = {}
    for name in names:
        kind = SHORT_NAMES.get(name.lower(), name)
        if kind not in ALL_METHODS:
            raise EstimateSetupError(
                f"--methods: {name!r} is none of {', '.join(SHORT_NAMES)} "
                f"({', '.join(ALL_METHODS)})"
            )
        methods[name] = {"type": kind}
    return methods


def run(args: argparse.Namespace) -> int:
    from algorithms import saved_policies
    from algorithms.saved_policies import policy_from_state
    from policy_service.cli.user_modules import import_user_modules
    from policy_service.io.checkpoints import newest_loadable
    from policy_service.offline.estimators import estimate, logged_episodes

    import_user_modules(args.imports)
    methods = methods_of(args.methods)
    if args.gamma is not None and not 0 <= args.gamma <= 1:
        raise EstimateSetupError(f"--gamma must be in [0, 1], got {args.gamma}")
    if args.held_out is not None and not 0 < args.held_out < 1:
        raise EstimateSetupError(f"--held-out must be in (0, 1), got {args.held_out}")
    if args.max_steps is not None and args.max_steps < 1:
        raise EstimateSetupError(f"--max-steps must be >= 1, got {args.max_steps}")
    found, state = newest_loadable(
        saved_policies.checkpoint_candidates(args.checkpoint),
        lambda d: saved_policies.saved_policy_state(saved_policies.locate_one(d, args.policy)),
        args.checkpoint,
        skipped=(saved_policies.CheckpointError,),
        fatal=(saved_policies.PolicyChoiceError,),
    )
    policy = policy_from_state(state)
    gamma = float(policy.config.gamma if args.gamma is None else args.gamma)
    start = time.perf_counter()
    episodes = logged_episodes(
        args.input if len(args.input) > 1 else args.input[0],
        methods,
        spaces=(policy.observation_space, policy.action_space),
        held_out=args.held_out,
        name="--input",
        max_rows=args.max_steps,
    )
    read_s = time.perf_counter() - start
    estimates = estimate(policy, episodes, methods, gamma)
    print(
        json.dumps(
            {
                "checkpoint": str(found),
                "input": args.input,
                "gamma": gamma,
                "episodes": episodes.num_episodes,
                "steps": episodes.batch.count,
                "read_time_s": read_s,
                "estimates": estimates,
            }
        ),
        flush=True,
    )
    return 0

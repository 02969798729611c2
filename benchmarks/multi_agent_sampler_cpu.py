"""The MultiAgentSampler's own cost: CPU microseconds per env step of `sample()` with a
constant env and a policy that costs nothing, so what is timed is the sampler's
bookkeeping (acting batches, rows, chunks, concatenation), not an env or a model.

Sides: "work", the sampler in this checkout, and each `--refs` commit's
policy_service/multi_agent/sampler.py (read with `git show`, loaded beside it; it runs on
this checkout's other modules). Each round times every side at every sub-env count, the
order of the sides rotating each round; one JSON line per configuration gives each
side's median over the rounds and its ratio to the first ref's.

    python -m benchmarks.multi_agent_sampler_cpu                    # ~1 min
    python -m benchmarks.multi_agent_sampler_cpu --refs 27ce9b1 HEAD --envs 1 8 --rounds 9
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import gymnasium as gym
import numpy as np

from benchmarks import harness, plots
from benchmarks.stats import median
from policy_service.multi_agent.env import ALL, MultiAgentEnv
from policy_service.multi_agent.policies import agent_policies

REPO = Path(__file__).resolve().parents[1]
SAMPLER = "policy_service/multi_agent/sampler.py"
OBS_SIZE = 8


class ConstantEnv(MultiAgentEnv):
    """`agents` agents that all act every step, see the same obs and are paid 1; an
    episode is `episode_len` steps."""

    def __init__(self, agents: int, episode_len: int) -> None:
        self.possible_agents = [f"agent_{i}" for i in range(agents)]
        self.agents = list(self.possible_agents)
        space = gym.spaces.Box(-1.0, 1.0, (OBS_SIZE,), np.float32)
        self.observation_spaces = {a: space for a in self.possible_agents}
        self.action_spaces = {a: gym.spaces.Discrete(2) for a in self.possible_agents}
        self.episode_len = episode_len
        self._obs = np.zeros(OBS_SIZE, np.float32)
        self._t = 0

    def reset(self, *, seed=None, options=None):
        self._t = 0
        return {a: self._obs for a in self.agents}, {a: {} for a in self.agents}

    def step(self, action_dict):
        self._t += 1
        over = self._t >= self.episode_len
        obs = {a: self._obs for a in self.agents}
        rewards = {a: 1.0 for a in self.agents}
        dones = {a: over for a in self.agents}
        return obs, rewards, {**dones, ALL: over}, {**dones, ALL: False}, {}


class ZeroPolicy:
    """Acts 0 with the extra columns PPO's acting gives; postprocessing returns the chunks."""

    def __init__(self, observation_space, action_space, config) -> None:
        self.config = config

    def is_recurrent(self) -> bool:
        return False

    def get_initial_state(self) -> list:
        return []

    def compute_actions(self, obs, state=None, prev_actions=None, prev_rewards=None, **kw):
        n = len(obs)
        zeros = np.zeros(n, np.float32)
        return np.zeros(n, np.int64), [], {"vf_preds": zeros, "action_logp": zeros}

    def postprocess_trajectories(self, chunks: list) -> list:
        return chunks


def sampler_module(ref: str) -> ModuleType:
    """The sampler module at git commit `ref` ("work": this checkout's)."""
    if ref == "work":
        from policy_service.multi_agent import sampler

        return sampler
    source = subprocess.run(
        ["git", "show", f"{ref}:{SAMPLER}"], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout
    name = f"benchmarks.sampler_at_{ref}"
    spec = importlib.util.spec_from_loader(name, loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # (dataclasses look their module up)
    exec(compile(source, f"{ref}:{SAMPLER}", "exec"), module.__dict__)
    return module


def build(module: ModuleType, envs: int, agents: int, episode_len: int, fragment: int):
    sub_envs = [ConstantEnv(agents, episode_len) for _ in range(envs)]
    found = agent_policies(
        {"shared": None}, lambda agent, episode, **kw: "shared", None, sub_envs[0], ZeroPolicy, {}
    )
    policies = {p: spec.build() for p, spec in found.specs.items()}
    return module.MultiAgentSampler(sub_envs, found, policies, fragment, seed=0)


def us_per_env_step(sampler, fragments: int) -> float:
    """CPU microseconds per env step over `fragments` samples."""
    cpu = time.process_time()
    steps = sum(sampler.sample()[1]["env_steps"] for _ in range(fragments))
    return (time.process_time() - cpu) / steps * 1e6


NAME = "multi_agent_sampler_cpu"


def main() -> None:
    parser = harness.base_parser(__doc__.splitlines()[0])
    parser.add_argument("--refs", nargs="+", default=["27ce9b1"], help="commits to compare")
    parser.add_argument("--envs", type=int, nargs="+", default=[1, 8], help="sub-env counts")
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--episode-len", type=int, default=50)
    parser.add_argument("--fragment", type=int, default=200, help="env steps per sub-env")
    parser.add_argument("--env-steps", type=int, default=20000, help="timed per side a round")
    args = parser.parse_args()
    rounds = args.rounds or (2 if args.smoke else 7)
    if args.smoke:
        args.env_steps = 400
    meta = harness.start_meta(args, refs=args.refs)
    sides = [*args.refs, "work"]
    modules = {side: sampler_module(side) for side in sides}
    load = [os.getloadavg()[0]]
    records = []
    for envs in args.envs:
        samplers = {
            side: build(modules[side], envs, args.agents, args.episode_len, args.fragment)
            for side in sides
        }
        fragments = max(1, args.env_steps // (envs * args.fragment))
        for sampler in samplers.values():
            sampler.sample()  # warm-up
        timed: dict[str, list[float]] = {side: [] for side in sides}
        for r in range(rounds):
            for i in range(len(sides)):
                side = sides[(i + r) % len(sides)]
                timed[side].append(us_per_env_step(samplers[side], fragments))
        load.append(os.getloadavg()[0])
        medians = {side: median(values) for side, values in timed.items()}
        records.append(
            harness.emit(
                {
                    "bench": NAME,
                    "envs": envs,
                    "agents": args.agents,
                    "episode_len": args.episode_len,
                    "fragment": args.fragment,
                    "rounds": rounds,
                    "env_steps_per_round": fragments * envs * args.fragment,
                    "load_1min": load[-2:],
                    "us_per_env_step": {s: round(v, 2) for s, v in medians.items()},
                    "vs_" + sides[0]: {
                        s: round(medians[s] / medians[sides[0]], 3) for s in sides[1:]
                    },
                    "rounds_us": {s: [round(v, 1) for v in vs] for s, vs in timed.items()},
                }
            )
        )
    meta["plots"] = [plot(records, sides, args.out)]
    harness.finish(NAME, args.out, records, [], meta)


def plot(records: list[dict], sides: list[str], out_dir: str) -> str | None:
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    return plots.bar_chart(
        Path(out_dir) / f"{NAME}.png",
        "MultiAgentSampler: CPU per env step (constant env, zero-cost policy)",
        "microseconds per env step",
        [f"{r['envs']} sub-envs" for r in records],
        {side: [r["us_per_env_step"][side] for r in records] for side in sides},
    )


if __name__ == "__main__":
    main()

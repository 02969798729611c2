"""One simulator process of benchmarks/serve_rllib.py: CartPole-v1 episodes played
through a training server's PolicyClient in remote mode, ours or RLlib's.

    python -m benchmarks.episode_clients ours http://127.0.0.1:9900 --duration 15
    python -m benchmarks.episode_clients rllib http://127.0.0.1:9900 --duration 15

Once connected and through a warm-up of 50 steps it prints "ready" and reads the start
time (epoch seconds) from stdin, so that every client of a run starts together. Each step
is get_action then log_returns (what each client sends for that is its own: ours one
request a step, the reward riding on the next call; RLlib's two); an episode ends with
end_episode. get_action calls sent within [start, start + duration) are timed; then it
prints one JSON line: their count and latencies in ms.
Runs under RLlib's virtualenv too: nothing of ours is imported for `rllib`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def client_for(kind: str, address: str):
    """A remote-mode PolicyClient (waits up to 2 min for the server)."""
    deadline = time.monotonic() + 120
    while True:
        try:
            if kind == "ours":
                from policy_service.client import PolicyClient

                return PolicyClient(address, os.environ["POLICY_SERVICE_TOKEN"], "remote")
            from ray.rllib.env.policy_client import PolicyClient as RLlibClient

            return RLlibClient(address, inference_mode="remote")
        except ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def play(client, env, start_at: float, end_at: float, max_steps: int | None = None) -> list:
    """Episodes until end_at (or max_steps) -> latencies (s) of the get_action calls sent
    from start_at on."""
    latencies: list[float] = []
    steps = 0
    while time.time() < end_at and (max_steps is None or steps < max_steps):
        eid = client.start_episode()
        obs, _ = env.reset()
        done = False
        while not done and time.time() < end_at:
            sent = time.time()
            action = client.get_action(eid, obs)
            if sent >= start_at:
                latencies.append(time.time() - sent)
            obs, reward, terminated, truncated, _ = env.step(int(action))
            client.log_returns(eid, float(reward))
            done = terminated or truncated
            steps += 1
        if done:
            client.end_episode(eid, obs)
    return latencies


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=["ours", "rllib"])
    parser.add_argument("address")
    parser.add_argument("--duration", type=float, default=15.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    env.reset(seed=args.seed)
    client = client_for(args.kind, args.address)
    play(client, env, float("inf"), float("inf"), max_steps=50)  # warm: connection, server
    print("ready", flush=True)
    start_at = float(sys.stdin.readline())
    latencies = play(client, env, start_at, start_at + args.duration)
    print(json.dumps({"actions": len(latencies), "latencies_ms": [x * 1e3 for x in latencies]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One simulator process of benchmarks/serve_rllib.py: CartPole-v1 episodes played
through a training server's PolicyClient in remote mode, ours or RLlib's.

    python -m benchmarks.episode_clients ours http://127.0.0.1:9900 --duration 15
    python -m benchmarks.episode_clients rllib http://127.0.0.1:9900 --duration 15

Once connected and through a warm-up of 50 steps it prints "ready" and reads the start
time (epoch seconds) from stdin, so that every client of a run starts together. Each step
is get_action then log_returns (what each client sends for that is its own: ours one
request a step, the reward riding on the next call; RLlib's two); an episode ends with
end_episode. get_action calls sent within [start, start + duration) are timed; then it
prints one JSON line: their count, latencies in ms, and how many calls were sent again
after the connection was refused or reset (RLlib's client opens one per call, and its
server's listen backlog is 5: at 16 clients it resets some). A retried call's latency
includes its failed tries.
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
                from policy_service.client.policy_client import PolicyClient

                return PolicyClient(address, os.environ["POLICY_SERVICE_TOKEN"], "remote")
            from ray.rllib.env.policy_client import PolicyClient as RLlibClient

            return RLlibClient(address, inference_mode="remote")
        except ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


MAX_TRIES = 50


def sent(call, retries: list, *args):
    """call(*args), sent again (up to MAX_TRIES) while the connection is refused or reset;
    each retry is counted in retries[0]."""
    for attempt in range(MAX_TRIES):
        try:
            return call(*args)
        except OSError:  # requests' ConnectionError is one too
            if attempt == MAX_TRIES - 1:
                raise
            retries[0] += 1
            time.sleep(0.01)


def play(client, env, start_at: float, end_at: float, max_steps: int | None = None):
    """Episodes until end_at (or max_steps) -> (latencies (s) of the get_action calls sent
    from start_at on, retries)."""
    latencies: list[float] = []
    retries, steps = [0], 0
    while time.time() < end_at and (max_steps is None or steps < max_steps):
        eid = sent(client.start_episode, retries)
        obs, _ = env.reset()
        done = False
        while not done and time.time() < end_at:
            start = time.time()
            action = sent(client.get_action, retries, eid, obs)
            if start >= start_at:
                latencies.append(time.time() - start)
            obs, reward, terminated, truncated, _ = env.step(int(action))
            sent(client.log_returns, retries, eid, float(reward))
            done = terminated or truncated
            steps += 1
        if done:
            sent(client.end_episode, retries, eid, obs)
    return latencies, retries[0]


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
    latencies, retries = play(client, env, start_at, start_at + args.duration)
    ms = [x * 1e3 for x in latencies]
    print(json.dumps({"actions": len(latencies), "latencies_ms": ms, "retries": retries}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

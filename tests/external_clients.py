"""Simulator processes for the external-env tests: each talks to a training server
over HTTP only (policy_service.client.policy_client.PolicyClient), with its token from
$POLICY_SERVICE_TOKEN.

    python tests/external_clients.py interleaved ADDRESS --episodes 8 --seed 3
    python tests/external_clients.py play ADDRESS --mode local --seconds 600
    python tests/external_clients.py play ADDRESS --env Pendulum-v1

interleaved: opens all its episodes first, then steps a random open one at a time;
episode k lasts 1 + k % 6 CartPole steps (too few to fall: it ends truncated), so the
server must count exactly sum(1 + k % 6) steps. Prints one JSON line of counts.
play: plays episodes of --env (CartPole-v1) until the time is up, the server has gone
for good (no answer for --reconnect-s), or SIGINT; an episode the server lost (404, or
5xx while Serve replaces its replica; a connection refused while the server restarts)
is started again.
Prints one JSON line: episodes ended, lost, reconnects after a refused connection,
and why it stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

import gymnasium as gym
import numpy as np

from policy_service.client.policy_client import PolicyClient, PolicyClientError


def interleaved(client: PolicyClient, episodes: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    open_episodes = {}
    for k in range(episodes):
        env = gym.make("CartPole-v1")
        obs, _ = env.reset(seed=seed * 1000 + k)
        open_episodes[client.start_episode()] = [env, obs, 1 + k % 6]
    steps = 0
    while open_episodes:
        eid = list(open_episodes)[int(rng.integers(len(open_episodes)))]
        env, obs, left = open_episodes[eid]
        if rng.random() < 0.3:
            action = int(rng.integers(2))
            client.log_action(eid, obs, action)
        else:
            action = client.get_action(eid, obs)
        obs, reward, terminated, _, _ = env.step(action)
        assert not terminated, "a CartPole episode of at most 6 steps cannot fall"
        client.log_returns(eid, reward)
        steps += 1
        if left == 1:
            client.end_episode(eid, obs, truncated=True)
            del open_episodes[eid]
        else:
            open_episodes[eid] = [env, obs, left - 1]
    client.close()
    return {"episodes": episodes, "steps": steps}


def play(
    client: PolicyClient, env_id: str, counts: dict, deadline: float, seed: int, reconnect
) -> PolicyClient:
    """Episodes until the deadline, counted into `counts`; a refused connection is waited
    out by reconnect() (a new client), and the episode it cut off counts as lost."""
    env = gym.make(env_id)
    env.reset(seed=seed)
    while time.monotonic() < deadline:
        try:
            eid = client.start_episode()
            obs, _ = env.reset()
            while True:
                action = client.get_action(eid, obs)
                obs, reward, terminated, truncated, _ = env.step(action)
                client.log_returns(eid, reward)
                if terminated or truncated:
                    client.end_episode(eid, obs, truncated=not terminated)
                    counts["episodes"] += 1
                    break
        except PolicyClientError as err:
            if err.status != 404 and err.status < 500:
                raise
            counts["lost"] += 1  # the server (or its replica) restarted: this episode is gone
            time.sleep(0.5 if err.status >= 500 else 0)
        except ConnectionError:  # the server stopped: restarting (resume), or gone for good
            counts["lost"] += 1
            client = reconnect()
            counts["reconnects"] += 1
    return client


def connect(address: str, mode: str, update_interval_s: float, wait_s: float) -> PolicyClient:
    """A client, once the server answers (it may be starting or restarting)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return PolicyClient(
                address,
                os.environ["POLICY_SERVICE_TOKEN"],
                inference_mode=mode,
                update_interval_s=update_interval_s,
            )
        except (ConnectionError, PolicyClientError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=["interleaved", "play"])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("address")
    parser.add_argument("--mode", default="remote")
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--update-interval-s", type=float, default=2.0)
    parser.add_argument("--reconnect-s", type=float, default=60)
    args = parser.parse_args()

    def reconnect(wait_s: float = args.reconnect_s) -> PolicyClient:
        return connect(args.address, args.mode, args.update_interval_s, wait_s)

    client = reconnect(120)
    if args.kind == "interleaved":
        counts = interleaved(client, args.episodes, args.seed)
    else:
        counts = {"episodes": 0, "lost": 0, "reconnects": 0, "stopped": "time up"}
        try:
            deadline = time.monotonic() + args.seconds
            client = play(client, args.env, counts, deadline, args.seed, reconnect)
            client.close()
        except ConnectionError:
            counts["stopped"] = "server gone"
        except KeyboardInterrupt:  # SIGINT: the test has seen enough
            counts["stopped"] = "interrupted"
    print(json.dumps(counts), flush=True)
    return 0


if __name__ == "__main__":
    # the tests stop a player with SIGINT: a shell's background job starts its processes
    # with SIGINT ignored, and Python then installs no KeyboardInterrupt for it
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())

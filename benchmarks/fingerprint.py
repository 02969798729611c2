"""A run's numbers as JSON, to show a refactor changed no behaviour.

PPO (seeded, driver learner, and 2 fake GPUs) for 3 iterations: each iteration's
return, losses and a hash of every weight; DQN: save after 2 iterations, restore
in a new algorithm, and hash the weights after one more iteration in both.
Run it before and after a change and compare the two files:

    python -m benchmarks.fingerprint --out before.json   # on the old commit
    python -m benchmarks.fingerprint --out after.json
    diff before.json after.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def weights_hash(weights: dict) -> str:
    digest = hashlib.sha256()
    for name in sorted(weights):
        digest.update(name.encode())
        digest.update(weights[name].tobytes())
    return digest.hexdigest()[:16]


def ppo_fingerprint(num_gpus: int) -> list[dict]:
    from algorithms.ppo import PPO

    algo = PPO(
        {
            "env": "CartPole-v1",
            "seed": 0,
            "train_batch_size": 1000,
            "minibatch_size": 128,
            "num_epochs": 3,
            "lr": 3e-4,
            "num_gpus": num_gpus,
            "_fake_gpus": num_gpus > 0,
            "model": {"fcnet_hiddens": [32, 32]},
        }
    )
    rows = []
    try:
        for _ in range(3):
            result = algo.train()
            rows.append(
                {
                    "episode_return_mean": result.get("episode_return_mean"),
                    "losses": {
                        k: v
                        for k, v in sorted(result.items())
                        if k.endswith("loss") or k in ("kl", "entropy")
                    },
                    "weights": weights_hash(algo.get_policy().get_weights()),
                }
            )
    finally:
        algo.stop()
    return rows


def dqn_fingerprint() -> dict:
    from algorithms.dqn import DQN

    config = {
        "env": "CartPole-v1",
        "seed": 0,
        "num_steps_sampled_before_learning_starts": 200,
        "min_sample_timesteps_per_iteration": 200,
        "rollout_fragment_length": 50,
        "num_envs_per_env_runner": 4,
        "training_intensity": 8,
        "prioritized_replay": True,
        "checkpoint_replay_buffer": True,
        "model": {"fcnet_hiddens": [32]},
    }
    algo = DQN(config)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for _ in range(2):
                algo.train()
            algo.save(tmp)
            algo.train()
            continued = weights_hash(algo.get_policy().get_weights())
        finally:
            algo.stop()
        restored = DQN(config)
        try:
            restored.restore(tmp)
            restored.train()
            resumed = weights_hash(restored.get_policy().get_weights())
        finally:
            restored.stop()
    return {"continued": continued, "resumed": resumed, "identical": continued == resumed}


PARTS = {
    "ppo_1_tower": lambda: ppo_fingerprint(0),
    "ppo_2_fake_gpus": lambda: ppo_fingerprint(2),
    "dqn_restore": dqn_fingerprint,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="also write the JSON here")
    parser.add_argument(
        "--part",
        choices=sorted(PARTS),
        default=None,
        help="one part, in this process (each part needs a fresh one: "
        "the device count is fixed when TensorFlow starts)",
    )
    args = parser.parse_args()
    if args.part:
        print(json.dumps(PARTS[args.part]()))
        return
    result = {}
    for part in PARTS:
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.fingerprint", "--part", part],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        result[part] = json.loads(out.strip().splitlines()[-1])
    text = json.dumps(result, indent=1, sort_keys=True)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()

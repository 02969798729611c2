"""An RLlib (old API stack, TF) training script with only its imports changed.

In RLlib this script begins `from ray.rllib.algorithms.ppo import PPOConfig`; here it is
`from algorithms.ppo import PPOConfig`. Every call below is RLlib's: the builder methods
and their keywords, `build()`, `train()` and its `result["env_runners"]` entries,
`save()`, `stop()`. Settings: algorithms/tuned/cartpole_ppo.yaml's.

    python examples/rllib_style_ppo.py --stop-reward 450 --checkpoint-dir /tmp/ppo
"""

from __future__ import annotations

import argparse

from algorithms.ppo import PPOConfig  # RLlib: from ray.rllib.algorithms.ppo import PPOConfig


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stop-reward", type=float, default=450.0)
    parser.add_argument("--stop-timesteps", type=int, default=300_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint-dir", default=None)
    args = parser.parse_args(argv)

    config = (
        PPOConfig()
        .api_stack(enable_rl_module_and_learner=False, enable_env_runner_and_connector_v2=False)
        .environment("CartPole-v1")
        .framework("tf2")
        .env_runners(num_env_runners=0, num_envs_per_env_runner=2)
        .training(
            lr=0.002,
            gamma=0.99,
            lambda_=0.95,
            clip_param=0.2,
            vf_clip_param=10000.0,
            vf_loss_coeff=0.5,
            entropy_coeff=0.0,
            kl_coeff=0.0,
            train_batch_size=512,
            minibatch_size=128,
            num_epochs=20,
            model={"fcnet_hiddens": [64, 64], "fcnet_activation": "tanh"},
        )
        .debugging(seed=args.seed)
    )
    algo = config.build()
    try:
        while True:
            result = algo.train()
            runners = result["env_runners"]
            print(
                f"iteration {result['training_iteration']}: "
                f"return {runners['episode_return_mean']:.1f} "
                f"after {result['num_env_steps_sampled_lifetime']} env steps"
            )
            if (
                runners["episode_return_mean"] >= args.stop_reward
                or result["num_env_steps_sampled_lifetime"] >= args.stop_timesteps
            ):
                break
        if args.checkpoint_dir:
            print(f"checkpoint: {algo.save(args.checkpoint_dir)}")
        return result
    finally:
        algo.stop()


if __name__ == "__main__":
    main()

"""Several agents in one env: the env API (env.py), PettingZoo envs (pettingzoo_env.py),
which policy acts for which agent (policies.py), per-policy batches (batch.py) and the
sampler that builds each agent's trajectory (sampler.py)."""

"""`output`: env runners write what they act on (each runner its own files, rotated at
output_max_file_size, each renamed in when complete), with the behaviour policy's
action_logp and action_prob, eps_id, t, new_obs and JSON-safe infos; the manifest
names the spaces, the policy id and the weights version. The policy is a test policy
whose config takes the run's output keys; a training run with `output` set:
test_offline_config.py."""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import pytest
from fakes import ReturnsPGPolicy

from policy_service.config import from_dict, setting
from policy_service.data.sample_batch import SampleBatch, concat_samples
from policy_service.distributed.rollout_worker import RolloutWorker
from policy_service.offline import open_experiences
from policy_service.offline.manifest import MANIFEST, read_manifest
from policy_service.policy.policy_config import PolicyConfig

SMALL = {"model": {"fcnet_hiddens": [8]}, "seed": 0}
LOGGED = (
    SampleBatch.OBS,
    SampleBatch.NEXT_OBS,
    SampleBatch.ACTIONS,
    SampleBatch.REWARDS,
    SampleBatch.EPS_ID,
    SampleBatch.T,
    SampleBatch.ACTION_LOGP,
    SampleBatch.ACTION_PROB,
    "weights_version",
    SampleBatch.INFOS,
)


@dataclass
class OutputConfig(PolicyConfig):
    """PolicyConfig with the run's output keys (AlgorithmConfig's), which a worker reads
    from its policy's config."""

    output: str | None = setting(None, doc="The directory a worker writes what it acts on to.")
    output_format: str = setting("parquet", doc="'parquet' or 'json'.")
    output_max_file_size: int = setting(64 * 2**20, doc="Bytes after which a file rotates.")


class OutputPolicy(ReturnsPGPolicy):
    config_class = OutputConfig


class InfoCartPole(gym.Wrapper):
    """CartPole whose infos hold numpy values, and every third step something JSON
    cannot say."""

    def __init__(self, env_config: dict):
        super().__init__(gym.make("CartPole-v1"))
        self.steps = 0

    def step(self, action):
        obs, reward, terminated, truncated, _ = self.env.step(action)
        self.steps += 1
        info = {"x": np.float32(1.5), "n": self.steps}
        if self.steps % 3 == 0:
            info["bad"] = object()
        return obs, reward, terminated, truncated, info


def read_all(directory) -> SampleBatch:
    experiences = open_experiences(directory)
    return concat_samples(list(experiences.iter_batches(100_000)))


def keyed(batch: SampleBatch) -> dict:
    return {
        (e, t): i
        for i, (e, t) in enumerate(zip(batch[SampleBatch.EPS_ID].tolist(), batch[SampleBatch.T]))
    }


def test_a_worker_writes_each_fragment_it_returns(tmp_path):
    config = from_dict(
        OutputConfig, {"output": str(tmp_path), "output_max_file_size": 20_000, **SMALL}
    )
    worker = RolloutWorker(
        InfoCartPole, OutputPolicy, config, num_envs=2, rollout_fragment_length=150
    )
    returned = concat_samples([worker.sample()[0] for _ in range(3)])
    assert SampleBatch.INFOS not in returned  # kept for the files, not handed to training
    worker.stop()

    files = sorted((tmp_path / "default_policy").glob("*.parquet"))
    assert len(files) >= 2  # rotated
    assert not list(tmp_path.rglob(".*"))  # every file complete, renamed into place
    manifest = read_manifest(tmp_path / "default_policy" / MANIFEST)
    data = manifest.policies["default_policy"]
    assert data.observation_space == worker.observation_space
    assert data.action_space == worker.action_space and data.weights_version == 0
    written = read_all(tmp_path)
    assert set(LOGGED) <= set(written)
    assert written.count == returned.count == 900
    where, at = keyed(written), keyed(returned)
    assert where.keys() == at.keys()
    rows = [where[k] for k in at]
    for column in (SampleBatch.ACTIONS, SampleBatch.ACTION_LOGP, SampleBatch.NEXT_OBS):
        np.testing.assert_array_equal(written[column][rows], returned[column])
    np.testing.assert_allclose(
        np.exp(written[SampleBatch.ACTION_LOGP]), written[SampleBatch.ACTION_PROB], rtol=1e-6
    )
    infos = [written[SampleBatch.INFOS][i] for i in rows]
    kept = [i for i in infos if i]
    assert kept and all(i["x"] == 1.5 and "bad" not in i for i in kept)
    assert len(kept) < len(infos)  # the steps holding an object: {}


def test_json_output_reads_back_the_same(tmp_path):
    config = from_dict(OutputConfig, {"output": str(tmp_path), "output_format": "json", **SMALL})
    worker = RolloutWorker("CartPole-v1", OutputPolicy, config, rollout_fragment_length=100)
    returned = worker.sample()[0]
    worker.stop()
    assert [p.suffix for p in tmp_path.glob("output-*")] == [".json"]
    written = read_all(tmp_path)
    rows = [keyed(written)[k] for k in keyed(returned)]
    np.testing.assert_array_equal(written[SampleBatch.OBS][rows], returned[SampleBatch.OBS])


def test_a_multi_agent_worker_writes_each_policy_apart(tmp_path):
    from multi_agent_envs import TwoMapsEnv, by_agent

    from policy_service import PolicySpec
    from policy_service.multi_agent.policies import agent_policies

    policies = agent_policies(
        {"pa": PolicySpec(config={"seed": 1}), "pb": PolicySpec(config={"seed": 2})},
        by_agent,
        None,
        TwoMapsEnv(),
        OutputPolicy,
        {"model": {"fcnet_hiddens": [8]}, "output": str(tmp_path)},
    )
    worker = RolloutWorker(TwoMapsEnv, policies, num_envs=2, rollout_fragment_length=10)
    batch, _ = worker.sample()
    worker.stop()
    experiences = open_experiences(tmp_path)
    assert sorted(experiences.policy_ids) == ["pa", "pb"]
    for policy_id in ("pa", "pb"):
        data = experiences[policy_id]
        assert data.num_rows == batch.policy_batches[policy_id].count
        assert data.observation_space == policies.specs[policy_id].observation_space


@pytest.mark.slow  # ~40 s: a training server (Ray Serve) and 8 client processes
def test_the_external_env_server_writes_the_clients_steps(tmp_path):
    from external_env_processes import (
        ONE_ITERATION_OF_ALL,
        PPO_ARGS,
        TOTAL_INTERLEAVED,
        TrainingServer,
        clients,
        finished,
    )
    from ports import free_port

    port, out = free_port(), tmp_path / "logged"
    sets = [a for s in ONE_ITERATION_OF_ALL["ppo"] for a in ("--set", s)]
    server = TrainingServer(
        [*PPO_ARGS, "--port", str(port), "--output-dir", str(tmp_path / "run"), *sets]
        + ["--set", f"output={out}", "--set", "output_format=json", "--stop-iters", "1"]
    )
    try:
        server.wait_ready()
        finished(clients("interleaved", port, 8, "--episodes", "8"), 300)
        assert server.wait(300) == 0, server.output()
    finally:
        server.kill()
    written = read_all(out)
    assert written.count == TOTAL_INTERLEAVED  # every step the iteration took, once
    assert len(np.unique(written[SampleBatch.EPS_ID])) == 64
    assert np.all(written[SampleBatch.ACTION_LOGP] <= 0)
    assert [p.suffix for p in out.glob("output-*")] == [".json"]

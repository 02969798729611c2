"""A small algorithm that trains from logged rows, for the offline tests: policy
gradient on the logged returns (fakes.ReturnsPGPolicy's postprocessing), and its config."""

from __future__ import annotations

import numpy as np

from algorithms.algorithm import Algorithm, AlgorithmConfig
from policy_service.data.sample_batch import SampleBatch
from tests import fakes


class LoggedReturnsPolicy(fakes.ReturnsPGPolicy):
    """ReturnsPGPolicy's postprocessing on logged rows, which hold no vf_preds; it needs
    new_obs (offline_columns: a file without it is refused when the run starts)."""

    offline_columns = (SampleBatch.NEXT_OBS,)
    config_class = AlgorithmConfig  # its saved state (the run's keys) loads back

    def postprocess_trajectory(self, batch, other_agent_batches=None, episode=None):
        batch = batch.copy(shallow=True)
        batch[SampleBatch.VF_PREDS] = np.zeros(batch.count, np.float32)
        return super().postprocess_trajectory(batch, other_agent_batches, episode)


class OfflinePG(Algorithm):
    """Policy gradient on the logged returns: the policy's postprocessing makes the
    advantages (postprocess_inputs)."""

    policy_class = LoggedReturnsPolicy


def offline_config(input, **extra) -> dict:
    return {
        "input": str(input),
        "train_batch_size": 100,
        "minibatch_size": 50,
        "seed": 0,
        "model": {"fcnet_hiddens": [8]},
        **extra,
    }

"""policy_service: TF2 RL policies on towers of devices, served and trained on Ray.

Names load on first use, so a process that only holds a PolicyActor handle
or a SampleBatch does not pay for importing TensorFlow.
"""

import importlib

_EXPORTS = {
    "SampleBatch": "policy_service.data.sample_batch",
    "concat_samples": "policy_service.data.sample_batch",
    "masked_mean": "policy_service.engine.reductions",
    "TFPolicy": "policy_service.policy.tf_policy",
    "LossExtras": "policy_service.engine.loss_output",
    "LossGroup": "policy_service.engine.loss_groups",
    "PolicyActor": "policy_service.distributed.policy_actor",
    "LearnerGroup": "policy_service.distributed.learner_group",
    "MultiAgentEnv": "policy_service.multi_agent.env",
    "MultiAgentBatch": "policy_service.multi_agent.batch",
    "PolicySpec": "policy_service.policy.policy_spec",
    "register_policy_mapping_fn": "policy_service.multi_agent.policies",
    "Callbacks": "policy_service.runs.callbacks",
    "Episode": "policy_service.runs.callbacks",
    "MetricsLogger": "policy_service.runs.metrics_logger",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'policy_service' has no attribute {name!r}")

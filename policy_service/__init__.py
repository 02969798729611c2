"""policy_service: TF2 RL policies on towers of devices, served and trained on Ray."""
from policy_service.reductions import masked_mean
from policy_service.sample_batch import SampleBatch, concat_samples
from policy_service.policy import TFPolicy

__all__ = ["masked_mean", "SampleBatch", "concat_samples", "TFPolicy", "PolicyActor"]


def __getattr__(name):
    # The Ray service imports Ray; load it only when asked for.
    if name == "PolicyActor":
        from policy_service.service import PolicyActor
        return PolicyActor
    raise AttributeError(f"module 'policy_service' has no attribute {name!r}")

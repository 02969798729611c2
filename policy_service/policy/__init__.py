"""The policy: TFPolicy and what it is built from (models, distributions, exploration,
action masks, the policy spec), above the engine and the data.

TFPolicy loads on first use, so importing a piece (a spec, a distribution) does not
build the whole policy module.
"""

import importlib


def __getattr__(name):
    if name == "TFPolicy":
        return importlib.import_module("policy_service.policy.tf_policy").TFPolicy
    raise AttributeError(f"module 'policy_service.policy' has no attribute {name!r}")

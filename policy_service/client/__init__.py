"""The client side: PolicyClient, its HTTP connection, and a policy exported to run
without the library.

PolicyClient loads on first use, so `policy_service.client.PolicyClient` (the public
name) costs nothing until it is asked for.
"""

import importlib


def __getattr__(name):
    if name == "PolicyClient":
        return importlib.import_module("policy_service.client.policy_client").PolicyClient
    raise AttributeError(f"module 'policy_service.client' has no attribute {name!r}")

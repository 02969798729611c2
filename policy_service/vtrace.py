"""Moved to policy_service.returns.vtrace: this public import path names that same module."""

import sys

from policy_service.returns import vtrace

sys.modules[__name__] = vtrace

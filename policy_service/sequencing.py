"""Moved to policy_service.data.sequencing: this public import path names that same module."""

import sys

from policy_service.data import sequencing

sys.modules[__name__] = sequencing

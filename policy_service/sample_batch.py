"""Moved to policy_service.data.sample_batch: this public import path names that same module."""

import sys

from policy_service.data import sample_batch

sys.modules[__name__] = sample_batch

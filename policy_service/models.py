"""Moved to policy_service.policy.models: this public import path names that same module."""

import sys

from policy_service.policy import models

sys.modules[__name__] = models

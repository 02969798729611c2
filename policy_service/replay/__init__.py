"""Experience replay for off-policy algorithms (DQN family).

  ColumnStore              preallocated numpy columns written as a ring
  PriorityTree             sums and minima of priorities, batch update and search
  ReplayBuffer             uniform sampling
  PrioritizedReplayBuffer  proportional prioritized sampling, importance weights
"""
from policy_service.replay.column_store import ColumnStore
from policy_service.replay.prioritized import PRIO_WEIGHTS, PrioritizedReplayBuffer
from policy_service.replay.priority_tree import PriorityTree
from policy_service.replay.uniform import BATCH_INDEXES, ReplayBuffer

__all__ = ["BATCH_INDEXES", "PRIO_WEIGHTS", "ColumnStore", "PriorityTree",
           "PrioritizedReplayBuffer", "ReplayBuffer"]

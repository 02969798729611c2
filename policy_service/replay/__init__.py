"""Experience replay for off-policy algorithms (DQN family).

ColumnStore              preallocated numpy columns written as a ring
FramePool                distinct frames stored once, reference counted
FrameStackStore          obs/new_obs as frame ids into a FramePool, the rest columns
PriorityTree             sums and minima of priorities, batch update and search
ReplayBuffer             uniform sampling
PrioritizedReplayBuffer  proportional prioritized sampling, importance weights
"""

from policy_service.replay.column_store import ColumnStore
from policy_service.replay.frame_pool import FramePool
from policy_service.replay.frame_stack_store import FrameStackStore
from policy_service.replay.prioritized import PRIO_WEIGHTS, PrioritizedReplayBuffer
from policy_service.replay.priority_tree import PriorityTree
from policy_service.replay.uniform import BATCH_INDEXES, ReplayBuffer

__all__ = [
    "BATCH_INDEXES",
    "PRIO_WEIGHTS",
    "ColumnStore",
    "FramePool",
    "FrameStackStore",
    "PriorityTree",
    "PrioritizedReplayBuffer",
    "ReplayBuffer",
]

"""drainpipe: a partitioned, self-balancing batch queue for Python, and a metrics pipeline that runs on it.

The public API (fixed by API.md) is re-exported here; modules starting with ``_`` are internal.
"""
from ._balancer import DrainBalancer
from ._config import BatchQueueConfig
from ._manager import BatchQueueManager
from ._policies import PartitionPolicy, ThreadPolicy
from ._queue import BatchQueue
from ._routing import BufferStrategy, PartitionSelector
from ._stats import BatchQueueStats, PartitionUsage, RebalanceResult

__all__ = [
    "BatchQueue",
    "BatchQueueConfig",
    "BatchQueueManager",
    "BatchQueueStats",
    "BufferStrategy",
    "DrainBalancer",
    "PartitionPolicy",
    "PartitionSelector",
    "PartitionUsage",
    "RebalanceResult",
    "ThreadPolicy",
]
__version__ = "0.1.0"

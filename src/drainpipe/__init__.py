"""drainpipe: a partitioned, self-balancing batch queue for Python, and a metrics pipeline that runs on it.

The public API (docs/api.md) is re-exported here; modules starting with ``_`` are internal.
"""

from ._balancer import DrainBalancer
from ._config import BatchQueueConfig
from ._handlers import HandlerConsumer
from ._manager import BatchQueueManager
from ._policies import PartitionPolicy, ThreadPolicy
from ._protocols import Balancer, ErrorHandler, RebalanceListener
from ._queue import BatchQueue
from ._routing import BufferStrategy, PartitionSelector
from ._stats import BatchQueueStats, PartitionUsage, RebalanceResult

__all__ = [
    "Balancer",
    "BatchQueue",
    "BatchQueueConfig",
    "BatchQueueManager",
    "BatchQueueStats",
    "BufferStrategy",
    "DrainBalancer",
    "ErrorHandler",
    "HandlerConsumer",
    "PartitionPolicy",
    "PartitionSelector",
    "PartitionUsage",
    "RebalanceListener",
    "RebalanceResult",
    "ThreadPolicy",
]
__version__ = "0.1.0"

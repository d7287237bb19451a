"""drainpipe: a partitioned, self-balancing batch queue for Python, and a metrics pipeline that runs on it.

The public API (docs/api.md) is re-exported here; modules starting with ``_`` are internal.

The queue's names are imported on first use (PEP 562), not with the package: code that imports only the pipeline's
pure-Python parts (Spark executors, which get drainpipe shipped as a zip without the C extension) never loads the
queue or its C extension.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - for type checkers: the names as if imported eagerly
    from ._balancer import DrainBalancer
    from ._config import BatchQueueConfig
    from ._events import QueueEvent
    from ._handlers import HandlerConsumer
    from ._manager import BatchQueueManager
    from ._policies import PartitionPolicy, ThreadPolicy
    from ._protocols import Balancer, ErrorHandler, RebalanceListener
    from ._queue import BatchQueue
    from ._routing import BufferStrategy, PartitionSelector
    from ._stats import BatchQueueStats, PartitionUsage, RebalanceResult

#: public name -> the internal module that defines it
_EXPORTS = {
    "Balancer": "._protocols",
    "BatchQueue": "._queue",
    "BatchQueueConfig": "._config",
    "BatchQueueManager": "._manager",
    "BatchQueueStats": "._stats",
    "BufferStrategy": "._routing",
    "DrainBalancer": "._balancer",
    "ErrorHandler": "._protocols",
    "HandlerConsumer": "._handlers",
    "PartitionPolicy": "._policies",
    "PartitionSelector": "._routing",
    "PartitionUsage": "._stats",
    "QueueEvent": "._events",
    "RebalanceListener": "._protocols",
    "RebalanceResult": "._stats",
    "ThreadPolicy": "._policies",
}
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
    "QueueEvent",
    "RebalanceListener",
    "RebalanceResult",
    "ThreadPolicy",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'drainpipe' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))

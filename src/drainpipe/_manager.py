"""BatchQueueManager: the process-wide registry of named queues (and, through them, shared schedulers)."""

from __future__ import annotations

import threading

from ._config import BatchQueueConfig
from ._queue import BatchQueue
from ._scheduler import shared_schedulers
from .errors import QueueError


class BatchQueueManager:
    """Class-level registry. All methods are thread-safe; queue construction happens under the registry lock so
    two callers of ``get_or_create`` for one name always get the same queue."""

    _lock = threading.RLock()
    _queues: dict[str, BatchQueue] = {}

    @classmethod
    def create(cls, name: str, config: BatchQueueConfig) -> BatchQueue:
        """A new queue; RuntimeError if the name is taken (no new queue is started then)."""
        config.validate()
        with cls._lock:
            if name in cls._queues:
                raise QueueError(f"a queue named {name!r} already exists")
            q = cls._queues[name] = BatchQueue(name, config)
            return q

    @classmethod
    def get_or_create(cls, name: str, config: BatchQueueConfig) -> BatchQueue:
        """The existing queue of that name (``config`` ignored), or a new one."""
        with cls._lock:
            q = cls._queues.get(name)
            return q if q is not None else cls.create(name, config)

    create_if_absent = get_or_create  # the seed's name

    @classmethod
    def get(cls, name: str) -> BatchQueue | None:
        with cls._lock:
            return cls._queues.get(name)

    @classmethod
    def names(cls) -> list[str]:
        with cls._lock:
            return list(cls._queues)

    @classmethod
    def shutdown(cls, name: str) -> None:
        """Remove the queue from the registry, then shut it down (no-op for an unknown name)."""
        with cls._lock:
            q = cls._queues.pop(name, None)
        if q is not None:
            q.shutdown()

    @classmethod
    def shutdown_all(cls) -> None:
        """Shut down every queue, then every shared scheduler."""
        with cls._lock:
            queues = list(cls._queues.values())
            cls._queues.clear()
        for q in queues:
            q.shutdown()
        shared_schedulers.shutdown_all()

"""BatchQueueManager: the process-wide registry of named queues (and, through them, shared schedulers)."""

from __future__ import annotations

import threading
import warnings

from ._config import BatchQueueConfig
from ._queue import BatchQueue
from ._scheduler import shared_schedulers
from .errors import ConfigError, QueueError

#: the fields whose difference ``get_or_create`` warns about (what sizes a queue)
_SIZING_FIELDS = ("threads", "shared_scheduler", "partitions", "buffer_size", "strategy")


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
        """The existing queue of that name, or a new one made with ``config``.

        An existing queue keeps its own configuration. If ``config`` asks for other threads, partitions, buffer size
        or strategy, a :class:`RuntimeWarning` names the fields (the caller gets a queue unlike the one it
        described). If it asks for the other dispatch mode (a ``consumer`` for a queue with handlers, or handlers
        for a queue with a consumer), :class:`ConfigError` is raised: items would reach the wrong kind of consumer.
        """
        config.validate()
        with cls._lock:
            q = cls._queues.get(name)
            if q is None:
                return cls.create(name, config)
        mine, asked = q.config, config
        if (mine.consumer is None) != (asked.consumer is None):
            have, want = ("a consumer", "handlers") if mine.consumer is not None else ("handlers", "a consumer")
            raise ConfigError(f"queue {name!r} exists with {have}; it was asked for with {want}")
        differ = [f for f in _SIZING_FIELDS if getattr(mine, f) != getattr(asked, f)]
        if differ:
            warnings.warn(
                f"queue {name!r} exists with another {', '.join(differ)}: returning it as it is "
                f"({', '.join(f'{f}={getattr(mine, f)!r}' for f in differ)})",
                RuntimeWarning,
                stacklevel=2,
            )
        return q

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

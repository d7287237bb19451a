"""Kafka topics into the local engine: ``drainpipe consume``, a member of a consumer group, exactly once.

======================= ==========================================================================================
``config``              what ``consume`` is given (:class:`ConsumeConfig`) and the librdkafka consumer built from it
``member``              the group member: rebalance callbacks, fencing, rewinds; the books are the pipeline's driver's
``member_http``         a member's endpoints on ``--port``: the dashboard, ``/v1/stats``, ``/metrics``, ``/healthz``
``command``             the command, and the assembly of one member (store, engine, dead letter, consumer, member)
======================= ==========================================================================================

Messages are decoded by :mod:`drainpipe.inputs.messages`, which the Spark stream's tasks share. confluent-kafka
(``pip install 'drainpipe[kafka]'``) is imported only when a consumer is made or run, and the names here on first
use (PEP 562): the CLI registers ``consume`` without loading the member.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - for type checkers: the names as if imported eagerly
    from .command import add_consume_command, consume
    from .config import ConsumeConfig, kafka_consumer
    from .member import GroupMember

__all__ = ["ConsumeConfig", "GroupMember", "add_consume_command", "consume", "kafka_consumer"]

_HOMES = {
    "ConsumeConfig": "config",
    "kafka_consumer": "config",
    "add_consume_command": "command",
    "consume": "command",
    "GroupMember": "member",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{home}", __name__), name)

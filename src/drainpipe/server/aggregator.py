"""L1 aggregation of the server's event batches in a process of its own, off the server's GIL.

The server process is GIL-bound: two dozen request threads, the log, the engine's stages. Aggregating a batch
(:func:`~drainpipe.pipeline.aggregate.aggregate_batch`) is ~8 ms of CPU for 32k events, but it is some hundreds of
numpy and pyarrow calls, and every one of them over ~500 elements lets the GIL go and must win it back from the
request threads. Under load a batch took tens of times its CPU in wall time (with two busy threads beside it, 3.2 s
for 8 ms), the engine fell behind the log, and admission held requests back: OTLP traffic, which brings more rows
per request, spent ~7 ms of each request there. In a process of its own the batch costs the server one round trip
over a :class:`~.channel.Channel` (the batch in shared memory, the partials back pickled), and the aggregation
runs on the second core's spare time.

:class:`Aggregator` is used by one thread (the feeder). If its process dies (killed, out of memory) or takes longer
than ``timeout_s`` for a batch (stuck: a batch takes milliseconds), it is killed and replaced, and the batch is
aggregated in this process: a crash costs time, never a batch, and a stuck process does not stop the engine.
"""

from __future__ import annotations

from typing import Any

from ..errors import ChannelClosed
from ..inputs import EventBatch
from ..pipeline import Definitions, Partial, aggregate_batch
from .channel import HelperPool

__all__ = ["AGGREGATE_TIMEOUT_S", "Aggregator"]

#: longest wait for one batch's partials before the process counts as stuck (a 64k-row batch takes ~20 ms)
AGGREGATE_TIMEOUT_S = 60.0


def _aggregate(definitions: Definitions, message: bytes) -> tuple[Any, bytes]:
    """What the process does with a request: ``((definitions, request rows), the batch as an IPC message) ->
    (the partials, b"")``; an exception (a bug) is sent back and raised by the caller, as it would have been here."""
    try:
        return aggregate_batch(EventBatch.decode(message), definitions), b""
    except Exception as exc:
        return exc, b""


class Aggregator:
    """One aggregation process (see the module docstring), a :class:`~.channel.HelperPool` of one. Start it before
    the server runs other threads (it is forked then); :meth:`aggregate` from one thread; :meth:`close` once."""

    def __init__(self, timeout_s: float = AGGREGATE_TIMEOUT_S) -> None:
        from ..processes import mp_context

        # the timeout: a wait past it raises ChannelClosed, and the process counts as stuck
        self._pool = HelperPool(mp_context(), _aggregate, 1, name="drainpipe-aggregator", timeout_s=timeout_s)

    @property
    def pid(self) -> int | None:
        return self._pool.processes[0].pid

    @property
    def restarts(self) -> int:
        return self._pool.restarts

    def aggregate(self, batch: EventBatch, definitions: Definitions) -> list[Partial]:
        """As ``aggregate_batch(batch, definitions)``, computed in the process; blocks until done."""
        try:
            answer, _ = self._pool.call(definitions, batch.encode())
        except ChannelClosed:  # the process died or is stuck (it was replaced), or this aggregator was closed
            return aggregate_batch(batch, definitions)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def close(self) -> None:
        self._pool.close()

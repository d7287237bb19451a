"""L1 aggregation of the server's event batches in a process of its own, off the server's GIL.

The server process is GIL-bound: two dozen request threads, the log, the engine's stages. Aggregating a batch
(:func:`~drainpipe.pipeline.functions.aggregate_batch`) is ~8 ms of CPU for 32k events, but it is some hundreds of
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

import logging
import os
import pickle
import socket
from typing import Any

import pyarrow as pa

from ..inputs import EVENT_SCHEMA, REQUESTS_KEY, request_rows
from ..pipeline.definitions import Definitions
from ..pipeline.functions import Partial, aggregate_batch
from .channel import Channel, ChannelClosed

__all__ = ["AGGREGATE_TIMEOUT_S", "Aggregator"]

#: longest wait for one batch's partials before the process counts as stuck (a 64k-row batch takes ~20 ms)
AGGREGATE_TIMEOUT_S = 60.0

log = logging.getLogger("drainpipe.server")


def _aggregator_main(sock: socket.socket, parent: int) -> None:
    """The process: aggregate each batch that arrives (the payload: an IPC message; the header: pickled
    ``(definitions, request rows)``) and answer with the pickled partials, until told to stop (None) or the channel
    closes."""
    from ..pipeline.parallel import die_with

    die_with(parent)
    try:
        channel = Channel.accept(sock)
    except (ChannelClosed, OSError):
        return
    while True:
        try:
            header, payload = channel.recv()
        except ChannelClosed:
            return
        job = pickle.loads(header)
        if job is None:
            return
        definitions, requests = job
        batch = pa.ipc.read_record_batch(pa.py_buffer(payload), EVENT_SCHEMA)
        if requests < batch.num_rows:  # exit rows: the mark is schema metadata, not in the IPC message
            batch = batch.replace_schema_metadata({REQUESTS_KEY: str(requests).encode()})
        try:
            answer: Any = aggregate_batch(batch, definitions)
        except Exception as exc:  # a bug: the caller raises it as the in-process aggregation would have
            answer = exc
        try:
            channel.send(pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL))
        except ChannelClosed:
            return


class Aggregator:
    """One aggregation process (see the module docstring). Start it before the server runs other threads (it is
    forked then); :meth:`aggregate` from one thread; :meth:`close` once."""

    def __init__(self, timeout_s: float = AGGREGATE_TIMEOUT_S) -> None:
        from ..pipeline.parallel import mp_context

        self.timeout_s = timeout_s
        self._context = mp_context()
        self.restarts = 0
        self._closed = False
        self._start()

    def _start(self) -> None:
        self._channel, theirs = Channel.pair()
        self._process = self._context.Process(
            target=_aggregator_main, args=(theirs, os.getpid()), name="drainpipe-aggregator", daemon=True
        )
        self._process.start()
        theirs.close()
        self._channel.hand_over()
        self._channel.sock.settimeout(self.timeout_s)  # a wait past it raises ChannelClosed: the process is stuck

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def aggregate(self, batch: pa.RecordBatch, definitions: Definitions) -> list[Partial]:
        """As ``aggregate_batch(batch, definitions)`` (no source), computed in the process; blocks until done."""
        job = pickle.dumps((definitions, request_rows(batch)), protocol=pickle.HIGHEST_PROTOCOL)
        try:
            self._channel.send(job, memoryview(batch.serialize()), shrink=True)
            header, _ = self._channel.recv()
        except ChannelClosed:  # the process died (or this aggregator was closed meanwhile)
            if not self._closed:
                self._replace()
            return aggregate_batch(batch, definitions)
        answer = pickle.loads(header)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def _replace(self) -> None:
        self._channel.close()
        if self._process.is_alive():  # stuck, not dead
            log.error("aggregator process %d took more than %.0f s for a batch; killing it", self._process.pid,
                      self.timeout_s)  # fmt: skip
            self._process.kill()
        self._process.join(5)
        log.error("aggregator process %d died (exit %s); starting another", self._process.pid, self._process.exitcode)
        self.restarts += 1
        self._start()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._channel.send(pickle.dumps(None))
        except ChannelClosed:  # it died already
            pass
        self._channel.close()
        self._process.join(5)
        if self._process.is_alive():
            self._process.kill()

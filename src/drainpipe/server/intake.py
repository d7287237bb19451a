"""Posted bodies decoded and logged a group at a time, on one thread (:class:`GroupIntake`).

Each request thread used to decode its body itself (an OTLP export in a parser process, over a channel) and append
it to the log itself: per request a round trip to another process, a log record, a turn at the log's locks, and
every blocking call a hand-off of the GIL among two dozen threads. Under saturated OTLP load the server process
spent about 40% of its CPU switching threads (``perf``: futex waits and wake-ups, 32 context switches a request).
Here a request thread hands its work to the intake thread and waits once. The intake thread takes every request
waiting, decodes the group's OTLP protobuf bodies in one native pass (``decode_group``: the Python around the pass
once a group, not once a body), runs each other request's work (a JSON body arrives decoded by a parser process),
appends the group's events to the log (one record, or a few of at most :data:`RECORD_BYTES` each in one group
commit), and wakes them all once they are durable::

    request threads ── (a Body or work, a slot) ──► queue ──► intake thread: the bodies' one pass, each work
          ▲                                                             ─► join ─► log.append (fsync)
          │                                                                               │
          └──────────── slot: Decoded (accepted, rejects, warnings), or its own error ◄───┘

A request's work that raises, or a body decoded to a :class:`BadBody`, fails that request only. A log append that
raises fails every request of the group with that error: none of their events is in the log. The group is what
waited while the last one was being logged, so it grows with the load and a request waits at most one group's
decoding and one fsync more.

A caller that holds a group of its own runs it on its own thread instead (:meth:`serve_now`, the same decoding,
logging and answers): the connection loop, whose exports are read a turn of the loop at a time. Handing them to the
intake thread and taking the answers back cost two wake-ups a turn, and a hand-off of the GIL at each; the loop has
nothing else to do while its group is logged (the next requests wait in their sockets and make the next group).

Thread-safety: :meth:`submit` and :meth:`serve_now` from any thread; :meth:`close` once, after the last of them has
returned.
"""

from __future__ import annotations

import copy
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import LogFull
from ..inputs import EventBatch
from .bodies import Decoded, Rejects

__all__ = ["GROUP_BYTES", "RECORD_BYTES", "Body", "DecodeGroup", "GroupIntake", "Work", "records"]

log = logging.getLogger("drainpipe.server")

#: what a request hands the intake thread: a call that returns its valid events and its rejects, or raises
Work = Callable[[], tuple[EventBatch, Rejects]]


@dataclass(frozen=True)
class Body:
    """A request's body as sent, decoded on the intake thread with the other bodies of its group."""

    data: bytes
    gzipped: bool


#: the bodies of a group -> their events in batches, and per body its outcome or its error
DecodeGroup = Callable[[list[Body]], tuple[list[EventBatch], Sequence["Decoded | BaseException"]]]

#: bodies (bytes as posted) gathered into one group at most, unless a single body is larger
GROUP_BYTES = 16 << 20

#: a log record's events (Arrow bytes) at most where a group's batches are joined into one: far under the log's
#: largest record (1 GiB) and Arrow's 2 GiB of text in a column, which a few exports that repeat a long resource
#: value on every span can reach from a small group of bodies (a batch larger alone is a record alone)
RECORD_BYTES = 256 << 20


def records(batches: Sequence[EventBatch]) -> list[EventBatch]:
    """``batches`` (each at most a request's events) joined in order into as few log records as keep each within
    :data:`RECORD_BYTES`: one, unless the group is that large."""
    out: list[EventBatch] = []
    run: list[EventBatch] = []
    size = 0
    for batch in batches:
        n = batch.buffer_bytes
        if run and size + n > RECORD_BYTES:
            out.append(EventBatch.join(run))
            run, size = [], 0
        run.append(batch)
        size += n
    if run:
        out.append(EventBatch.join(run))
    return out


class _Slot:
    """One request's work and its outcome: a result, or an error and no result (the intake keeps that so)."""

    __slots__ = ("work", "size", "done", "result", "error", "then")

    def __init__(self, work: Work | Body, size: int, then: Callable[[_Slot], None] | None = None) -> None:
        self.work = work
        self.size = size
        # what a waiting submitter waits on; none for a slot answered by ``then`` (an Event is a lock and a
        # condition to build: a few microseconds of the connection loop's every request)
        self.done = threading.Event() if then is None else None
        self.result: Decoded | None = None
        self.error: BaseException | None = None
        self.then = then  # called instead of waking a waiter (serve_now)


def _answering(then: Callable[[Decoded | None, BaseException | None], None]) -> Callable[[_Slot], None]:
    return lambda slot: then(slot.result, slot.error)


class GroupIntake:
    """Runs requests' work and logs their events a group at a time (see the module docstring). ``append(batch)``
    writes one batch to the log and returns once it is durable, or raises (a refusal the requests get);
    ``decode_group`` decodes the :class:`Body` values of a group (the pass that a :class:`Body` submitted needs)."""

    def __init__(
        self,
        append: Callable[..., object],
        *,
        decode_group: DecodeGroup | None = None,
        name: str = "drainpipe-intake",
    ) -> None:
        self._append = append
        self._decode_group = decode_group
        self._queue: queue.SimpleQueue[_Slot | None] = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, work: Work | Body, size: int = 0) -> Decoded:
        """Decode ``work`` (a :class:`Body`) or run it, on the intake thread, and log its events; blocks until they
        are durable. Returns what the request's answer says; raises the request's own error (a bad body), or what
        the log append raised (nothing of it was logged), or :class:`LogFull` after :meth:`close`. ``size``: the
        body's bytes (the group's bound)."""
        if self._closed:
            raise LogFull("the log is closed")
        slot = _Slot(work, size)
        self._queue.put(slot)
        assert slot.done is not None
        slot.done.wait()
        if slot.error is not None:
            raise slot.error
        assert slot.result is not None
        return slot.result

    def serve_now(
        self, items: Sequence[tuple[Work | Body, int, Callable[[Decoded | None, BaseException | None], None]]]
    ) -> None:
        """Decode or run each ``(work, size, then)`` of ``items`` and log their events as one group, on the calling
        thread (beside the intake thread's groups: the log takes concurrent appends); returns once each
        ``then(result, error)`` was called: ``result`` once its events are durable, or ``error`` (its own, what the
        append raised, or :class:`LogFull` after :meth:`close`). What ``then`` raises is logged. For a caller that
        has a group of its own and nothing else to do meanwhile: the connection loop (no hand-off to the intake
        thread and back)."""
        group = [_Slot(work, size, _answering(then)) for work, size, then in items]
        if self._closed:
            for slot in group:
                slot.error = LogFull("the log is closed")
                self._finish(slot)
            return
        self._serve(group)

    def close(self) -> None:
        """Stop the intake thread once the work queued before has been served."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        closing = False
        while not closing and (first := self._queue.get()) is not None:
            group, size = [first], first.size
            while size < GROUP_BYTES:
                try:
                    slot = self._queue.get_nowait()
                except queue.Empty:
                    break
                if slot is None:  # closing: serve this group, then stop
                    closing = True
                    break
                group.append(slot)
                size += slot.size
            self._serve(group)
        while True:  # a submit that raced the close: refused, never left waiting
            try:
                late = self._queue.get_nowait()
            except queue.Empty:
                return
            if late is not None:
                late.error = LogFull("the log is closed")
                self._finish(late)

    def _serve(self, group: list[_Slot]) -> None:
        try:
            self._run_group(group)
        except BaseException as exc:  # a bug here: the group's requests fail with it, the thread serves on
            log.exception("the intake failed a group of %d requests", len(group))
            for slot in group:
                slot.result, slot.error = None, slot.error or exc
        for slot in group:
            self._finish(slot)

    def _run_group(self, group: list[_Slot]) -> None:
        batches: list[EventBatch] = []
        bodies = [slot for slot in group if isinstance(slot.work, Body)]
        if bodies:
            if self._decode_group is None:
                raise TypeError("a Body was submitted to an intake without decode_group")
            try:
                events, outcomes = self._decode_group([slot.work for slot in bodies])  # type: ignore[misc]
            except Exception as exc:  # a bug in the pass (or out of memory): the bodies' requests fail with it
                log.exception("decoding a group of %d bodies failed", len(bodies))
                outcomes = [exc if i == 0 else copy.copy(exc) for i in range(len(bodies))]
                events = None
            for slot, outcome in zip(bodies, outcomes, strict=True):
                if isinstance(outcome, BaseException):  # the request's own error (a bad body)
                    slot.error = outcome
                else:
                    slot.result = outcome
            if events is not None:
                batches += events
        for slot in group:
            if isinstance(slot.work, Body):
                continue
            try:
                batch, rejects = slot.work()
            except BaseException as exc:  # the request's own error (a bad body): that request fails, not the group
                slot.error = exc
                continue
            slot.result = Decoded.of(batch, rejects)
            batches.append(batch)
        batches = [b for b in batches if b.num_rows]
        if batches:
            try:
                self._append(*records(batches))
            except BaseException as exc:  # nothing of the group is in the log: each request gets the refusal
                ok = [slot for slot in group if slot.error is None]
                for i, slot in enumerate(ok):  # (a copy each: one instance raised in many threads shares a traceback)
                    slot.result, slot.error = None, exc if i == 0 else copy.copy(exc)

    @staticmethod
    def _finish(slot: _Slot) -> None:
        """Wake the request's thread, or answer it (``then``): exactly once per slot."""
        if slot.then is None:
            assert slot.done is not None
            slot.done.set()
            return
        try:
            slot.then(slot)
        except Exception:  # a bug in the caller's answer: that request's connection, not the intake thread
            log.exception("answering a request failed")

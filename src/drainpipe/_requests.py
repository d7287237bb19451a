"""The control requests of one queue: admitted from any thread, run on the control thread, answered by Futures.

::

    any thread ── submit(fn, *args, serial=T) ──► Future      (refused at once after stop())
                         │ ControlLoop.call
                         ▼
    control thread: in_turn ── serial T busy? ──► wait behind it (``_serial[T]``, in order)
                         │ free
                         ▼
                    start: withdrawn (cancelled)? skip │ stopped? QueueError │ fn(*args) ─► result, or a Future
                                                                                 of it (settles the answer later)

Requests with the same ``serial`` key (a handler type: ``add_handler``, ``remove_handler`` and the resizes of that
type) run one after another, each once the one before has settled; requests about different keys, or none, never
wait for each other. The control thread never blocks on a request: a request that waits (for a drain task to leave
its cycle) returns a Future and the next one starts.

Thread rule: :meth:`Requests.submit` and :meth:`Requests.stop` on any thread (``_stopped`` under ``_lock``);
everything else, and ``_serial``, the control thread only.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Any

from ._control_loop import ControlLoop
from .errors import QueueError

Op = tuple[Callable[..., Any], tuple[Any, ...], "Future[Any]"]


class Requests:
    """The request queue of one queue's control work (see the module docstring). ``last`` is the request that stops
    the queue (its shutdown): it still runs when queued before :meth:`stop`, which it calls itself."""

    def __init__(self, name: str, loop: ControlLoop, last: Callable[..., Any]) -> None:
        self._name = name
        self._loop = loop
        self._last = last
        self._lock = threading.Lock()
        self._stopped = False
        self._serial: dict[Hashable, deque[Op]] = {}  # requests waiting behind a running one with the same key

    @property
    def stopped(self) -> bool:
        return self._stopped

    def stop(self) -> None:
        """Refuse every request submitted from now on, and every one queued that has not started (any thread)."""
        with self._lock:
            self._stopped = True

    def submit(self, fn: Callable[..., Any], *args: Any, serial: Hashable | None = None) -> Future[Any]:
        """Queue ``fn(*args)`` for the control thread (any thread, never blocks). ``fn`` returns its result, or a
        Future of it (when it has to wait for drain tasks). Requests with the same ``serial`` key run one after
        another. The Future fails with QueueError once the queue is stopped; cancelling it before it starts
        withdraws it."""
        fut: Future[Any] = Future()
        with self._lock:
            if self._stopped:
                fut.set_exception(QueueError(f"queue {self._name!r} is shut down"))
                return fut
        self._loop.call(lambda: self.in_turn((fn, args, fut), serial))
        return fut

    def in_turn(self, op: Op, serial: Hashable | None) -> None:
        """Start ``op`` now, or after the requests with the same ``serial`` key already admitted (control thread)."""
        if serial is None:
            self._start(op)
            return
        waiting = self._serial.get(serial)
        if waiting is not None:  # one about this key is running: this one runs after it
            waiting.append(op)
            return
        self._serial[serial] = deque()
        op[2].add_done_callback(lambda _: self._loop.call(lambda: self._next(serial)))
        self._start(op)

    def _next(self, serial: Hashable) -> None:
        waiting = self._serial.get(serial)
        if not waiting:
            self._serial.pop(serial, None)
            return
        op = waiting.popleft()
        op[2].add_done_callback(lambda _: self._loop.call(lambda: self._next(serial)))
        self._start(op)

    def _start(self, op: Op) -> None:
        fn, args, fut = op
        if not fut.set_running_or_notify_cancel():
            return  # withdrawn by a caller's timeout
        if self._stopped and fn != self._last:
            fut.set_exception(QueueError(f"queue {self._name!r} is shut down"))
            return
        try:
            out = fn(*args)
        except BaseException as exc:
            fut.set_exception(exc)
            return
        if isinstance(out, Future):
            out.add_done_callback(lambda f: copy_outcome(f, fut))
        else:
            fut.set_result(out)


def then(source: Future[Any], fn: Callable[[Any], Any]) -> Future[Any]:
    """A Future of ``fn(source's result)``, settled where ``source`` is (on the control thread). A ``fn`` that
    returns a Future in turn settles the answer when that one is; an exception of ``source`` or ``fn`` fails it."""
    out: Future[Any] = Future()

    def settle(f: Future[Any]) -> None:
        try:
            result = fn(f.result())
        except BaseException as exc:
            out.set_exception(exc)
            return
        if isinstance(result, Future):  # a step that waits in turn: settled when it is
            result.add_done_callback(lambda r: copy_outcome(r, out))
        else:
            out.set_result(result)

    source.add_done_callback(settle)
    return out


def copy_outcome(source: Future[Any], target: Future[Any]) -> None:
    """Settle ``target`` as ``source`` (done) was settled: its exception or its result."""
    exc = source.exception()
    if exc is not None:
        target.set_exception(exc)
    else:
        target.set_result(source.result())

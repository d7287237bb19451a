"""Shared helpers for the queue runtime tests (imported as a plain module: tests/queue is on sys.path)."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from drainpipe import BatchQueue, BatchQueueConfig, BatchQueueManager, ThreadPolicy


class Item:
    """A test item: ``id`` is unique per test, ``src``/``seq`` identify producer and produce order."""

    __slots__ = ("id", "src", "seq", "flag")

    def __init__(self, id: Any, src: int = 0, seq: int = 0, flag: Any = None) -> None:
        self.id = id
        self.src = src
        self.seq = seq
        self.flag = flag

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.id!r})"


class A(Item):
    __slots__ = ()


class B(Item):
    __slots__ = ()


class C(Item):
    __slots__ = ()


class D(Item):
    __slots__ = ()


class SubA(A):
    __slots__ = ()


class Blocker(Item):
    __slots__ = ()


def make_types(n: int, prefix: str = "T") -> list[type]:
    """``n`` distinct item types (distinct qualnames, so distinct stable type hashes)."""
    return [type(f"{prefix}{i}", (Item,), {"__slots__": ()}) for i in range(n)]


def config(**kw: Any) -> BatchQueueConfig:
    """A config with one dedicated thread unless told otherwise."""
    if "threads" not in kw and "shared_scheduler" not in kw:
        kw["threads"] = ThreadPolicy.fixed(1)
    return BatchQueueConfig(**kw)


def new_queue(name: str, **kw: Any) -> BatchQueue:
    """A queue registered with the manager (the autouse fixture shuts it down after the test)."""
    return BatchQueueManager.create(name, config(**kw))


def pool_threads(prefix: str) -> list[threading.Thread]:
    """Live scheduler threads named ``drainpipe-<prefix>-<n>``."""
    pat = re.compile(rf"^drainpipe-{re.escape(prefix)}-\d+$")
    return [t for t in threading.enumerate() if pat.match(t.name)]


def queue_threads(name: str) -> list[threading.Thread]:
    """Every live thread of a dedicated-scheduler queue (pool threads and its control thread)."""
    pat = re.compile(rf"^drainpipe-{re.escape(name)}-(\d+|control)$")
    return [t for t in threading.enumerate() if pat.match(t.name)]


GATES: list[threading.Event] = []


def make_gate() -> threading.Event:
    """An Event the autouse fixture sets after every test, so a failing test never leaves a handler blocked."""
    gate = threading.Event()
    GATES.append(gate)
    return gate


def release_all_gates() -> None:
    while GATES:
        GATES.pop().set()


class Recorder:
    """A handler (consume + on_idle) that records everything and detects concurrent entry.

    Overlap detection uses a non-blocking ``Lock.acquire``: if the lock is already held the call overlaps another
    call of the same handler; it is counted in ``overlaps`` and the call raises.
    ``gate``: when set to an Event, each consume whose batch satisfies ``block_if`` waits for it (test control).
    """

    def __init__(
        self,
        name: str = "",
        *,
        expect_type: type | None = None,
        delay: float = 0.0,
        fail_if: Callable[[list], bool] | None = None,
    ) -> None:
        self.name = name
        self.expect_type = expect_type
        self.delay = delay
        self.fail_if = fail_if
        self._busy = threading.Lock()
        self._cond = threading.Condition()
        self.items: list = []
        self.batches: list[list] = []
        self.threads: list[str] = []
        self.idle_calls = 0
        self.idle_times: list[float] = []
        self.idle_threads: list[str] = []
        self.overlaps = 0
        self.wrong_type = 0
        self.active = False
        self.entered = threading.Event()
        self.entered_thread: str | None = None
        self.gate: threading.Event | None = None
        self.block_if: Callable[[list], bool] = lambda batch: True

    def _enter(self) -> None:
        if not self._busy.acquire(blocking=False):
            with self._cond:
                self.overlaps += 1
            raise AssertionError(f"handler {self.name} entered concurrently")
        self.active = True

    def _exit(self) -> None:
        self.active = False
        self._busy.release()

    def consume(self, batch: list) -> None:
        self._enter()
        try:
            if not self.entered.is_set():
                self.entered_thread = threading.current_thread().name
            self.entered.set()
            gate = self.gate
            if gate is not None and self.block_if(batch):
                gate.wait(10)
            if self.delay:
                time.sleep(self.delay)
            with self._cond:
                if self.expect_type is not None:
                    self.wrong_type += sum(1 for x in batch if type(x) is not self.expect_type)
                self.batches.append(list(batch))
                self.items.extend(batch)
                self.threads.append(threading.current_thread().name)
                self._cond.notify_all()
            if self.fail_if is not None and self.fail_if(batch):
                raise ValueError(f"{self.name} failed on purpose")
        finally:
            self._exit()

    def on_idle(self) -> None:
        self._enter()
        try:
            with self._cond:
                self.idle_calls += 1
                self.idle_times.append(time.monotonic())
                self.idle_threads.append(threading.current_thread().name)
                self._cond.notify_all()
        finally:
            self._exit()

    def wait_items(self, n: int, timeout: float = 5.0) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: len(self.items) >= n, timeout)

    def wait_idle(self, n: int, timeout: float = 5.0) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.idle_calls >= n, timeout)

    @property
    def ids(self) -> list:
        with self._cond:
            return [x.id for x in self.items]


def first_call_blocks(rec):
    """Make ``rec`` block on its first consume until ``rec.gate`` is set; returns the gate."""
    rec.gate = make_gate()
    first = [True]

    def block_if(batch):
        if first[0]:
            first[0] = False
            return True
        return False

    rec.block_if = block_if
    return rec.gate


@contextmanager
def in_background(loop: Callable[[threading.Event], None]) -> Iterator[None]:
    """Run ``loop(stop)`` on a thread for the duration of the block (a producer, say); at its end ``stop`` is set
    and the thread joined."""
    stop = threading.Event()
    thread = threading.Thread(target=loop, args=(stop,), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()

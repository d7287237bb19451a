"""Control calls take ``timeout=``: a stuck handler makes the calls that must wait for it raise TimeoutError instead
of hanging, and the queue stays consistent (a change not started yet is withdrawn; one started completes)."""

from __future__ import annotations

import time

import pytest
from queue_testlib import A, B, C, Recorder, first_call_blocks, new_queue

from drainpipe import ThreadPolicy
from testlib import wait_until


def test_timeouts_on_control_calls_while_a_handler_is_stuck(qname: str) -> None:
    q = new_queue(qname, threads=ThreadPolicy.fixed(2))
    stuck, rb, rc = Recorder("a"), Recorder("b"), Recorder("c")
    gate = first_call_blocks(stuck)
    q.add_handler(A, stuck)
    q.add_handler(B, rb)
    q.produce(A(1))
    assert stuck.entered.wait(2)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="still running"):  # removal waits for the stuck call (fence)
        q.remove_handler(A, timeout=0.2)
    with pytest.raises(TimeoutError, match="withdrawn, nothing changed"):  # queued behind the removal of A
        q.add_handler(A, rc, timeout=0.1)
    assert time.monotonic() - t0 < 2
    gate.set()  # the stuck call ends: the removal completes; the withdrawn add never happened
    assert wait_until(lambda: A not in q.handler_types(), 2)
    assert not q.remove_handler(A, timeout=2)
    q.add_handler(C, rc, timeout=2)  # and the queue works on
    q.produce(B(2))
    q.produce(C(3))
    assert rb.wait_items(1) and rc.wait_items(1)
    assert stuck.overlaps == rb.overlaps == rc.overlaps == 0

from __future__ import annotations

import itertools
import re

import pytest
from queue_testlib import release_all_gates

from drainpipe import BatchQueueManager

_seq = itertools.count()


@pytest.fixture(autouse=True)
def _shutdown_all_queues():
    """Every queue the test registered with the manager (and every shared scheduler) is shut down afterwards."""
    yield
    release_all_gates()
    BatchQueueManager.shutdown_all()


@pytest.fixture
def qname(request) -> str:
    """A queue name unique to this test (also usable as a thread-name prefix)."""
    base = re.sub(r"[^A-Za-z0-9]+", "_", request.node.name)[:40]
    return f"tq{next(_seq)}_{base}"

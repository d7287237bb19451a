"""drainpipe's one "now" (pipeline/clock.py): the grammar, a setting for this process and the processes it starts,
the store's default clock, and one-line errors."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from drainpipe.errors import DefinitionError
from drainpipe.pipeline import open_store
from drainpipe.pipeline.clock import CLOCK_ENV, clock_setting, now_ms, parse_clock, using_clock

DAY = 86_400_000
INSTANT = 1_795_255_200_000  # 2026-11-21T10:00:00Z


def test_the_grammar() -> None:
    assert parse_clock("") == (0, None, "")
    assert parse_clock("+365d")[:2] == (365 * DAY, None) and parse_clock("-12h")[:2] == (-12 * 3_600_000, None)
    assert parse_clock("2026-11-21T10:00:00Z")[:2] == (None, INSTANT)
    assert parse_clock(str(INSTANT))[:2] == (None, INSTANT)
    for bad in ("+forever", "+3x", "-", "tomorrow", "2026-13-01"):
        with pytest.raises(DefinitionError) as info:
            parse_clock(bad)
        assert CLOCK_ENV in str(info.value) and "\n" not in str(info.value), bad


def test_a_setting_holds_here_and_in_the_processes_started_under_it() -> None:
    before = clock_setting()
    with using_clock("2026-11-21T10:00:00Z"):
        assert now_ms() == INSTANT and os.environ[CLOCK_ENV] == "2026-11-21T10:00:00Z"
        store = open_store("duckdb:///:memory:")
        try:
            assert store.clock() == INSTANT  # the store's default clock is drainpipe's
        finally:
            store.close()
        child = subprocess.run([sys.executable, "-c", "from drainpipe.pipeline import now_ms; print(now_ms())"],
                               capture_output=True, text=True, check=True)  # fmt: skip
        assert int(child.stdout) == INSTANT
    assert clock_setting() == before  # restored, for this process and its children
    with using_clock("+365d"):
        shifted = now_ms() - int(time.time() * 1000)
        assert abs(shifted - 365 * DAY) < 60_000
    child = subprocess.run([sys.executable, "-c", "import drainpipe.pipeline.clock"], capture_output=True, text=True,
                           env={**os.environ, CLOCK_ENV: "next week"})  # fmt: skip
    assert child.returncode != 0 and "DRAINPIPE_CLOCK='next week'" in child.stderr  # never the wall clock instead

"""drainpipe.native, the native tiers in one place: which are built, turning them off for a block (and the processes
started in it), and every optional tier's Python path giving what its C extension gives, from the files of every
text format to the aggregated states."""

from __future__ import annotations

import os
import subprocess
import sys
import zlib
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from drainpipe import native
from drainpipe.errors import UsageError
from drainpipe.inputs import ReadStats, RejectList, Sink, plan_parts, read_part
from drainpipe.inputs.options import InputOptions
from drainpipe.pipeline.aggregate import aggregate_batch
from drainpipe.pipeline.definitions import default_definitions
from drainpipe.pipeline.generator import generate_events, write_events
from telemetry_files import access_log, otlp_file
from testlib import T0

#: the tiers a caller may turn off (all but the queue core's)
OPTIONAL = [t.name for t in native.tiers() if not t.required]


def test_every_tier_is_built_and_on_here() -> None:
    """The test venv builds every extension (setup.py): a tier missing here is a build that lost it."""
    assert native.available() == set(native.TIERS)
    assert all(t.built and t.enabled for t in native.tiers())
    assert [t.name for t in native.tiers() if t.required] == ["fastpath"]
    assert all(name in native.report() for name in native.TIERS)


def test_disabled_turns_tiers_off_for_its_block_and_the_processes_started_in_it() -> None:
    assert native.jsonscan is not None and native.ENV not in os.environ
    with native.disabled("jsonscan", "columnar"):
        assert native.jsonscan is None and not native.enabled("jsonscan") and not native.enabled("columnar")
        with native.disabled("lines", "jsonscan"):
            assert native.lines is None and native.jsonscan is None
        assert native.lines is not None and native.jsonscan is None  # the outer block's tiers stay off
        child = subprocess.run(
            [sys.executable, "-c", "from drainpipe import native; print(*(t.name for t in native.tiers() if not t.enabled))"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert child.stdout.split() == ["jsonscan", "columnar"]
    assert native.jsonscan is not None and native.enabled("columnar") and native.ENV not in os.environ


def test_an_unknown_tier_and_the_required_one_are_refused() -> None:
    with pytest.raises(UsageError, match="unknown native tier jsonscn"):
        with native.disabled("jsonscn"):
            pass
    with pytest.raises(UsageError, match="cannot be turned off"):
        native.disable("fastpath")
    with pytest.raises(UsageError, match="unknown native tier colunmar"):
        native.enabled("colunmar")
    assert native.enabled("fastpath") and native.enabled("jsonscan") and native.ENV not in os.environ
    child = subprocess.run([sys.executable, "-m", "drainpipe.native"], env={**os.environ, native.ENV: "nope"},
                           capture_output=True, text=True)  # fmt: skip
    assert child.returncode != 0 and "unknown native tier nope" in child.stderr


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Path, InputOptions]]:
    """A small file of every text format (and Parquet), malformed lines included, with the options it is read with."""
    tmp = tmp_path_factory.mktemp("tiers")
    out = []
    for suffix in ("jsonl", "csv", "parquet"):
        write_events(generate_events(3000, batch_rows=1000), tmp / f"events.{suffix}")
        out.append((tmp / f"events.{suffix}", InputOptions()))
    access_log(tmp / "access.log", "nginx", 2000, seed=3, base_ms=T0)
    out.append((tmp / "access.log", InputOptions(service="shop")))
    otlp_file(tmp / "spans.otlp.jsonl", seed=4, base_ms=T0)
    out.append((tmp / "spans.otlp.jsonl", InputOptions()))
    return out


def _read_and_aggregate(files: list[tuple[Path, InputOptions]]) -> list:
    """Per file, per planned part: its rows, rejects and counts, and each block's aggregated states."""
    definitions = default_definitions()
    out = []
    for path, options in files:
        for part in plan_parts(str(path), 700, workers=2, options=options):
            rejects, stats = RejectList(), ReadStats()
            blocks = list(read_part(part, Sink(str(path), stats, rejects)))
            rows = pa.Table.from_batches([b.rows for b in blocks]).to_pylist() if blocks else []
            states = [p.table.to_pylist() for b in blocks for p in aggregate_batch(b, definitions)]
            out.append((path.name, rows, rejects.rows, stats, states))
    return out


@pytest.fixture(scope="module")
def all_on(files: list[tuple[Path, InputOptions]]) -> list:
    return _read_and_aggregate(files)


@pytest.mark.parametrize("tier", OPTIONAL)
def test_each_tier_off_gives_the_same_events_and_states(files: list[tuple[Path, InputOptions]], all_on: list,
                                                        tier: str) -> None:  # fmt: skip
    """Every optional tier's Python path (``native.disabled``) against all tiers on: the same rows, rejects,
    counts and states for every format, planned into parts as the workers read them."""
    want = all_on
    assert {name for name, rows, *_ in want if rows} == {path.name for path, _ in files}
    assert {name for name, _, rejects, *_ in want if rejects} >= {"access.log", "spans.otlp.jsonl"}
    with native.disabled(tier):
        got = _read_and_aggregate(files)
    assert len(got) == len(want)
    for have, expected in zip(got, want):
        assert have == expected, (tier, have[0])


@given(st.integers(0, 3000), st.randoms(use_true_random=False), st.integers(0, 2**32 - 1), st.integers(0, 15))
def test_the_crc32_tier_is_zlibs_crc(n: int, rng, value: int, skip: int) -> None:
    """The log's CRC by carry-less multiplication gives zlib.crc32's value for every length (its folds of 64 bytes,
    its blocks of 16, its tail of bytes), from any start (unaligned views too)."""
    assert native.crc32 is not None
    view = memoryview(rng.randbytes(n + skip))[skip:]
    assert native.crc32.crc32(view, value) == zlib.crc32(view, value)
    assert native.crc32.crc32(view) == zlib.crc32(view)

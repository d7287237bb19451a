"""Worker-process reading (drainpipe.pipeline.parallel): the same blocks, rejects, sources and results as the
in-process reader, whatever the task cut (row groups not a multiple of the block size, tasks cutting row
groups, JSON Lines with blank lines, BOM, CRLF, bad lines and no final newline; CSV; OTLP JSON lines)."""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drainpipe import native
from drainpipe.inputs import EVENT_SCHEMA, ReadStats, Sink, plan_parts, read_part, whole_file
from drainpipe.inputs.formats import base, parquet_format
from drainpipe.pipeline import parallel
from drainpipe.pipeline.aggregate import aggregate_batch
from drainpipe.pipeline.definitions import default_definitions
from drainpipe.pipeline.generator import generate_events
from drainpipe.pipeline.partials import merge
from drainpipe.pipeline.run import run_local
from drainpipe.pipeline.store import open_store

DEFS = default_definitions()


class Rejects:
    def __init__(self):
        self.rows = []

    def write(self, source, line, raw, reason):
        self.rows.append((line, json.loads(json.dumps(raw, default=str)), reason))


def events(n, seed=5):
    return pa.Table.from_batches(
        list(generate_events(n, services=6, endpoints_per_service=4, duration_s=600, seed=seed))
    )


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("parallel")
    table = events(9_000)
    rows = table.to_pylist()
    # Parquet: odd row groups, a few invalid rows (string ts column so values can be bad)
    bad = {17: {"latency_ms": -1.0}, 4_000: {"service": ""}, 8_999: {"latency_ms": float("nan")}}
    for i, change in bad.items():
        rows[i] = {**rows[i], **change}
    parquet = d / "events.parquet"
    pq.write_table(
        pa.Table.from_pylist(rows, schema=EVENT_SCHEMA.remove(6).append(pa.field("db_statement", pa.string()))).cast(
            pa.schema([f.with_nullable(True) for f in EVENT_SCHEMA])
        ),
        parquet,
        row_group_size=2_345,
    )
    # JSON Lines: BOM, CRLF lines, blank lines, bad lines, no final newline
    lines = [json.dumps({k: v for k, v in r.items() if v is not None}) for r in table.to_pylist()]
    for i, text in (
        (5, ""),
        (6, "   "),
        (700, "not json"),
        (701, '{"ts": 1, "service": "x"}'),
        (2_000, '{"ts": "2026-11-21T10:00:00Z", "service": "iso", "latency_ms": 3}'),
        (3_000, '{"service": "a", "latency_ms": NaN}'),
    ):
        lines.insert(i, text)
    body = "".join(line + ("\r\n" if i % 3 == 0 else "\n") for i, line in enumerate(lines)).rstrip("\n")
    jsonl = d / "events.jsonl"
    jsonl.write_bytes(b"\xef\xbb\xbf" + body.encode())
    # CSV: BOM, a header, quoted fields with commas, escaped quotes and newlines, CRLF, blank and bad records
    records = []
    for i, r in enumerate(table.to_pylist()):
        endpoint = f'"GET /a,{i}\n""x"""' if i % 7 == 0 else (r["endpoint"] or "")
        records.append(f'{r["ts"]},{r["service"]},{r["instance"] or ""},{endpoint},{r["latency_ms"]},'
                       f'{str(r["status"]).lower()},')  # fmt: skip
    for i, text in ((5, ""), (6, "   "), (700, "1,2,3"), (2_000, "x,svc,,,1,true,"), (3_000, ',"a\nb",,,1,,')):
        records.insert(i, text)
    csv_text = "ts,service,instance,endpoint,latency_ms,status,db_statement\n" + "".join(
        r + ("\r\n" if i % 3 == 0 else "\n") for i, r in enumerate(records)
    )
    csv_path = d / "events.csv"
    csv_path.write_bytes(b"\xef\xbb\xbf" + csv_text.encode())
    # OTLP JSON: an export of 3 SERVER spans per line; blank, invalid and declined lines, a rejected span, CRLF
    exports = []
    for i in range(0, len(rows), 3):
        spans = [{"traceId": f"{j + 1:032x}", "spanId": f"{j + 1:016x}", "name": r["endpoint"] or "op", "kind": 2,
                  "startTimeUnixNano": str(int((r["ts"] - r["latency_ms"]) * 1_000_000)),
                  "endTimeUnixNano": str(r["ts"] * 1_000_000), "status": {"code": 1 if r["status"] else 2}}
                 for j, r in enumerate(rows[i : i + 3], i) if r["service"] and r["latency_ms"] >= 0]  # fmt: skip
        resource = {"attributes": [{"key": "service.name", "value": {"stringValue": rows[i]["service"] or "x"}}]}
        exports.append(json.dumps({"resourceSpans": [{"resource": resource, "scopeSpans": [{"spans": spans}]}]}))
    for i, text in ((5, ""), (6, "  "), (700, '{"resourceSpans": ['), (1_500, '{"resource_spans": []}'),
                    (2_000, '{"resourceSpans": [{"scopeSpans": [{"spans": [{"kind": 2}]}]}]}'),  # no ids: warned
                    (2_200, '{"resourceSpans": [{"scopeSpans": [{"spans": [{"kind": 2, "startTimeUnixNano": "9", '
                            '"endTimeUnixNano": "1"}]}]}]}'),  # ends before it starts: rejected
                    (2_500, '{"resourceSpans": [{"scopeSpans": [{"spans": [{"kind": 2, "name": 5}]}]}]}')):  # fmt: skip
        exports.insert(i, text)
    otlp = d / "events.otlp.jsonl"
    otlp.write_bytes("".join(e + ("\r\n" if i % 3 == 0 else "\n") for i, e in enumerate(exports)).encode())
    return {"parquet": parquet, "jsonl": jsonl, "csv": csv_path, "otlp": otlp}


def sequential(path, batch_rows):
    stats, dl = ReadStats(), Rejects()
    reader = read_part(whole_file(str(path), batch_rows), Sink(str(path), stats, dl))
    blocks = [(reader.index, b.rows) for b in reader]
    return blocks, stats, dl.rows


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "csv", "otlp"])
@pytest.mark.parametrize("batch_rows,task_blocks", [(1_000, 1), (1_000, 3), (4_096, 2), (50_000, 4)])
def test_tasks_read_the_same_blocks_rejects_and_sources(files, fmt, batch_rows, task_blocks, monkeypatch):
    monkeypatch.setattr(parquet_format, "PARQUET_PART_BLOCKS", task_blocks)
    monkeypatch.setattr(base, "LINE_PART_BLOCKS", task_blocks)
    path = str(files[fmt])
    want_blocks, want_stats, want_rejects = sequential(path, batch_rows)
    assert want_stats.rejected >= 3
    tasks = list(plan_parts(path, batch_rows))
    assert [t.first for t in tasks] == sorted(t.first for t in tasks)
    stats, rejects, partials = ReadStats(), [], []
    for task in tasks:
        result = parallel.process_part(task, None, DEFS)
        stats.merge(result.stats)
        rejects += [(line, json.loads(json.dumps(raw, default=str)), reason) for line, raw, reason in result.rejects]
        partials += result.partials
        assert result.events == result.stats.accepted
    assert (stats.read, stats.accepted, stats.rejected, stats.reasons) == (
        want_stats.read,
        want_stats.accepted,
        want_stats.rejected,
        want_stats.reasons,
    )
    assert rejects == want_rejects
    # the merged partials equal those of the in-process blocks, block for block
    assert [t.first for t in tasks][:1] == [0] and sum(
        r.blocks for r in [parallel.process_part(t, None, DEFS) for t in tasks]
    ) == len(want_blocks)
    want = [p for _, b in want_blocks for p in aggregate_batch(b, DEFS)]
    for definition in DEFS.all:
        got_p = merge([p for p in partials if p.definition == definition])
        want_p = merge([p for p in want if p.definition == definition])
        key = list(got_p.key_columns)
        assert (
            got_p.table.sort_by([(k, "ascending") for k in key])
            .select(key)
            .equals(want_p.table.sort_by([(k, "ascending") for k in key]).select(key))
        )


def test_a_task_cut_mid_row_group_reads_the_right_rows(files, monkeypatch):
    monkeypatch.setattr(parquet_format, "PARQUET_PART_BLOCKS", 1)
    path = str(files["parquet"])
    blocks, _, _ = sequential(path, 1_000)
    for task in plan_parts(path, 1_000):
        reader = read_part(task, Sink(path, ReadStats(), None))
        got = [(reader.index, b.rows) for b in reader]
        want = [(i, b) for i, b in blocks if task.first <= i < task.first + task.blocks]
        assert [(i, b.to_pylist()) for i, b in got] == [(i, b.to_pylist()) for i, b in want]


def query(db):
    s = open_store(f"duckdb:///{db}")
    try:
        return {r[:5]: r[5] for r in s.query()}, s.query_topn("top_slow_statements")
    finally:
        s.close()


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_run_with_workers_equals_run_in_process_and_reruns_change_nothing(files, fmt, tmp_path, monkeypatch):
    monkeypatch.setattr(parallel, "MIN_PARALLEL_BYTES", 0)
    monkeypatch.setattr(base, "LINE_PART_BLOCKS", 2)
    monkeypatch.setattr(parquet_format, "PARQUET_PART_BLOCKS", 2)
    pools, start_pool = [], parallel.start_pool
    monkeypatch.setattr(parallel, "start_pool", lambda *a: pools.append(a) or start_pool(*a))
    results = {}
    for workers in (0, 2):
        db = tmp_path / f"w{workers}.duckdb"
        dead = tmp_path / f"w{workers}.rejected.jsonl"
        summary = run_local(
            [str(files[fmt])],
            definitions=DEFS,
            store_url=f"duckdb:///{db}",
            dead_letter=str(dead),
            batch_rows=1_000,
            workers=workers,
        )
        assert summary.read == summary.accepted + summary.rejected and summary.rejected >= 3
        assert summary.dropped == 0 and summary.handler_errors == 0
        results[workers] = (summary, query(db), dead.read_text())
        again = run_local(
            [str(files[fmt])],
            definitions=DEFS,
            store_url=f"duckdb:///{db}",
            dead_letter=str(tmp_path / "again.jsonl"),
            batch_rows=1_000,
            workers=workers,
        )
        assert again.read == 0 and again.complete and query(db) == results[workers][1]
    assert len(pools) == 2  # workers=2: both runs started a pool (the rerun then read in process)
    (s0, (v0, t0), d0), (s2, (v2, t2), d2) = results[0], results[2]
    assert (s0.read, s0.accepted, s0.rejected, s0.reasons) == (s2.read, s2.accepted, s2.rejected, s2.reasons)
    assert d0 == d2
    assert v0.keys() == v2.keys() and t0 == t2
    for k, v in v0.items():
        assert math.isclose(v, v2[k], rel_tol=1e-12), k  # float sums may differ in the last ulp


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_into_a_new_store_the_workers_start_before_it_opens_and_a_store_that_has_the_file_cancels_them(
    files, fmt, tmp_path, monkeypatch
):
    """Into a new store, the first file's parts go to the workers before the store is opened (DuckDB's import and
    the schema then run beside them). Those parts assume that nothing of the file is applied; when the store has it
    after all (another process made the store meanwhile; here, an existing store is taken for a new one), they are
    cancelled, and nothing is counted twice."""
    from drainpipe.pipeline import run as run_module

    monkeypatch.setattr(parallel, "MIN_PARALLEL_BYTES", 0)
    monkeypatch.setattr(base, "LINE_PART_BLOCKS", 2)
    monkeypatch.setattr(parquet_format, "PARQUET_PART_BLOCKS", 2)
    streams: list[parallel.PartStream] = []

    class Recorded(parallel.PartStream):
        def __init__(self, *args, **kwargs):
            streams.append(self)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(parallel, "PartStream", Recorded)
    opened, open_store_ = [], run_module.open_store
    monkeypatch.setattr(run_module, "open_store", lambda url: opened.append(len(streams)) or open_store_(url))
    db = tmp_path / "s.duckdb"

    def run():
        return run_local([str(files[fmt])], definitions=DEFS, store_url=f"duckdb:///{db}",
                         dead_letter=str(tmp_path / "dl.jsonl"), batch_rows=1_000, workers=2)  # fmt: skip

    first = run()
    assert first.complete and first.read > 0 and opened == [1]  # the parts went out before the store opened
    stored = query(db)
    monkeypatch.setattr(run_module, "is_new_store", lambda url: True)
    again = run()
    assert opened == [1, 2]  # submitted early again, then found applied: cancelled
    assert again.read == 0 and again.unchanged_files == 1 and again.complete and query(db) == stored


def test_a_store_that_fails_to_open_after_the_early_start_is_reported_and_no_worker_outlives_the_run(
    files, tmp_path, monkeypatch
):
    import os

    from drainpipe.errors import StoreError
    from drainpipe.pipeline import run as run_module
    from procs import alive, children_of

    monkeypatch.setattr(parallel, "MIN_PARALLEL_BYTES", 0)
    started = []  # part streams submitted to the workers: the early start's, before the store is opened

    class Recorded(parallel.PartStream):
        def __init__(self, *args, **kwargs):
            started.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(parallel, "PartStream", Recorded)

    def refuse(url):
        raise StoreError("cannot open duckdb store: refused by the test")

    monkeypatch.setattr(run_module, "open_store", refuse)
    before = set(children_of(os.getpid()))  # (earlier tests' processes, e.g. Spark's JVM, are not this run's)
    with pytest.raises(StoreError, match="refused by the test"):
        run_local([str(files["parquet"])], definitions=DEFS, store_url=f"duckdb:///{tmp_path}/s.duckdb",
                  dead_letter=str(tmp_path / "dl.jsonl"), batch_rows=1_000, workers=2)  # fmt: skip
    assert started == [1] and not alive([p for p in children_of(os.getpid()) if p not in before])


def test_the_workers_go_before_the_last_big_files_final_store_write(files, tmp_path, monkeypatch):
    """The run's peak memory is its final store write: the worker processes, idle by then, are let go before it
    (they held ~200 MB of a 620 MB peak), but only after the last file that needs them."""
    import os
    import time

    from drainpipe.pipeline.store import SqlStore
    from procs import alive, children_of

    monkeypatch.setattr(parallel, "MIN_PARALLEL_BYTES", 0)
    inputs = [str(files["jsonl"]), str(files["parquet"])]  # both big; the run reads them in name order
    first, last = sorted(inputs)
    merge, seen = SqlStore.merge, []
    before = set(children_of(os.getpid()))  # (earlier tests' processes, e.g. Spark's JVM, are not this run's)

    def traced(self, *args, **kwargs):
        if kwargs.get("progress"):  # a checkpoint: which file is it of, and do workers still run?
            paths = {p.path for p in kwargs["progress"]}
            deadline = time.monotonic() + (5 if last in paths else 0)  # (told to go, they take a moment to exit)
            while (workers := alive([p for p in children_of(os.getpid()) if p not in before])) and (
                time.monotonic() < deadline
            ):
                time.sleep(0.01)
            seen.append((paths, bool(workers)))
        return merge(self, *args, **kwargs)

    monkeypatch.setattr(SqlStore, "merge", traced)
    summary = run_local(inputs, definitions=DEFS, store_url=f"duckdb:///{tmp_path}/s.duckdb",
                        dead_letter=str(tmp_path / "dl.jsonl"), workers=2)  # fmt: skip
    assert summary.complete
    assert seen[-1] == ({last}, False)  # gone before the last file's final write
    assert ({first}, True) in seen  # kept while a later file still needed them


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from([b"", b"x", b"{}", b"a" * 40]), max_size=30),
    st.booleans(),
    st.integers(1, 5),
    st.integers(1, 64),
    st.integers(0, 5),
)
def test_line_ranges_cut_complete_lines_and_hash_prefixes(tmp_path_factory, lines, final_newline, per_part, buf, pos):
    """The planner's scan (base.line_ranges) with buffers down to one byte, lines spanning buffers and a
    last line without a newline: ranges of ``per_part`` complete lines, contiguous, ending at the last newline,
    each with the SHA-256 of everything before its end, as a reference computed from the whole bytes; with the C
    newline finder and with numpy's (Spark executors)."""

    for off in ((), ("lines",)):
        with native.disabled(*off):
            _check_line_ranges(tmp_path_factory, lines, final_newline, per_part, buf, pos)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 300), st.integers(0, 300), st.integers(1, 12), st.integers(2, 90))
def test_the_newline_finder_equals_a_byte_by_byte_count(data, start, stop, n, sparse):
    """``nth_newline`` in C (64-byte masks) and in numpy: the offset after the n-th newline of data[start:stop], or
    how many it holds, as counted byte by byte (newlines placed anywhere around the 64-byte steps)."""
    data = bytes(10 if b % sparse == 0 else b if b != 10 else 11 for b in data)  # one in ``sparse`` a newline
    start, stop = min(start, len(data)), min(max(start, stop), len(data))
    at = [i + 1 for i in range(start, stop) if data[i] == 10]
    want = (at[n - 1], n) if len(at) >= n else (-1, len(at))
    assert native.lines is not None
    assert native.lines.nth(data, start, stop, n) == want
    assert native.lines.nth(bytearray(data), start, stop, n) == want
    with native.disabled("lines"):
        assert base.nth_newline(data, start, stop, n) == want


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from([b"", b"x", b"{}", b"a" * 40, b"b" * 70]), max_size=30),
    st.booleans(),
    st.booleans(),
    st.integers(1, 6),
    st.one_of(st.none(), st.integers(1, 120)),
    st.one_of(st.none(), st.integers(0, 400)),
    st.sampled_from([1, 7, 64, 8 << 20]),
)
def test_line_blocks_cut_as_a_line_by_line_reference(lines, final_newline, growable, count, max_bytes, limit, read):
    """base.line_blocks (the readers of line formats: blocks of ``count`` lines, ended early by the line that brings
    a block to ``max_bytes``, a last line without a newline its own line unless the file is growable), read in
    chunks down to one byte, against a model that takes the lines one by one; with the C newline finder and with
    numpy's (Spark executors)."""
    import io

    data = b"\n".join(lines) + (b"\n" if final_newline and lines else b"")
    seen = data if limit is None else data[:limit]
    whole = seen.split(b"\n")
    model_lines = [line + b"\n" for line in whole[:-1]] + ([whole[-1]] if whole[-1] and not growable else [])
    want, block = [], []
    for line in model_lines:
        block.append(line)
        if len(block) == count or (max_bytes is not None and sum(map(len, block)) >= max_bytes):
            want.append((b"".join(block), len(block)))
            block = []
    if block:
        want.append((b"".join(block), len(block)))
    for off in ((), ("lines",)):
        saved = base.READ_BYTES
        base.READ_BYTES = read
        try:
            with native.disabled(*off):
                assert list(base.line_blocks(io.BytesIO(data), growable, count, max_bytes, limit)) == want
        finally:
            base.READ_BYTES = saved


def test_the_newline_finder_at_every_offset_around_the_64_byte_steps():
    assert native.lines is not None
    nth = native.lines.nth
    for start in (0, 1, 63):
        for p in range(start, 200):
            for q in (p + 1, p + 63, p + 64, p + 65):  # a second newline, maybe in the next 64 bytes
                data = bytearray(b"x" * 200)
                data[p] = 10
                if q < 200:
                    data[q] = 10
                two = (q + 1, 2) if q < 200 else (-1, 1)
                assert nth(data, start, 200, 1) == (p + 1, 1), (start, p)
                assert nth(data, start, 200, 2) == two, (start, p, q)
                assert nth(data, start, 200, 3) == (-1, two[1]), (start, p, q)


def _check_line_ranges(tmp_path_factory, lines, final_newline, per_part, buf, pos) -> None:
    import hashlib

    data = b"\n".join(lines) + (b"\n" if final_newline and lines else b"")
    pos = min(pos, len(data))
    pos = data.rfind(b"\n", 0, pos) + 1  # a range starts at a line start
    path = tmp_path_factory.mktemp("ranges") / "f.jsonl"
    path.write_bytes(data)
    hasher = hashlib.sha256(data[:pos])
    with open(path, "rb") as f:
        old = base._SCAN_BYTES
        base._SCAN_BYTES = buf
        try:
            got = list(base.line_ranges(f, pos, len(data), per_part, hasher))
        finally:
            base._SCAN_BYTES = old
    ends = [i + 1 for i in range(pos, len(data)) if data[i] == 10]
    want, begin = [], pos
    for k in range(0, len(ends), per_part):
        end = ends[min(k + per_part, len(ends)) - 1]
        want.append((begin, end, min(per_part, len(ends) - k), hashlib.sha256(data[:end]).hexdigest()))
        begin = end
    assert got == want

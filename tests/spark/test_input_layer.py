"""One input layer for every engine: a file with bad lines gives the same parts, rejects (line numbers and order)
and file progress (identity, how far applied) in process, through the worker processes and in Spark; the same file
run through the local engine and then Spark into one store is counted once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from spark_testlib import BAD_JSON_LINES, SPARK, assert_same_results

from drainpipe.inputs import head_of, plan_parts
from drainpipe.pipeline import parallel
from drainpipe.pipeline.definitions import DEFAULT_DEFINITIONS
from drainpipe.pipeline.generator import generate_events, write_events
from drainpipe.pipeline.run import run_local
from drainpipe.pipeline.store import open_store
from drainpipe.spark import JobOptions, run_batch

pytestmark = SPARK
BLOCK = 1_000


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("inputs")
    parquet = d / "events.parquet"
    table = pa.Table.from_batches(list(generate_events(9_500, services=5, seed=3)))
    bad = np.zeros(table.num_rows, dtype=bool)
    bad[[5, 999, 1_000, 4_321, 9_499]] = True  # out of range: latency_ms, on and off block edges
    latency = pc.if_else(pa.array(bad), -1.0, table.column("latency_ms"))
    table = table.set_column(table.schema.get_field_index("latency_ms"), "latency_ms", latency)
    pq.write_table(table, parquet, row_group_size=2_500)  # row groups not a multiple of the block
    good = d / "good.jsonl"
    write_events(generate_events(9_500, services=5, seed=4), good)
    lines = good.read_bytes().splitlines(keepends=True)
    for i, bad in enumerate(BAD_JSON_LINES):  # bad lines in several blocks, and on block edges
        lines.insert(BLOCK * i + (BLOCK - 1 if i % 2 else 3), bad + b"\n")
    jsonl = d / "events.jsonl"
    jsonl.write_bytes(b"".join(lines))
    return {"jsonl": jsonl, "parquet": parquet}


def _progress(url: str, path: Path) -> set[tuple]:
    store = open_store(url)
    try:
        return {(r.part, r.name, r.end, r.lines, r.prefix) for r in store.progress("file", head=head_of(str(path)))}
    finally:
        store.close()


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_every_engine_reads_the_same_parts_rejects_and_sources(spark, files, fmt, tmp_path, monkeypatch) -> None:
    path = files[fmt]
    planned = list(plan_parts(str(path), BLOCK, workers=2))
    assert len(planned) > 1 and [p.first for p in planned] == sorted(p.first for p in planned)

    monkeypatch.setattr(parallel, "MIN_PARALLEL_BYTES", 0)
    runs = {}
    for engine in ("in-process", "workers", "spark"):
        url, dead = f"duckdb:///{tmp_path}/{engine}.duckdb", tmp_path / f"{engine}.rejected.jsonl"
        if engine == "spark":
            summary = run_batch(
                [str(path)], store_url=url, dead_letter=str(dead), spark=spark, options=JobOptions(batch_rows=BLOCK)
            )
            counts = (summary["read"], summary["accepted"], summary["rejected"])
        else:
            s = run_local(
                [str(path)],
                definitions=DEFAULT_DEFINITIONS,
                store_url=url,
                dead_letter=str(dead),
                batch_rows=BLOCK,
                workers=0 if engine == "in-process" else 2,
            )
            counts = (s.read, s.accepted, s.rejected)
        runs[engine] = (counts, dead.read_bytes(), _progress(url, path), url)
    base = runs["in-process"]
    assert base[0][2] == (5 if fmt == "parquet" else len(BAD_JSON_LINES))
    assert {name for _, name, *_ in base[2]} == set(DEFAULT_DEFINITIONS.names) and len(base[2]) == len(
        DEFAULT_DEFINITIONS.names
    )  # one row per definition, all at the file's end
    for engine in ("workers", "spark"):
        counts, dead, sources, url = runs[engine]
        assert counts == base[0], engine
        assert dead == base[1], engine  # same records, reasons, line numbers and order
        assert sources == base[2], engine  # same identity, same end, same prefix hash
        assert_same_results(base[3], url, DEFAULT_DEFINITIONS)


def test_local_then_spark_into_one_store_counts_the_file_once(spark, files, tmp_path) -> None:
    path = str(files["jsonl"])
    once = f"duckdb:///{tmp_path}/once.duckdb"
    run_local(
        [path], definitions=DEFAULT_DEFINITIONS, store_url=once, dead_letter=str(tmp_path / "a.jsonl"), batch_rows=BLOCK
    )
    both = f"duckdb:///{tmp_path}/both.duckdb"
    run_local(
        [path], definitions=DEFAULT_DEFINITIONS, store_url=both, dead_letter=str(tmp_path / "b.jsonl"), batch_rows=BLOCK
    )
    again = run_batch(
        [path], store_url=both, dead_letter=str(tmp_path / "c.jsonl"), spark=spark, options=JobOptions(batch_rows=BLOCK)
    )
    assert again["read"] == 0 and again["unchanged_files"] == 1
    assert_same_results(once, both, DEFAULT_DEFINITIONS)
    # and the other way round: Spark first, then the local engine skips every batch
    spark_first = f"duckdb:///{tmp_path}/spark-first.duckdb"
    run_batch(
        [path],
        store_url=spark_first,
        dead_letter=str(tmp_path / "d.jsonl"),
        spark=spark,
        options=JobOptions(batch_rows=BLOCK),
    )
    local = run_local(
        [path],
        definitions=DEFAULT_DEFINITIONS,
        store_url=spark_first,
        dead_letter=str(tmp_path / "e.jsonl"),
        batch_rows=BLOCK,
    )
    assert local.read == 0 and local.unchanged_files == 1 and local.complete
    assert_same_results(once, spark_first, DEFAULT_DEFINITIONS)


def test_a_file_that_grows_is_read_once_across_engines(spark, tmp_path) -> None:
    log = tmp_path / "app.jsonl"
    line = lambda i: b'{"ts": %d, "service": "s%d", "latency_ms": 2.0}\n' % (1_795_255_200_000 + i * 1000, i % 3)
    log.write_bytes(b"".join(line(i) for i in range(5_000)))
    url = f"duckdb:///{tmp_path}/s.duckdb"
    run_local([str(log)], definitions=DEFAULT_DEFINITIONS, store_url=url, dead_letter=str(tmp_path / "d.jsonl"))
    with open(log, "ab") as f:
        f.write(b"".join(line(i) for i in range(5_000, 8_000)) + line(8_000)[:-5])  # and a partial last line
    grown = run_batch([str(log)], store_url=url, spark=spark, dead_letter=str(tmp_path / "d.jsonl"))
    assert grown["read"] == 3_000 and grown["pending"] == {str(log): len(line(8_000)) - 5}
    again = run_batch([str(log)], store_url=url, spark=spark, dead_letter=str(tmp_path / "d.jsonl"))
    assert again["read"] == 0 and again["unchanged_files"] == 1
    whole = tmp_path / "whole.jsonl"
    whole.write_bytes(b"".join(line(i) for i in range(8_000)))
    once = f"duckdb:///{tmp_path}/once.duckdb"
    run_local([str(whole)], definitions=DEFAULT_DEFINITIONS, store_url=once, dead_letter=str(tmp_path / "e.jsonl"))
    assert_same_results(once, url, DEFAULT_DEFINITIONS)


def test_a_truncated_gzip_commits_nothing_in_either_engine(spark, tmp_path) -> None:
    import gzip

    from drainpipe.errors import InputError
    from drainpipe.pipeline.store import open_store

    body = b"".join(
        b'{"ts": %d, "service": "s", "latency_ms": 1.0}\n' % (1_795_255_200_000 + i) for i in range(150_000)
    )
    packed = gzip.compress(body)
    bad = tmp_path / "cut.jsonl.gz"
    bad.write_bytes(packed[: len(packed) * 2 // 3])
    for engine in ("local", "spark"):
        url = f"duckdb:///{tmp_path}/{engine}.duckdb"
        if engine == "spark":
            with pytest.raises(InputError, match="cannot read"):
                run_batch([str(bad)], store_url=url, spark=spark, dead_letter=str(tmp_path / "d.jsonl"))
        else:
            summary = run_local([str(bad)], definitions=DEFAULT_DEFINITIONS, store_url=url,
                                dead_letter=str(tmp_path / "d.jsonl"))  # fmt: skip
            assert summary.input_error and summary.stored == 0 and "cannot read" in summary.error
        store = open_store(url)
        try:
            assert store.query() == [], engine  # nothing of the file was committed
        finally:
            store.close()

"""The partitioned-source layer: every input a source of parts, each read from a resume position; one progress table
for every source (``source_progress``), and the migration of a store that kept ``file_progress``."""

from __future__ import annotations

from pathlib import Path

import pytest

from drainpipe.inputs import FileSource, Position, SourcePart
from drainpipe.pipeline import PartBooks, SourceProgress, generate_events, open_books, open_store, write_events
from drainpipe.server.log_source import LogSource
from drainpipe.server.wal import MemoryLog, WriteAheadLog

# ------------------------------------------------------------------------------------------------ reading parts


def _rows(batches: list) -> list[dict]:
    return [r for b in batches for r in b.rows.to_pylist()]


def _read_some(part: SourcePart, n: int) -> list:
    out = []
    for _ in range(n):
        batch = part.next_batch()
        if batch is None:
            break
        out.append(batch)
    return out


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet"])
def test_a_file_part_built_from_its_snapshot_reads_on_without_a_row_twice(tmp_path: Path, suffix: str) -> None:
    path = str(tmp_path / f"events{suffix}")
    write_events(generate_events(2_500, seed=5, batch_rows=500), path)
    source = FileSource([path], batch_rows=300)
    assert source.list_parts() == [path]
    whole = list(source.build_part(path, Position()))
    for cut in (1, 4):
        first = source.build_part(path, Position())
        head = _read_some(first, cut)
        resume = first.snapshot()
        first.close()
        rest = list(source.build_part(path, resume))
        assert _rows(head) + _rows(rest) == _rows(whole), (suffix, cut, resume)
    assert source.stats.read == 3 * 2_500  # every row once per full read: a resumed part reads no row again


def test_a_file_part_snapshot_after_its_end_reads_nothing_more(tmp_path: Path) -> None:
    path = str(tmp_path / "events.jsonl")
    write_events(generate_events(1_000, seed=6), path)
    source = FileSource([path], batch_rows=400)
    part = source.build_part(path, Position())
    assert sum(b.num_rows for b in part) == 1_000 and part.next_batch() is None
    end = part.snapshot()
    assert end.offset == Path(path).stat().st_size and end.lines == 1_000
    assert list(source.build_part(path, end)) == []


def test_the_planned_ranges_of_a_part_read_what_the_part_reads(tmp_path: Path) -> None:
    path = str(tmp_path / "events.jsonl")
    write_events(generate_events(3_000, seed=7), path)
    source = FileSource([path], batch_rows=256)
    ranges = list(source.plan(path, Position(), workers=3))
    assert len(ranges) > 1
    from drainpipe.inputs import read_part

    pieces = [b for r in ranges for b in read_part(r, source.sink(path))]
    assert _rows(pieces) == _rows(list(source.build_part(path, Position())))
    ends = [r.end_position for r in ranges]
    assert ends[-1] == Position(Path(path).stat().st_size, 3_000)


@pytest.mark.parametrize("durable", [True, False])
def test_the_log_is_a_live_part_resumed_at_its_snapshot(tmp_path: Path, durable: bool) -> None:
    log = WriteAheadLog(tmp_path / "wal") if durable else MemoryLog()
    try:
        batches = [_batch(i) for i in range(5)]
        for b in batches[:4]:
            log.append(b)
        source = LogSource(log)
        assert source.list_parts() == [log.key]
        part = source.build_part(log.key, Position())
        got = _read_some(part, 2)
        resume = part.snapshot()
        part.close()
        part = source.build_part(log.key, resume)
        got += _read_some(part, 10)
        assert part.next_batch() is None and not part.wait(0.01)  # caught up: nothing now
        log.append(batches[4])
        assert part.wait(1.0)
        got.append(part.next_batch())
        assert part.snapshot() == Position(log.end)
        assert [b.rows.column("ts").to_pylist() for b in got] == [b.rows.column("ts").to_pylist() for b in batches]
        part.close()
        with pytest.raises(ValueError, match="not"):
            source.build_part("wal:another", Position())
    finally:
        log.close()


def _batch(i: int):
    from drainpipe.inputs import EventBatch

    return EventBatch.of(next(iter(generate_events(10, seed=i))))


# ------------------------------------------------------------------------------------------------ the books


def test_books_advance_only_forward_and_say_which_definitions_read_a_range() -> None:
    books = PartBooks("log", "wal:x", {"a": Position(100), "b": Position(), "c": Position(300)})
    assert books.start == Position() and books.names_from(0) == {"b"} and books.names_from(100) == {"a", "b"}
    books.advance(["a", "b", "c"], Position(200))
    assert books.applied == {"a": Position(200), "b": Position(200), "c": Position(300)}  # c was further
    assert books.rows() == [SourceProgress("log", "wal:x", "a", 200), SourceProgress("log", "wal:x", "b", 200)]
    assert books.rows() == []  # committed rows are not repeated
    books.advance(["a"], Position(150))
    assert books.rows() == [] and books.applied["a"] == Position(200)


@pytest.fixture(params=["duckdb", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "duckdb":
        return f"duckdb:///{tmp_path / 'store.duckdb'}"
    return request.getfixturevalue("pg_url")


def test_the_store_keeps_every_source_in_one_table_committed_with_the_states(store_url: str) -> None:
    rows = [
        SourceProgress("file", "f" * 24, "service_cpm", 1_000, 10, "h" * 24, "1:2", "/data/a.jsonl", "p" * 64),
        SourceProgress("log", "wal:abc", "service_cpm", 5_000),
        SourceProgress("kafka:spans", "3", "service_cpm", 42),
    ]
    with open_store(store_url) as store:  # type: ignore[attr-defined]
        store.merge([], progress=rows)
        assert store.progress("file", head="h" * 24) == rows[:1]
        assert store.progress("file", node="1:2") == rows[:1]
        assert store.progress("file", head="other", node="other") == []
        assert store.progress("log", part="wal:abc") == rows[1:2]
        assert store.progress("kafka:spans") == rows[2:]
        books = open_books(store, "log", "wal:abc", ["service_cpm", "service_sla"])
        assert books.applied == {"service_cpm": Position(5_000), "service_sla": Position()}


# ------------------------------------------------------------------------------------------------ migration

OLD_TABLE = """CREATE TABLE file_progress (
    fid VARCHAR NOT NULL, name VARCHAR NOT NULL, head VARCHAR NOT NULL, node VARCHAR NOT NULL,
    path VARCHAR NOT NULL, end_offset BIGINT NOT NULL, end_lines BIGINT NOT NULL, prefix VARCHAR NOT NULL,
    {applied_at} PRIMARY KEY (fid, name))"""
FILE_ROW = ("abcdef0123456789abcdef01", "service_cpm", "0123456789abcdef01234567", "2049:77", "/logs/a.jsonl", 4_096,
            40, "9" * 64)  # fmt: skip
LOG_ROW = ("wal:5f2c", "service_cpm", "wal:5f2c", "wal:5f2c", "/srv/wal", 123_456, 0, "")


def _raw(store_url: str, statements: list[tuple[str, tuple]]) -> None:
    """Statements on the store's database, bypassing drainpipe (an old release's tables)."""
    if store_url.startswith("duckdb:///"):
        import duckdb

        con = duckdb.connect(store_url[len("duckdb:///") :])
        for sql, params in statements:
            con.execute(sql, params)
        con.close()
    else:
        import psycopg

        with psycopg.connect(store_url, autocommit=True) as pg:
            for sql, params in statements:
                pg.execute(sql.replace("?", "%s"), params)


@pytest.mark.parametrize("with_applied_at", [True, False])
def test_file_progress_of_an_older_release_becomes_source_progress(store_url: str, with_applied_at: bool) -> None:
    values = "(?, ?, ?, ?, ?, ?, ?, ?, ?)" if with_applied_at else "(?, ?, ?, ?, ?, ?, ?, ?)"
    extra = (1_700_000_000_000,) if with_applied_at else ()
    _raw(store_url, [(OLD_TABLE.format(applied_at="applied_at BIGINT," if with_applied_at else ""), ()),
                     (f"INSERT INTO file_progress VALUES {values}", FILE_ROW + extra),
                     (f"INSERT INTO file_progress VALUES {values}", LOG_ROW + extra)])  # fmt: skip
    with open_store(store_url) as store:  # type: ignore[attr-defined]
        fid, name, head, node, path, end, lines, prefix = FILE_ROW
        assert store.progress("file", head=head) == [SourceProgress("file", fid, name, end, lines, head, node, path,
                                                                    prefix)]  # fmt: skip
        assert store.progress("log", part="wal:5f2c") == [
            SourceProgress("log", "wal:5f2c", "service_cpm", 123_456, 0, "", "", "/srv/wal", "")
        ]
    with open_store(store_url) as store:  # type: ignore[attr-defined]
        assert len(store.progress("file")) == 1 and len(store.progress("log")) == 1  # migrated once
    assert _scalar(store_url, "SELECT count(*) FROM information_schema.tables "
                              "WHERE table_name = 'file_progress' AND table_schema = current_schema()") == 0  # fmt: skip


def test_a_migration_cut_between_copy_and_drop_is_finished_by_the_next_open(store_url: str) -> None:
    with open_store(store_url) as store:  # type: ignore[attr-defined]
        store.merge([], progress=[SourceProgress("log", "wal:5f2c", "service_cpm", 123_456, 0, "", "", "/srv/wal")])
    _raw(store_url, [(OLD_TABLE.format(applied_at="applied_at BIGINT,"), ()),
                     ("INSERT INTO file_progress VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", LOG_ROW + (1,)),
                     ("INSERT INTO file_progress VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", FILE_ROW + (1,))])  # fmt: skip
    with open_store(store_url) as store:  # type: ignore[attr-defined]
        assert [r.part for r in store.progress("log")] == ["wal:5f2c"] and len(store.progress("file")) == 1


def _scalar(store_url: str, sql: str) -> int:
    if store_url.startswith("duckdb:///"):
        import duckdb

        con = duckdb.connect(store_url[len("duckdb:///") :])
        try:
            return int(con.execute(sql).fetchone()[0])
        finally:
            con.close()
    import psycopg

    with psycopg.connect(store_url) as pg:
        return int(pg.execute(sql).fetchone()[0])

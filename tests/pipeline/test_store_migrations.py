"""The store's migrations drop ``applied_sources``: the ledger of applied batch ids that no writer filled since exactly
once moved to the books (``source_progress``). A store written by the last release
(``tests/fixtures/release-bd20262``, made by ``make_release_fixtures.py`` with that release's code) loses the table on
its first open, once, and keeps everything else; a PostgreSQL store with the old table (and its index) likewise."""

from __future__ import annotations

import gzip
import json
import logging
import shutil
from pathlib import Path

import duckdb
import pytest

from drainpipe.pipeline import default_definitions, open_store, run_local

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "release-bd20262"

#: the fixture's events are of 2026-11-21 (as that release wrote them): on the day after, every retention keeps them
pytestmark = pytest.mark.clock_at("2026-11-22T10:00:00Z")


def _tables(path: Path) -> set[str]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return {name for (name,) in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    finally:
        con.close()


def _dropped(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "applied_sources" in r.getMessage()]


def test_the_release_store_loses_applied_sources_on_first_open_and_keeps_the_rest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "run.duckdb"
    with gzip.open(FIXTURES / "run.duckdb.gz", "rb") as src, open(db, "wb") as dst:
        shutil.copyfileobj(src, dst)
    assert {"applied_sources", "file_progress"} <= _tables(db)  # as the release left it
    url = f"duckdb:///{db}"
    with caplog.at_level(logging.WARNING, logger="drainpipe.store"):
        with open_store(url) as store:  # type: ignore[attr-defined]
            values, progress = store.query(), store.progress("file")
        assert _dropped(caplog) and all("dropped applied_sources" in m for m in _dropped(caplog))
        caplog.clear()
        with open_store(url) as store:  # type: ignore[attr-defined]  # once: the second open has nothing to do
            assert (store.query(), store.progress("file")) == (values, progress)
        assert _dropped(caplog) == []
    assert "applied_sources" not in _tables(db) and "source_progress" in _tables(db)
    expected = json.loads((FIXTURES / "expected.json").read_text())["run"]
    cpm = [r for r in values if r[0] == "service_cpm" and r[2] == "minute"]
    assert {r[1] for r in cpm} == {expected["service"]} and sum(r[5] for r in cpm) == expected["file_events"]
    assert len(progress) == len(default_definitions().names)  # the file's books came through the other migration
    # the file the release applied is still applied exactly once: the books, not the dropped table, say so
    events = tmp_path / "events.jsonl"
    shutil.copy(FIXTURES / "events.jsonl", events)
    run_local([str(events)], definitions=default_definitions(), store_url=url, workers=0)
    with open_store(url) as store:  # type: ignore[attr-defined]
        assert store.query() == values


@pytest.mark.postgres
def test_a_postgresql_store_with_the_old_table_loses_it_and_its_index(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with open_store(pg_url) as store:  # type: ignore[attr-defined]
        # the last release's table and index, with a row (of a kind no writer of that release wrote: its ids were
        # always None)
        store.backend.execute(
            "CREATE TABLE applied_sources (root VARCHAR NOT NULL, source VARCHAR NOT NULL, name VARCHAR NOT NULL, "
            "applied_at BIGINT, PRIMARY KEY (source, name))"
        )
        store.backend.execute("CREATE INDEX applied_sources_root ON applied_sources (root)")
        store.backend.execute("INSERT INTO applied_sources VALUES ('b', 'b', 'service_cpm', 1)")
    with caplog.at_level(logging.WARNING, logger="drainpipe.store"):
        with open_store(pg_url) as store:  # type: ignore[attr-defined]
            found = store.backend.fetchall(
                "SELECT relname FROM pg_class WHERE relnamespace = current_schema()::regnamespace "
                "AND relname LIKE 'applied_sources%'"
            )
            assert found == []
        assert len(_dropped(caplog)) == 1

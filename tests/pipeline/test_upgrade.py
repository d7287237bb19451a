"""Upgrades keep exactly once: a store and a serve write-ahead log written by the release before the input layer's
and the store's reorganisation (``tests/fixtures/release-bd20262``, made by ``make_release_fixtures.py`` with that
release's code), opened by this code.

* The file that release applied is not applied again (its ``file_progress`` rows, moved into ``source_progress`` when
  the store is opened, still find it), and lines appended since are applied once.
* The log's records the old store has are skipped (the log's old progress row became the log source's), the two it lacks are replayed once (an OTLP export's exit rows
  still feed only the statement top-N), and a second start changes nothing.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from drainpipe.inputs import head_of
from drainpipe.pipeline import default_definitions, open_store, run_local
from drainpipe.server import IngestService
from drainpipe.server.wal import WriteAheadLog

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "release-bd20262"

#: the fixtures' events are from 2026-11-21T10:00Z (as that release wrote them): the tests run on the day after, when
#: every retention still keeps them (a server purges at start: on the wall clock, the minutes went 7 days later)
pytestmark = pytest.mark.clock_at("2026-11-22T10:00:00Z")


def _unpack(tmp_path: Path, name: str) -> Path:
    with gzip.open(FIXTURES / f"{name}.gz", "rb") as src, open(tmp_path / name, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return tmp_path / name


def _events_per_service(url: str) -> dict[str, int]:
    """Events per service: the sum of the minute service_cpm values (a minute's cpm is its event count)."""
    store = open_store(url)
    try:
        out: dict[str, int] = {}
        for _, entity, _, _, _, value in store.query(metric="service_cpm", granularity="minute"):
            out[entity] = out.get(entity, 0) + int(round(value))
        return out
    finally:
        store.close()


def _statements(url: str) -> int:
    store = open_store(url)
    try:
        return len(store.query_topn("top_slow_statements"))
    finally:
        store.close()


def _all_values(url: str) -> list[tuple]:
    store = open_store(url)
    try:
        return store.query()
    finally:
        store.close()


@pytest.fixture
def expected() -> dict:
    return json.loads((FIXTURES / "expected.json").read_text())


def test_a_file_the_old_release_applied_is_not_applied_again(tmp_path: Path, expected: dict) -> None:
    db = _unpack(tmp_path, "run.duckdb")
    events = tmp_path / "events.jsonl"
    shutil.copy(FIXTURES / "events.jsonl", events)
    url = f"duckdb:///{db}"
    before = _all_values(url)
    assert _events_per_service(url) == {expected["run"]["service"]: expected["run"]["file_events"]}
    run_local([str(events)], definitions=default_definitions(), store_url=url, workers=0)
    assert _all_values(url) == before  # nothing of the file applied twice
    with open_store(url) as store:  # type: ignore[attr-defined]
        files = store.progress("file", head=head_of(str(events)))
        assert {r.end for r in files} == {events.stat().st_size} and len(files) == len(default_definitions().names)
    line = json.loads(events.read_text().splitlines()[0])
    with events.open("a") as f:  # the file grows: only the new lines are read
        for i in range(200):
            f.write(json.dumps(line | {"ts": line["ts"] + i}) + "\n")
    run_local([str(events)], definitions=default_definitions(), store_url=url, workers=0)
    assert _events_per_service(url) == {expected["run"]["service"]: expected["run"]["file_events"] + 200}


def test_an_old_log_replays_once_into_an_old_store(tmp_path: Path, expected: dict) -> None:
    db = _unpack(tmp_path, "serve.duckdb")
    wal_dir = tmp_path / "serve.duckdb.drainpipe-wal"
    shutil.copytree(FIXTURES / "serve.duckdb.drainpipe-wal", wal_dir)
    url = f"duckdb:///{db}"
    assert _events_per_service(url) == expected["serve"]["stored"] and _statements(url) == 0
    wal = WriteAheadLog(wal_dir)
    key = wal.key
    wal.close()
    with open_store(url) as store:  # type: ignore[attr-defined]
        assert {r.part for r in store.progress("log")} == {key}  # the old log row, now the log source's part
    for _ in range(2):  # the second start finds everything applied
        service = IngestService(default_definitions(), open_store(url), log=WriteAheadLog(wal_dir), store_url=url)
        summary = service.close()
        assert summary["in_log"] == 0, summary
        assert _events_per_service(url) == expected["serve"]["stored"] | expected["serve"]["tail"]
        assert _statements(url) > 0  # the exit rows reached the statement top-N, and no metric

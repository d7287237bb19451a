"""The compatibility rule (CONTRIBUTING.md): input the previous release accepted, every later commit accepts.

``tests/fixtures/release-bd20262/compat-events.jsonl`` holds events with the extra and odd fields users' events have
(64-bit and malformed trace ids, unknown fields of every JSON type, nulls; ``make_compat_events.py``). That release's
``drainpipe run`` accepted all 68 and stored ``compat-run.duckdb.gz``. This code must accept every one on each way in
(a file, ``POST /v1/events``), store what that release stored, and, where it now reads an optional field it did not
(``trace_id``, with exemplars on), drop an odd value with a warning instead of the event.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
from server_testlib import post_events, running_server

from drainpipe.pipeline import DEFAULT_DEFINITIONS, open_store, run_local
from drainpipe.pipeline.definitions import parse_definitions

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "release-bd20262"
EVENTS = FIXTURES / "compat-events.jsonl"
LINES = EVENTS.read_text().splitlines()

#: the events' trace ids that are no trace id (anything but 32 or 16 hex digits or a UUID, not all zeros): each
#: costs its field, with a warning, when trace ids are read
BAD_TRACE_IDS = 20


def _release_store(tmp_path: Path) -> str:
    with gzip.open(FIXTURES / "compat-run.duckdb.gz", "rb") as src, open(tmp_path / "release.duckdb", "wb") as dst:
        shutil.copyfileobj(src, dst)
    return f"duckdb:///{tmp_path / 'release.duckdb'}"


def _metric_rows(url: str) -> list[tuple]:
    with open_store(url) as store:  # type: ignore[attr-defined]
        return store.query()


def test_the_file_of_odd_events_is_accepted_whole_and_stored_as_the_release_stored_it(tmp_path: Path) -> None:
    assert len(LINES) == 68
    url = f"duckdb:///{tmp_path / 'now.duckdb'}"
    summary = run_local([str(EVENTS)], definitions=DEFAULT_DEFINITIONS, store_url=url, workers=0)
    assert (summary.accepted, summary.rejected, summary.reasons) == (68, 0, {}), summary.lines()
    release = _metric_rows(_release_store(tmp_path))
    names = {row[0] for row in release}
    assert names >= set(DEFAULT_DEFINITIONS.names) - {"top_slow_statements"}
    assert [row for row in _metric_rows(url) if row[0] in names] == release


def test_with_exemplars_an_odd_trace_id_costs_the_field_not_the_event(tmp_path: Path) -> None:
    definitions = parse_definitions("[prometheus]\nexemplars = true\n")
    url = f"duckdb:///{tmp_path / 'ex.duckdb'}"
    summary = run_local([str(EVENTS)], definitions=definitions, store_url=url, workers=0)
    assert (summary.accepted, summary.rejected) == (68, 0), summary.lines()
    assert summary.warnings == {"bad trace_id": BAD_TRACE_IDS}, summary.warnings
    release = _metric_rows(_release_store(tmp_path))
    names = {row[0] for row in release}
    assert [row for row in _metric_rows(url) if row[0] in names] == release  # the metrics do not need trace ids
    with open_store(url) as store:  # type: ignore[attr-defined]
        kept = {row[4] for row in store.query_topn("exemplars")}
    assert kept and all(len(key) == 32 and int(key, 16) for key in kept), kept


@pytest.mark.parametrize("exemplars", [False, True])
def test_posted_to_v1_events_every_odd_event_is_accepted(exemplars: bool) -> None:
    definitions = parse_definitions("[prometheus]\nexemplars = true\n") if exemplars else DEFAULT_DEFINITIONS
    with running_server(definitions=definitions) as srv:
        status, _, answer = post_events(srv.url, [json.loads(line) for line in LINES], kind="ndjson")
        assert status == 200 and answer["accepted"] == 68 and answer["rejected"] == 0, answer

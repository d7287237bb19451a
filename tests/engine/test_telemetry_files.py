"""Access logs (nginx and Apache, with malformed lines) and OTLP JSON trace files through the local engine: every
valid line or request span stored, endpoints normalized, malformed lines and spans in the dead letter with a reason.
tests/spark/test_spark_telemetry.py runs the same files through Spark and compares the stores."""

from __future__ import annotations

import gzip
import json
import random
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from drainpipe.errors import InputError
from drainpipe.inputs.options import InputOptions
from drainpipe.pipeline.definitions import EXEMPLARS, default_definitions, with_exemplars
from drainpipe.pipeline.run import run_local
from drainpipe.pipeline.store import open_store
from telemetry_files import access_log, otlp_file

BASE_MS = 1_790_000_000_000 // 60_000 * 60_000


#: trace ids a few events carry instead of 32 hex digits, and what is kept of them (None: dropped, with a warning)
ODD_TRACE_IDS = [("not-a-trace-id", None), ("000000066dea322d", "0000000000000000000000066dea322d"),
                 ("4BF92F35-77B3-4DA6-A3CE-929D0E0E4736", "4bf92f3577b34da6a3ce929d0e0e4736"), ("", None),
                 ("0" * 32, None), (6, None), (True, None), ({"id": 1}, None)]  # fmt: skip


def traced_events(path: Path, n: int, seed: int) -> list[dict]:
    """JSON Lines events of which most carry a trace id (``trace_id``, 32 hex digits; every 37th one of
    :data:`ODD_TRACE_IDS`: a 64-bit id or a UUID is kept as its 32 digits, the others are dropped, their events
    stored without them); the events as stored."""
    rng = random.Random(seed)
    lines, stored = [], []
    for i in range(n):
        event = {"ts": BASE_MS + rng.randrange(0, 180_000), "service": "jsvc", "endpoint": f"/j{i % 3}",
                 "latency_ms": float(rng.randrange(1, 3000)), "status": i % 9 != 0}  # fmt: skip
        stored.append(dict(event))
        if i % 5:
            odd, kept = ODD_TRACE_IDS[i // 37 % len(ODD_TRACE_IDS)]
            event["trace_id"], kept = (rng.randbytes(16).hex(),) * 2 if i % 37 else (odd, kept)
            if kept is not None:
                stored[-1]["trace_id"] = kept
        lines.append(json.dumps(event))
    path.write_text("\n".join(lines) + "\n")
    return stored


def telemetry_inputs(directory: Path) -> tuple[list[str], dict]:
    nginx = access_log(directory / "nginx-access.log", "nginx", 600, 1, BASE_MS)
    apache = access_log(directory / "apache-access.log.gz", "apache", 400, 2, BASE_MS)
    spans = otlp_file(directory / "traces.otlp.jsonl.gz", 3, BASE_MS)
    traced = traced_events(directory / "traced.jsonl", 700, 4)
    names = ("nginx-access.log", "apache-access.log.gz", "traces.otlp.jsonl.gz", "traced.jsonl")
    return [str(directory / p) for p in names], {"access": nginx + apache, "spans": spans, "traced": traced}


#: the default metrics, with exemplars kept (``[prometheus] exemplars = true``): the spans' trace ids reach the store
DEFINITIONS = with_exemplars(default_definitions())


def expected_exemplars(path: Path) -> list[tuple]:
    """What the exemplars top-N should hold for the OTLP fixture file, read with json alone: per service/endpoint,
    minute (of the end time) and latency bucket (upper-inclusive), the slowest SERVER span's trace id (ties: the
    smaller id), as (entity, minute ISO, latency ms, trace id)."""
    import bisect
    import time

    bounds = DEFINITIONS.latency_buckets_ms
    best: dict[tuple, tuple[float, str]] = {}
    for line in gzip.decompress(path.read_bytes()).decode().splitlines():
        try:
            document = json.loads(line)
        except json.JSONDecodeError:
            continue  # the truncated line
        for resource in document["resourceSpans"]:
            attributes = {a["key"]: a["value"]["stringValue"] for a in resource["resource"]["attributes"]}
            for scope in resource["scopeSpans"]:
                for span in scope["spans"]:
                    start, end = int(span["startTimeUnixNano"]), int(span["endTimeUnixNano"])
                    if span.get("kind") != "SPAN_KIND_SERVER" or end < start:
                        continue
                    route = {a["key"]: a["value"].get("stringValue") for a in span.get("attributes", [])}
                    endpoint = route.get("http.route") or span["name"].rsplit("/", 1)[0] + "/{id}"
                    latency = (end - start) / 1e6
                    minute = end // 1_000_000 // 60_000 * 60_000
                    key = (f"{attributes['service.name']}/{endpoint}", minute, bisect.bisect_left(bounds, latency))
                    trace = span["traceId"].rjust(32, "0") if len(span["traceId"]) == 16 else span["traceId"]
                    if not trace:  # (a span without a trace id is a request, and no exemplar)
                        continue
                    candidate = (-latency, trace)
                    if key not in best or candidate < best[key]:
                        best[key] = candidate
    return sorted(
        (entity, time.strftime("%Y-%m-%dT%H:%M:00Z", time.gmtime(minute / 1000)), -negative, trace)
        for (entity, minute, _le), (negative, trace) in best.items()
    )


def expected_json_exemplars(events: list[dict]) -> list[tuple]:
    """The same for JSON events with a ``trace_id`` (their ``ts`` is the minute's)."""
    import bisect
    import time

    bounds = DEFINITIONS.latency_buckets_ms
    best: dict[tuple, tuple[float, str]] = {}
    for e in events:
        if "trace_id" in e:
            minute = e["ts"] // 60_000 * 60_000
            key = (f"{e['service']}/{e['endpoint']}", minute, bisect.bisect_left(bounds, e["latency_ms"]))
            candidate = (-e["latency_ms"], e["trace_id"])
            if key not in best or candidate < best[key]:
                best[key] = candidate
    return sorted(
        (entity, time.strftime("%Y-%m-%dT%H:%M:00Z", time.gmtime(minute / 1000)), -negative, trace)
        for (entity, minute, _le), (negative, trace) in best.items()
    )


def cpm_by_entity(url: str, metric: str) -> dict[str, float]:
    store = open_store(url)
    try:
        out: Counter = Counter()
        for _m, entity, _g, _b, _l, value in store.query(metric=metric, granularity="minute"):
            out[entity] += value
        return dict(out)
    finally:
        store.close()


def test_access_logs_and_otlp_files_through_the_local_engine(tmp_path: Path) -> None:
    paths, want = telemetry_inputs(tmp_path)
    url = f"duckdb:///{tmp_path / 'store.duckdb'}"
    dead = tmp_path / "rejected.jsonl"
    summary = run_local(paths, definitions=DEFINITIONS, store_url=url, dead_letter=str(dead), service="web")
    assert summary.complete and summary.dropped == 0
    services = cpm_by_entity(url, "service_cpm")
    assert services["web"] == len(want["access"])
    for service, n in want["spans"].items():
        assert services[service] == n
    endpoints = cpm_by_entity(url, "endpoint_cpm")
    expected_endpoints = Counter(f"web/{e}" for _, e, _, _ in want["access"])
    assert {k: v for k, v in endpoints.items() if k.startswith("web/")} == expected_endpoints
    assert "web/GET /users/{id}" in endpoints and "svc0/GET /users/{id}" in endpoints  # ids folded
    assert "svc0//users/:id" in endpoints  # http.route wins over the span name
    rejects = [json.loads(line) for line in dead.read_text().splitlines()]
    reasons = Counter(r["reason"] for r in rejects)
    malformed = sum(1 for n in (600, 400) for i in range(n) if i % 97 == 5)  # as the fixture writes them
    bad_time = sum(1 for n in (600, 400) for i in range(n) if i % 131 == 7)
    assert reasons["not an access log line"] == malformed and reasons["bad timestamp: ts"] == bad_time
    assert reasons["invalid JSON"] == 1 and reasons["bad value: end before start"] == 1, reasons
    assert summary.rejected == len(rejects) and summary.read == summary.accepted + summary.rejected
    store = open_store(url)
    try:  # CLIENT spans' statements reach the statements top-N, and nothing else
        statements = {row[4] for row in store.query_topn("top_slow_statements")}
        exemplars = sorted((entity, bucket, latency, key)
                           for _n, entity, bucket, _rank, key, latency in store.query_topn(EXEMPLARS))  # fmt: skip
    finally:
        store.close()
    assert statements and all(s.startswith("SELECT ") for s in statements)
    # the slowest traced request per endpoint, minute and latency bucket ([prometheus] exemplars): SERVER spans'
    # trace ids, and JSON events' trace_id fields
    spans = [e for e in exemplars if not e[0].startswith("jsvc/")]
    assert spans == expected_exemplars(Path(paths[2])) and len(spans) > 50
    assert [e for e in exemplars if e[0].startswith("jsvc/")] == expected_json_exemplars(want["traced"])
    assert "bad value: trace_id" not in reasons  # an odd trace id costs its event nothing but the id
    dropped = sum(1 for i in range(700) if i % 5 and not i % 37 and ODD_TRACE_IDS[i // 37 % 8][1] is None)
    assert summary.warnings["bad trace_id"] == dropped + 1  # and a span's (telemetry_files.otlp_file)
    assert summary.warnings["bad span_id"] == 1
    assert cpm_by_entity(url, "service_cpm")["jsvc"] == 700


def test_an_access_log_needs_a_service(tmp_path: Path) -> None:
    access_log(tmp_path / "a.log", "nginx", 5, 1, BASE_MS)
    with pytest.raises(InputError, match="--service"):
        run_local([str(tmp_path / "a.log")], definitions=default_definitions(),
                  store_url=f"duckdb:///{tmp_path / 's.duckdb'}")  # fmt: skip


def test_blocks_of_a_line_decoded_file_are_bounded_in_bytes_and_give_the_same_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An OTLP line is a whole export, so a block of ``batch_rows`` lines could hold tens of millions of events: a
    block also ends at ``OtlpJson.block_bytes``. Shrunk to 8 KB here (about one export of the fixture), the file is
    cut into many blocks, none past the bound by more than its last line, and the store, the rejects and their line
    numbers are those of the one-block read. (An access-log line is one request: its blocks are cut by lines.)"""
    from drainpipe.inputs import EventBatch, ReadStats, RejectList, Sink, read_part, whole_file
    from drainpipe.inputs.formats.otlp_format import OtlpJson

    paths, _ = telemetry_inputs(tmp_path)
    options = InputOptions(service="web")

    def read(path: str) -> tuple[list[EventBatch], list]:
        rejects = RejectList()
        blocks = list(read_part(whole_file(path, 65_536, options=options), Sink(path, ReadStats(), rejects)))
        return blocks, rejects.rows

    def rows(blocks: list[EventBatch]) -> tuple[pa.Table, pa.Table]:
        """The requests and the exit rows (an OTLP block holds its requests first), each in file order."""
        parts = [(b.request_rows(), b.rows.slice(b.requests)) for b in blocks]
        return tuple(pa.Table.from_batches([p[k] for p in parts]) for k in (0, 1))

    whole = {p: read(p) for p in paths}
    url_a, url_b = f"duckdb:///{tmp_path / 'a.duckdb'}", f"duckdb:///{tmp_path / 'b.duckdb'}"
    run_local(paths, definitions=default_definitions(), store_url=url_a, service="web", workers=0)
    monkeypatch.setattr(OtlpJson, "block_bytes", 8 << 10)
    for path in [p for p in paths if p.endswith((".otlp.jsonl", ".otlp.json"))]:
        blocks, rejects = read(path)
        assert len(whole[path][0]) == 1 and len(blocks) > 5, path  # one block before, many now
        assert all(a.equals(b) for a, b in zip(rows(blocks), rows(whole[path][0]))), path
        assert rejects == whole[path][1], path
    run_local(paths, definitions=default_definitions(), store_url=url_b, service="web", workers=0)
    for metric in ("service_cpm", "endpoint_cpm", "instance_cpm"):
        assert cpm_by_entity(url_b, metric) == pytest.approx(cpm_by_entity(url_a, metric)), metric

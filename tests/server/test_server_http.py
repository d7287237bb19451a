"""Every endpoint of `drainpipe serve`, in process: good input, bad input, limits, tokens, back-pressure."""

from __future__ import annotations

import dataclasses
import gzip
import json
import time

import pytest
from server_testlib import events, ndjson, post_events, request, running_server, stored_event_count

import drainpipe
from drainpipe.inputs import EVENT_SCHEMA, validate_json_lines, validate_records
from drainpipe.pipeline.definitions import default_definitions
from drainpipe.pipeline.store import open_store
from drainpipe.server.http import IngestServer
from drainpipe.server.http_face import is_loopback
from drainpipe.server.service import IngestService, ServiceOptions
from drainpipe.server.wal import MemoryLog
from testlib import wait_until


@pytest.fixture(scope="module")
def server():
    with running_server() as srv:
        yield srv


# ------------------------------------------------------------------------------------------ validation entry points


def test_validate_records_and_json_lines_use_the_file_rules() -> None:
    batch, rejects = validate_records(
        [
            {"ts": 1, "service": "a", "latency_ms": 1},
            {"ts": "x", "service": "a"},
            7,
            {"ts": "2026-11-21T10:00:00Z", "service": "b", "latency_ms": 2.5, "status": "false"},
        ]
    )
    assert batch.schema == EVENT_SCHEMA and batch.num_rows == 2
    assert rejects == [(1, "bad timestamp: ts"), (2, "not an object")]
    assert batch.column("status").to_pylist() == [True, False]
    batch, rejects = validate_json_lines(
        b'{"ts":1,"service":"a","latency_ms":1}\n\n{oops\n{"ts":1,"service":"a","latency_ms":NaN}\n'
    )
    assert batch.num_rows == 1 and rejects == [(3, "invalid JSON"), (4, "invalid JSON")]
    assert validate_records([])[0].num_rows == 0


# ------------------------------------------------------------------------------------------ POST /v1/events


def test_json_array_ndjson_and_gzip_are_accepted(server: IngestServer) -> None:
    status, _, body = post_events(server.url, events(500, seed=1))
    assert status == 200 and body == {"accepted": 500, "rejected": 0, "reasons": {}, "errors": [], "warnings": {}}
    status, _, body = post_events(server.url, events(300, seed=2), kind="ndjson")
    assert status == 200 and body["accepted"] == 300
    status, _, body = post_events(server.url, events(200, seed=3), kind="ndjson", gzipped=True)
    assert status == 200 and body["accepted"] == 200
    status, _, body = post_events(server.url, events(100, seed=4), gzipped=True)
    assert status == 200 and body["accepted"] == 100
    status, _, body = post_events(server.url, events(1, seed=5)[0])  # type: ignore[arg-type]  # one object
    assert status == 200 and body["accepted"] == 1


def test_invalid_records_are_counted_as_rejected(server: IngestServer) -> None:
    good = events(5, seed=6)
    records = good + [
        {"ts": 1, "service": ""},
        [1, 2],
        {"service": "a", "latency_ms": 1},
        {"ts": 1, "service": "a", "latency_ms": -1},
    ]
    status, _, body = post_events(server.url, records)
    assert status == 200
    assert body["accepted"] == 5 and body["rejected"] == 4
    assert body["reasons"] == {
        "bad value: service": 1,
        "not an object": 1,
        "missing field: ts": 1,
        "out of range: latency_ms": 1,
    }
    assert body["errors"][0] == {"index": 5, "reason": "bad value: service"}
    # NDJSON: a malformed line is a reject (with its line number), the others go in
    text = ndjson(good[:3]) + b"{not json\n\n" + b'{"ts": 1, "service": "x", "latency_ms": NaN}\n' + ndjson(good[3:])
    status, body, _ = post_events_raw(server, text, "application/x-ndjson")
    assert status == 200 and body["accepted"] == 5 and body["rejected"] == 2
    assert body["errors"] == [{"line": 4, "reason": "invalid JSON"}, {"line": 6, "reason": "invalid JSON"}]


def post_events_raw(server: IngestServer, body: bytes, ctype: str, headers: dict[str, str] | None = None):
    status, h, raw = request(server.url + "/v1/events", "POST", body, {"Content-Type": ctype, **(headers or {})})
    return status, json.loads(raw) if raw else None, h


def test_malformed_json_body_is_400(server: IngestServer) -> None:
    for body in (b'[{"ts": 1,', b"[1, 2] trailing", b'"a string"', b"[NaN]", b"\xff\xfe"):
        status, answer, _ = post_events_raw(server, body, "application/json")
        assert status == 400, body
        assert answer["status"] == 400 and answer["error"]
    status, answer, _ = post_events_raw(server, b"not gzip at all", "application/json", {"Content-Encoding": "gzip"})
    assert status == 400 and "gzip" in answer["error"]
    status, answer, _ = post_events_raw(
        server, gzip.compress(b"[]")[:-6], "application/json", {"Content-Encoding": "gzip"}
    )
    assert status == 400


def test_wrong_content_type_or_encoding_is_415(server: IngestServer) -> None:
    for ctype in ("text/plain", "application/xml", ""):
        status, answer, _ = post_events_raw(server, b"[]", ctype)
        assert status == 415 and "content type" in answer["error"]
    status, answer, _ = post_events_raw(server, b"[]", "application/json", {"Content-Encoding": "br"})
    assert status == 415 and "encoding" in answer["error"]
    status, _, _ = post_events_raw(server, b"[]", "application/json; charset=utf-8")
    assert status == 200


def test_other_endpoints_and_methods(server: IngestServer) -> None:
    assert request(server.url + "/nope")[0] == 404
    status, headers, _ = request(server.url + "/v1/events")
    assert status == 405 and headers["Allow"] == "POST"
    assert request(server.url + "/v1/stats", "POST", b"{}", {"Content-Type": "application/json"})[0] == 405


def test_limits_give_413() -> None:
    opts = ServiceOptions(max_body_bytes=20_000, max_decoded_bytes=50_000, max_events=100)
    with running_server(options=opts) as srv:
        status, answer, headers = post_events_raw(srv, json.dumps(events(400, seed=7)).encode(), "application/json")
        assert status == 413 and "larger than the limit" in answer["error"]
        assert headers.get("Connection") == "close"
        bomb = gzip.compress(b"[" + b" " * 200_000 + b"]")  # small on the wire, too big unpacked
        assert len(bomb) < 20_000
        status, answer, _ = post_events_raw(srv, bomb, "application/json", {"Content-Encoding": "gzip"})
        assert status == 413 and "decompressed" in answer["error"]
        many = [{"ts": 1, "service": "a", "latency_ms": 1}] * 101
        status, answer, _ = post_events_raw(srv, json.dumps(many, separators=(",", ":")).encode(), "application/json")
        assert status == 413 and "more than 100 events" in answer["error"]
        status, answer, _ = post_events_raw(srv, ndjson(many), "application/x-ndjson")
        assert status == 413
        assert post_events(srv.url, events(50, seed=8))[0] == 200  # the server is fine afterwards
        assert srv.service.counters.accepted == 50


def test_token_is_required_when_set() -> None:
    with running_server(token="s3cret") as srv:
        status, headers, _ = post_events(srv.url, events(10, seed=9))
        assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")
        assert post_events(srv.url, events(10, seed=9), token="wrong")[0] == 401
        status, _, body = post_events(srv.url, events(10, seed=9), token="s3cret")
        assert status == 200 and body["accepted"] == 10
        assert request(srv.url + "/v1/stats")[0] == 401
        assert request(srv.url + "/metrics")[0] == 401
        assert request(srv.url + "/metrics", headers={"Authorization": "Bearer s3cret"})[0] == 200
        assert request(srv.url + "/healthz")[0] == 200 and request(srv.url + "/")[0] == 200
        assert srv.service.counters.accepted == 10


def test_non_loopback_bind_needs_a_token() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")
    from drainpipe.cli import main

    assert main(["serve", "--host", "0.0.0.0", "--port", "0"]) == 2
    service = IngestService.__new__(IngestService)  # never started: the check comes first
    with pytest.raises(ValueError, match="without a token"):
        IngestServer(service, "0.0.0.0", 0, None)


def test_consume_refuses_a_non_loopback_port_without_a_token(capsys) -> None:
    """The same rule for a Kafka member's routes, before it connects to anything (the broker here does not exist)."""
    from drainpipe.cli import main

    group = ["consume", "--bootstrap-servers", "127.0.0.1:1", "--topic", "t", "--group", "g", "--port", "0"]
    assert main([*group, "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert "consume: refusing to listen on '0.0.0.0' without a token" in err and err.count("\n") == 1, err


def test_the_read_routes_want_the_token_but_the_page_and_the_probe() -> None:
    """serve's and consume's one rule (http_face): with a token, /v1/stats, /v1/service and /metrics answer 401
    (with WWW-Authenticate) without it and 200 with it; / and /healthz answer anyone; other paths are not theirs."""
    from drainpipe.server.http_face import ReadRoutes

    store = open_store("duckdb:///:memory:")
    routes = ReadRoutes(lambda: (200, {"status": "ok"}), lambda: {"live": 1}, lambda accept: (b"m 1\n", "text/plain"),
                        store, default_definitions(), token="s3cret")  # fmt: skip
    try:
        for path in ("/v1/stats", "/v1/service?service=x", "/metrics"):
            denied = routes.get(path, None)
            assert denied is not None and denied.status == 401 and "WWW-Authenticate" in denied.headers, path
            assert routes.get(path, "Bearer wrong").status == 401  # type: ignore[union-attr]
            assert routes.get(path, "bearer s3cret").status == 200, path  # type: ignore[union-attr]
        for path in ("/", "/healthz"):
            assert routes.get(path, None).status == 200, path  # type: ignore[union-attr]
        assert routes.get("/v1/service?range=minute", "Bearer s3cret").status == 400  # type: ignore[union-attr]
        assert routes.get("/v1/events", None) is None and routes.get("/nope", None) is None
        open_routes = ReadRoutes(routes.health, routes.stats, routes.metrics, store, routes.definitions)
        assert open_routes.get("/v1/stats", None).status == 200  # type: ignore[union-attr]  # no token: open
    finally:
        store.close()


def test_back_pressure_is_429_or_503_with_retry_after() -> None:
    opts = ServiceOptions(max_lag_bytes=-1, admit_wait_s=0.05, sample_interval_s=0.25)  # the engine never catches up
    with running_server(options=opts) as srv:
        status, headers, body = post_events(srv.url, events(10, seed=10))
        assert status == 429 and headers["Retry-After"] == "1" and "busy" in body["error"]
        srv.service.store.consecutive_failures = 1  # as after a failed write: the store is down
        status, headers, body = post_events(srv.url, events(10, seed=10))
        assert status == 200  # while the store is down the log takes the events (up to its budget)
        srv.service.store.consecutive_failures = 0
        assert srv.service.counters.accepted == 10
        assert srv.service.counters.refused_busy == 1 and srv.service.counters.refused_unavailable == 0
        status, _, health = request(srv.url + "/healthz")
        assert status == 200
    # a log at its byte budget refuses with 503
    with running_server(log=MemoryLog(max_bytes=1)) as srv:
        status, headers, body = post_events(srv.url, events(10, seed=10))
        assert status == 503 and int(headers["Retry-After"]) >= 1 and "full" in body["error"], body
        assert srv.service.counters.accepted == 0 and srv.service.counters.refused_unavailable == 1
    # a server that is shutting down refuses with 503
    with running_server() as srv:
        srv.service.drain()
        status, headers, body = post_events(srv.url, events(10, seed=10))
        assert status == 503 and headers["Retry-After"] and "shutting down" in body["error"]
        assert request(srv.url + "/healthz")[0] == 503


# ------------------------------------------------------------------------------------------ GET endpoints


def test_healthz_stats_and_metrics(server: IngestServer) -> None:
    status, _, raw = request(server.url + "/healthz")
    assert status == 200 and json.loads(raw)["status"] == "ok"
    for i in range(6):
        assert post_events(server.url, events(2000, seed=100 + i))[0] == 200
    accepted = server.service.counters.accepted
    view = wait_until(
        lambda: (
            (v := json.loads(request(server.url + "/v1/stats")[2]))["engine"]["persisted_batches"] > 0
            and v["top_services"]["rows"]
            and v["ingest"]["accepted"] == accepted
            and v
        ),
        timeout=10,
        interval=0.05,
        what="the posted events in /v1/stats",
    )
    assert {q["role"] for q in view["queues"]} == {"ingest", "L1", "L2", "topn", "persist"}
    l1 = next(q for q in view["queues"] if q["role"] == "L1")
    assert len(l1["partitions"]) >= 1 and sum(l1["tasks"]) > 0 and len(l1["task_partitions"]) == len(l1["tasks"])
    assert view["history"] and "task_load" in view["history"][-1]
    top = view["top_services"]
    assert top["columns"][:3] == ["service", "minute", "service_cpm"] and top["rows"][0][0].startswith("svc-")

    status, headers, raw = request(server.url + "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    text = raw.decode()
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in (
        "drainpipe_queue_usage_ratio",
        "drainpipe_partition_usage_ratio",
        "drainpipe_partition_used_items",
        "drainpipe_queue_produced",
        "drainpipe_queue_dropped",
        "drainpipe_queue_dispatched",
        "drainpipe_drain_task_dispatched",
        "drainpipe_drain_task_partitions",
        "drainpipe_drain_task_load_items_per_second",
        "drainpipe_queue_rebalances",
        "drainpipe_queue_failovers",
        "drainpipe_queue_failed_over_tasks",
        "drainpipe_rebalance_handoff_seconds",
        "drainpipe_store_write_latency_seconds",
        "drainpipe_engine_store_retries",
        "drainpipe_engine_store_write_seconds",
        "drainpipe_store_up",
        "drainpipe_ingest_events",
        "drainpipe_http_requests",
        "drainpipe_ingest_request_seconds",
    ):
        assert name in families, name
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert samples[("drainpipe_ingest_events_total", (("outcome", "accepted"),))] == accepted
    l1_name = l1["name"]
    assert samples[("drainpipe_queue_dropped_total", (("queue", l1_name), ("reason", "full")))] == 0
    assert samples[("drainpipe_queue_produced_total", (("queue", l1_name),))] > 0
    assert samples[("drainpipe_store_write_latency_seconds_count", ())] >= 1
    assert ("drainpipe_partition_usage_ratio", (("partition", "0"), ("queue", l1_name))) in samples


def test_rebalance_handoffs_show_in_metrics() -> None:
    """A load skewed by construction on two L1 threads makes L1 rebalance; its handoff durations reach the
    histogram.

    The skew is built, not left to chance (random batches of the default metrics are nearly even across threads, so
    a rebalance came or not by luck). Four metrics registered in the order endpoint, service, endpoint, service
    land on partitions 0-3, owned by threads 0, 1, 0, 1 (the queue places each new type on the partition with the
    fewest types, new partitions on the thread owning the fewest). 400 endpoints in chunks of 16 state rows make
    each endpoint metric 25 items per batch against the service metrics' 1: thread 0 carries 50, thread 1 carries
    2, and moving one endpoint metric halves the busiest thread's load."""
    defs = default_definitions()
    order = ("endpoint_cpm", "service_cpm", "endpoint_resp_time", "service_sla")
    skewed = dataclasses.replace(defs, metrics=tuple(defs.get(name) for name in order), topns=())
    with running_server(
        definitions=skewed, rebalance_interval_ms=100, chunk_rows=16, l1_threads=drainpipe.ThreadPolicy.fixed(2)
    ) as srv:
        deadline = time.monotonic() + 30
        moves: list[dict] = []
        while not moves and time.monotonic() < deadline:
            now = int(time.time() * 1000)
            batch = [
                {
                    "ts": now - i % 1000,
                    "service": "svc",
                    "endpoint": f"/api/e{i % 400}",
                    "latency_ms": float(i % 97),
                    "status": True,
                }
                for i in range(2000)
            ]
            post_events(srv.url, batch)
            view = json.loads(request(srv.url + "/v1/stats")[2])
            moves = [r for r in view["rebalances"] if r["queue"].endswith("-L1")]
        assert moves, "no L1 rebalance happened"
        r = moves[0]
        assert r["moved"] >= 1 and r["duration_ms"] >= 0
        assert r["ratio_before"] > 5 and r["ratio_after"] < r["ratio_before"] / 2, str(r)
        text = request(srv.url + "/metrics")[2].decode()
        count = [line for line in text.splitlines() if line.startswith("drainpipe_rebalance_handoff_seconds_count")]
        assert count and any(float(line.rsplit(" ", 1)[1]) >= 1 for line in count)


def test_everything_accepted_is_stored_after_shutdown(tmp_path) -> None:
    url = f"duckdb:///{tmp_path / 'http.duckdb'}"
    with running_server(store_url=url) as srv:
        total = 0
        for i in range(10):
            status, _, body = post_events(
                srv.url, events(1500, seed=i), kind="ndjson" if i % 2 else "json", gzipped=i % 3 == 0
            )
            assert status == 200
            total += body["accepted"]
    assert srv.service.summary()["dropped"] == 0
    assert stored_event_count(url) == total == 15_000
    # requests carry no id: the write-ahead log's position, committed with the states, makes commits exact
    from drainpipe.pipeline.store import open_store

    with open_store(url) as store:  # type: ignore[attr-defined]
        assert store.progress("log")


# ------------------------------------------------------------------------------------------ chunked request bodies


def raw_post(url: str, head: list[str], body: bytes, *, sock=None):
    """Send a hand-framed POST /v1/events (``head``: extra header lines; ``body``: the bytes after the blank
    line, sent as they are) and read the answer. Returns (status, headers, json, socket)."""
    import http.client
    import socket
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    s = sock or socket.create_connection((parts.hostname, parts.port), timeout=30)
    s.sendall(("POST /v1/events HTTP/1.1\r\nHost: x\r\n" + "".join(h + "\r\n" for h in head) + "\r\n").encode() + body)
    r = http.client.HTTPResponse(s)
    r.begin()
    raw = r.read()
    return r.status, {k: v for k, v in r.getheaders()}, json.loads(raw) if raw else None, s


def chunked(data: bytes, sizes: list[int]) -> bytes:
    """``data`` framed as chunks of the given sizes (cycled), then the last chunk and an empty trailer."""
    out, i, k = [], 0, 0
    while i < len(data):
        n = sizes[k % len(sizes)]
        out.append(b"%x\r\n" % len(data[i : i + n]) + data[i : i + n] + b"\r\n")
        i, k = i + n, k + 1
    return b"".join(out) + b"0\r\n\r\n"


def test_chunked_ndjson_and_gzip_bodies_are_accepted(server: IngestServer) -> None:
    before = server.service.counters.accepted
    body = ndjson(events(700, seed=40))
    head = ["Content-Type: application/x-ndjson", "Transfer-Encoding: chunked"]
    status, _, answer, sock = raw_post(server.url, head, chunked(body, [1, 100, 4096, 7]))
    assert status == 200 and answer["accepted"] == 700 and answer["rejected"] == 0
    # the connection stays usable (the body was consumed exactly); chunk extensions and trailers are ignored
    framed = b"%x;name=value\r\n" % len(body) + body + b"\r\n0\r\nX-Checksum: abc\r\n\r\n"
    status, _, answer, sock = raw_post(server.url, head, framed, sock=sock)
    assert status == 200 and answer["accepted"] == 700
    sock.close()
    # gzip inside chunked: de-chunked first, then decompressed
    gz = gzip.compress(json.dumps(events(300, seed=41)).encode())
    status, _, answer, sock = raw_post(
        server.url,
        ["Content-Type: application/json", "Content-Encoding: gzip", "Transfer-Encoding: chunked"],
        chunked(gz, [333]),
    )
    sock.close()
    assert status == 200 and answer["accepted"] == 300
    # http.client's own chunked encoding (an iterable body without a length)
    import http.client
    import urllib.parse

    parts = urllib.parse.urlsplit(server.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.request(
        "POST",
        "/v1/events",
        iter([body[:5000], body[5000:]]),
        {"Content-Type": "application/x-ndjson"},
        encode_chunked=True,
    )
    r = conn.getresponse()
    assert r.status == 200 and json.loads(r.read())["accepted"] == 700
    conn.close()
    assert server.service.counters.accepted - before == 700 * 3 + 300


def test_oversize_chunked_body_is_413_without_reading_it() -> None:
    opts = ServiceOptions(max_body_bytes=20_000, max_decoded_bytes=50_000)
    with running_server(options=opts) as srv:
        head = ["Content-Type: application/x-ndjson", "Transfer-Encoding: chunked"]
        body = ndjson(events(400, seed=42))
        assert len(body) > 20_000
        status, headers, answer, sock = raw_post(srv.url, head, chunked(body, [1000]))
        sock.close()
        assert status == 413 and "larger than the limit" in answer["error"] and headers.get("Connection") == "close"
        # one chunk that announces more than the limit: answered before its data is even sent
        status, headers, answer, sock = raw_post(srv.url, head, b"%x\r\n" % 20_001)
        sock.close()
        assert status == 413 and headers.get("Connection") == "close"
        # exactly the limit is fine
        small = ndjson(events(100, seed=43))
        assert len(small) < 20_000
        small = small + b"\n" * (20_000 - len(small))
        status, _, answer, sock = raw_post(srv.url, head, chunked(small, [20_000]))
        sock.close()
        assert status == 200 and answer["accepted"] == 100
        # a gzip bomb sent chunked still hits the decoded limit
        bomb = gzip.compress(b"[" + b" " * 200_000 + b"]")
        status, _, answer, sock = raw_post(
            srv.url,
            ["Content-Type: application/json", "Content-Encoding: gzip", "Transfer-Encoding: chunked"],
            chunked(bomb, [100]),
        )
        sock.close()
        assert status == 413 and "decompressed" in answer["error"]
        assert srv.service.counters.accepted == 100


def test_malformed_chunked_framing_is_400(server: IngestServer) -> None:
    before = server.service.counters.accepted
    head = ["Content-Type: application/x-ndjson", "Transfer-Encoding: chunked"]
    line = ndjson(events(1, seed=44))
    bad = [
        b"zz\r\n" + line + b"\r\n0\r\n\r\n",  # not hex
        b"\r\n" + line + b"\r\n0\r\n\r\n",  # empty size
        b"-5\r\n" + line + b"\r\n0\r\n\r\n",  # signed
        b"%x\r\n" % (len(line) - 3) + line + b"0\r\n\r\n",  # data longer than announced (no CRLF)
        b"1" * 5000 + b"\r\n",  # endless size line
    ]
    for framed in bad:
        status, headers, answer, sock = raw_post(server.url, head, framed)
        sock.close()
        assert status == 400 and "chunked" in answer["error"], framed[:30]
        assert headers.get("Connection") == "close"
    status, _, answer, sock = raw_post(server.url, head + ["Content-Length: 10"], chunked(line, [50]))
    sock.close()
    assert status == 400 and "both" in answer["error"]
    status, _, answer, sock = raw_post(
        server.url, ["Content-Type: application/x-ndjson", "Transfer-Encoding: gzip, chunked"], chunked(line, [50])
    )
    sock.close()
    assert status == 501
    status, _, answer, sock = raw_post(server.url, ["Content-Type: application/x-ndjson"], b"")
    sock.close()
    assert status == 411
    assert server.service.counters.accepted == before


def test_requests_to_made_up_paths_are_counted_as_other() -> None:
    """A client's made-up paths add no series to /metrics (nor a kept counter each): they count under "other"."""
    from prometheus_client.parser import text_string_to_metric_families

    with running_server() as srv:
        for i in range(50):
            assert request(f"{srv.url}/no-such-page-{i}")[0] == 404
        text = request(srv.url + "/metrics")[2].decode()
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "drainpipe_http_requests_total"]  # fmt: skip
    assert not [s for s in samples if s.labels["path"].startswith("/no-such-page")]
    assert sum(s.value for s in samples if s.labels == {"path": "other", "status": "404"}) == 50

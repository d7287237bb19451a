"""Parser processes: bodies decoded in another process give the same answers as in process (accepted, rejects,
400/413 errors), a parser killed mid-service is replaced without failing a request, and the parsers start only when
a body needs one."""

from __future__ import annotations

import gzip
import json
import os
import signal
import time

from server_testlib import events, ndjson, post_events, request, running_server, stored_event_count

from drainpipe.server.bodies import INLINE_BYTES, BodyDecoder, decode_body


def test_a_parser_process_decodes_like_the_request_thread() -> None:
    decoder = BodyDecoder(1)
    assert decoder.wait_up()
    try:
        good = events(300, seed=1)
        body = ndjson(good + [{"ts": 1, "service": ""}]) + b"not json\n"
        assert len(body) > INLINE_BYTES  # goes to the parser
        kwargs = dict(form="ndjson", gzipped=False, max_decoded=1 << 26, max_events=10_000)
        here_batch, here_rejects = decode_body(body, **kwargs)
        there_batch, there_rejects = decoder.decode(body, **kwargs)
        assert there_batch == here_batch and there_rejects == here_rejects and len(there_rejects) == 2
        zipped = gzip.compress(json.dumps(good).encode())
        batch, _ = decoder.decode(zipped + b"\0" * INLINE_BYTES, **(kwargs | {"form": "array", "gzipped": True}))
        assert batch.num_rows == 300
        for bad, status in ((b"[" + b" " * INLINE_BYTES, 400), (body, 413)):
            try:
                decoder.decode(
                    bad, **(kwargs | {"form": "array" if bad.startswith(b"[") else "ndjson", "max_events": 10})
                )
            except Exception as exc:  # BadBody, raised in this thread with the parser's status and message
                assert getattr(exc, "status", None) == status, exc
            else:
                raise AssertionError("no error")
    finally:
        decoder.close()


def test_a_killed_parser_is_replaced_and_no_request_fails(tmp_path) -> None:
    url = f"duckdb:///{tmp_path / 'p.duckdb'}"
    decoder = BodyDecoder(2)
    assert decoder.wait_up()
    with running_server(store_url=url, decoder=decoder) as srv:
        total = 0
        for i in range(12):
            if i == 4:
                os.kill(decoder.parser_processes[0].pid, signal.SIGKILL)
            status, _, body = post_events(srv.url, events(400, seed=i), kind="ndjson")
            assert status == 200, body
            total += body["accepted"]
        assert decoder.restarts == 1
        assert request(srv.url + "/healthz")[0] == 200
    assert stored_event_count(url) == total == 12 * 400


def test_closing_the_parsers_stops_each_at_once() -> None:
    """Each parser is told to stop and returns (a shutdown of `drainpipe serve` had waited 5 s per parser, when
    forked parsers held copies of each other's sockets); and the pool's spawner thread, whose children they are
    (they die with it), ends only after them: none is killed."""
    import time

    decoder = BodyDecoder(3)
    assert decoder.wait_up()
    body = ndjson(events(300, seed=2))
    kwargs = dict(form="ndjson", gzipped=False, max_decoded=1 << 26, max_events=10_000)
    for _ in range(3):
        assert decoder.decode(body, **kwargs)[0].num_rows == 300
    processes = decoder.parser_processes
    t0 = time.monotonic()
    decoder.close()
    assert time.monotonic() - t0 < 2.5
    assert [p.exitcode for p in processes] == [0, 0, 0]  # each returned; none was killed


def test_an_otlp_export_keeps_its_exit_rows_through_a_parser_process() -> None:
    """An OTLP export's CLIENT spans with statements are exit rows after its requests: the batch crosses to and from
    the parser process with its request count (EventBatch.encode)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    export = ExportTraceServiceRequest()
    resource = export.resource_spans.add()
    resource.resource.attributes.add(key="service.name").value.string_value = "shop"
    spans = resource.scope_spans.add().spans
    end = int(time.time() * 1e9)
    for i in range(1, 400):
        kind = 3 if i % 3 == 0 else 2  # every third a CLIENT span with a statement
        span = spans.add(trace_id=i.to_bytes(16, "big"), span_id=i.to_bytes(8, "big"), name=f"GET /p{i % 5}",
                         kind=kind, start_time_unix_nano=end - 5_000_000, end_time_unix_nano=end)  # fmt: skip
        if kind == 3:
            span.attributes.add(key="db.statement").value.string_value = f"SELECT {i % 4}"
    body = export.SerializeToString()
    assert len(body) > INLINE_BYTES  # goes to the parser
    kwargs = dict(form="otlp-protobuf", gzipped=False, max_decoded=1 << 26, max_events=10_000)
    here, _ = decode_body(body, **kwargs)
    decoder = BodyDecoder(1)
    assert decoder.wait_up()
    try:
        there, _ = decoder.decode(body, **kwargs)
    finally:
        decoder.close()
    assert here.requests == 266 < here.num_rows == 399
    assert there == here


def _server_spans(n: int, seed: int) -> bytes:
    """An OTLP protobuf export of ``n`` SERVER spans ending now."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    export = ExportTraceServiceRequest()
    resource = export.resource_spans.add()
    resource.resource.attributes.add(key="service.name").value.string_value = f"otlp-{seed}"
    spans = resource.scope_spans.add().spans
    end = int(time.time() * 1e9)
    for i in range(n):
        spans.add(trace_id=(seed * n + i + 1).to_bytes(16, "big"), span_id=(i + 1).to_bytes(8, "big"),
                  name=f"GET /p{i % 5}", kind=2, start_time_unix_nano=end - 5_000_000, end_time_unix_nano=end)  # fmt: skip
    return export.SerializeToString()


def test_the_parsers_start_with_the_first_json_body_and_bodies_before_they_are_up_are_decoded_here(tmp_path) -> None:
    """A server of OTLP protobuf traffic (decoded natively on the intake thread) runs no parser process; the first
    JSON body starts them, and the bodies that come while they start are decoded in the server process: every event
    stored once."""
    url = f"duckdb:///{tmp_path / 'lazy.duckdb'}"
    decoder = BodyDecoder(2)
    with running_server(store_url=url, decoder=decoder) as srv:
        for i in range(5):
            status, _, _ = request(srv.url + "/v1/traces", "POST", _server_spans(50, i),
                                   {"Content-Type": "application/x-protobuf"})  # fmt: skip
            assert status == 200
        assert decoder.parser_processes == []  # OTLP traffic never needed one
        total = 5 * 50
        for i in range(6):  # the first starts them; each is answered, whether they are up by then or not
            status, _, body = post_events(srv.url, events(400, seed=i), kind="ndjson")
            assert status == 200, body
            total += body["accepted"]
        assert decoder.wait_up(60) and len(decoder.parser_processes) == 2
        status, _, body = post_events(srv.url, events(400, seed=99), kind="ndjson")  # through a parser now
        assert status == 200, body
        total += body["accepted"]
        assert decoder.restarts == 0
    assert stored_event_count(url) == total == 5 * 50 + 7 * 400

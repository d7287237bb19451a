"""Fixtures of real-world telemetry files: nginx and Apache access logs (combined format plus the request time) and
OTLP JSON trace files (one ExportTraceServiceRequest per line, as the OpenTelemetry Collector's file exporter writes
them), each with malformed lines, and what a correct reader makes of them."""

from __future__ import annotations

import base64
import gzip
import json
import random
import time
from pathlib import Path

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from testlib import TRACE_STATES, adjusted_count

MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
PATHS = ["/", "/users/{n}", "/orders/{n}/items", "/files/{uuid}", "/static/app.js", "/blob/{hex}"]


def _write_lines(path: Path, lines: list[str]) -> None:
    """One line each, gzipped when the name ends in .gz."""
    text = "\n".join(lines) + "\n"
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)


def _clf_time(ts_ms: int) -> str:
    t = time.gmtime(ts_ms // 1000)
    return f"{t.tm_mday:02d}/{MONTHS[t.tm_mon - 1]}/{t.tm_year}:{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} +0000"


def access_log(path: Path, flavor: str, n: int, seed: int, base_ms: int) -> list[tuple[int, str, float, bool]]:
    """Write ``n`` requests (plus malformed lines) in ``flavor`` (nginx | apache) format; return the expected
    events (ts ms, endpoint, latency ms, ok) of the valid lines."""
    rng = random.Random(seed)
    lines, expected = [], []
    for i in range(n):
        ts = base_ms + rng.randrange(0, 3 * 60_000) // 1000 * 1000  # CLF has second resolution
        template = rng.choice(PATHS)
        raw = (template.replace("{n}", str(rng.randrange(1, 10**6)))
               .replace("{uuid}", "3f2b8c4e-1d2a-4b6c-9e8f-0a1b2c3d4e5f").replace("{hex}", "deadbeefcafebabe1234"))  # fmt: skip
        endpoint_path = template.replace("{n}", "{id}").replace("{uuid}", "{id}").replace("{hex}", "{id}")
        method = rng.choice(["GET", "GET", "POST"])
        status = rng.choice([200, 200, 200, 201, 304, 404, 500, 503])
        ms = rng.randrange(1, 3000)
        rt = f"{ms / 1000:.3f}" if flavor == "nginx" else str(ms * 1000)
        lines.append(f'10.0.0.{i % 250} - - [{_clf_time(ts)}] "{method} {raw}?q={i} HTTP/1.1" {status} {i} '
                     f'"-" "Mozilla/5.0 (X11)" {rt}')  # fmt: skip
        expected.append((ts, f"{method} {endpoint_path}", float(ms), status < 500))
        if i % 97 == 5:
            lines.append("this is not an access log line")
        if i % 131 == 7:
            lines.append('10.0.0.1 - - [32/Foo/2026:99:00:00 +0000] "GET / HTTP/1.1" 200 1 "-" "x" 0.001')
    _write_lines(path, lines)
    return expected


def otlp_file(path: Path, seed: int, base_ms: int, exports: int = 20, spans: int = 30) -> dict[str, int]:
    """Write ``exports`` OTLP JSON lines of SERVER/INTERNAL/CLIENT spans (plus a malformed line, a span that ends
    before it starts, and SERVER spans whose ids are odd: a 64-bit trace id, none, a span id of 4 bytes, which are
    requests all the same; the SERVER spans sampled as :data:`~testlib.TRACE_STATES` say); return the expected
    request count per service (the spans' adjusted counts)."""
    rng = random.Random(seed)
    counts: dict[str, int] = {}
    lines = []
    for e in range(exports):
        request = ExportTraceServiceRequest()
        service = f"svc{e % 3}"
        rs = request.resource_spans.add()
        rs.resource.attributes.add(key="service.name").value.string_value = service
        rs.resource.attributes.add(key="host.name").value.string_value = f"host{e % 2}"
        scope = rs.scope_spans.add()
        for i in range(spans):
            start = (base_ms + rng.randrange(0, 120_000)) * 1_000_000
            kind = rng.choice([1, 2, 2, 3])
            span = scope.spans.add(trace_id=rng.randbytes(15) + b"\1", span_id=rng.randbytes(7) + b"\1",
                                   name=f"GET /users/{rng.randrange(100)}", kind=kind, start_time_unix_nano=start,
                                   end_time_unix_nano=start + rng.randrange(1, 900) * 1_000_000)  # fmt: skip
            if kind == 2:  # a request, sampled or not (its adjusted count)
                span.trace_state = TRACE_STATES[i % len(TRACE_STATES)]
                counts[service] = counts.get(service, 0) + adjusted_count(span.trace_state, span.span_id)
                if i % 2:
                    span.attributes.add(key="http.route").value.string_value = "/users/:id"
                if i % 7 == 0:
                    span.status.code = 2
            if kind == 3:
                span.attributes.add(key="db.query.text").value.string_value = f"SELECT {i % 4} FROM t"
        if e == 3:  # a span that ends before it starts: rejected, the rest of the line is kept
            bad = scope.spans.add(trace_id=b"\2" * 16, span_id=b"\3" * 8, name="GET /", kind=2,
                                  start_time_unix_nano=base_ms * 1_000_000 + 10, end_time_unix_nano=base_ms * 1_000_000)  # fmt: skip
            assert bad.kind == 2
        if e == 4:  # odd ids never cost a request: a 64-bit trace id (kept, padded), none, a short span id
            state = TRACE_STATES[-1]  # (a rounded count: a span id that cannot be used rounds as an id of zeros)
            for trace_id, span_id in ((b"\0\0\0\6m\xea2-", b"\5" * 8), (b"", b"\6" * 8), (b"\7" * 16, b"\5" * 4)):
                end = (base_ms + 60_000) * 1_000_000
                scope.spans.add(trace_id=trace_id, span_id=span_id, name="GET /odd/1", kind=2, trace_state=state,
                                start_time_unix_nano=end - 2_000_000, end_time_unix_nano=end)  # fmt: skip
                counts[service] += adjusted_count(state, span_id if len(span_id) == 8 else bytes(8))
        document = json_format.MessageToDict(request)
        for r in document["resourceSpans"]:
            for s in r["scopeSpans"]:
                for span in s["spans"]:
                    for key in ("traceId", "spanId"):
                        span[key] = base64.b64decode(span.get(key, "")).hex()
        lines.append(json.dumps(document))
        if e == 5:
            lines.append('{"resourceSpans": [')  # a truncated line
    _write_lines(path, lines)
    return counts

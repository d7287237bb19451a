"""Exports (and OTLP JSON lines) whose events do not fit Arrow's 32-bit string offsets: the C passes raise
OverflowError rather than wrap, and the exports are decoded half by half until the one too large alone is rejected
whole with its reason, every other one's events kept, rejects numbered as before. The real overflow (2 GiB of text)
is exercised once, in tests/server/test_proto_groups.py; here it is simulated, so the numbering is checked cheaply."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from drainpipe.inputs import EventBatch, span_events
from drainpipe.inputs.formats import otlp_format
from drainpipe.inputs.options import InputOptions
from drainpipe.inputs.otlp import decode_proto_exports
from drainpipe.inputs.span_events import TOO_LARGE, decode_halves
from testlib import event_batch, row


@settings(max_examples=200, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=40), st.integers(1, 40))
def test_halves_keep_every_item_that_fits_and_reject_each_that_does_not_alone(huge: list[bool], fits: int) -> None:
    """``decode(lo, hi)`` overflows when its range holds a huge item or more than ``fits`` items (their sum too
    large): the result is every other item's events, in order, and one reject per huge item, in order."""
    calls: list[tuple[int, int]] = []

    def decode(lo: int, hi: int) -> tuple[EventBatch, list]:
        calls.append((lo, hi))
        if any(huge[lo:hi]) or hi - lo > fits:
            raise OverflowError("more than 2 GiB of text in one column")
        rows = [row(service=f"s{i}") for i in range(lo, hi)]
        return EventBatch.of(event_batch(rows)), [(i, {"span": 0}, "odd") for i in range(lo, hi) if i % 3 == 0]

    try:  # as the callers do: the whole range first, halves once it overflows
        batch, rejects = decode(0, len(huge))
    except OverflowError:
        batch, rejects = decode_halves(0, len(huge), decode, lambda i: f"raw{i}")
    kept = [i for i, h in enumerate(huge) if not h]
    assert batch.rows["service"].to_pylist() == [f"s{i}" for i in kept]
    expected = sorted([(i, f"raw{i}", TOO_LARGE) for i, h in enumerate(huge) if h]
                      + [(i, {"span": 0}, "odd") for i in kept if i % 3 == 0], key=lambda r: r[0])  # fmt: skip
    assert rejects == expected
    assert all(hi - lo >= 1 for lo, hi in calls)


def _proto(service: str) -> bytes:
    request = ExportTraceServiceRequest()
    resource = request.resource_spans.add()
    resource.resource.attributes.add(key="service.name").value.string_value = service
    resource.scope_spans.add().spans.add(trace_id=bytes(range(1, 17)), span_id=bytes(range(1, 9)), name="GET /x",
                                         kind=2, start_time_unix_nano=10**18, end_time_unix_nano=10**18 + 10**6)  # fmt: skip
    return request.SerializeToString()


def _overflowing(real, marker: bytes):
    """A pass that raises as the C pass does past 2 GiB of text when its input holds ``marker``."""

    def mapped(data, *args):
        exports = data if isinstance(data, list) else [data]
        if any(marker in bytes(e) for e in exports):
            raise OverflowError("more than 2 GiB of text in one column")
        return real(data, *args)

    return mapped


def test_a_protobuf_export_too_large_alone_is_rejected_with_its_index_and_the_others_kept(monkeypatch) -> None:
    import drainpipe.inputs.otlp as otlp_module

    monkeypatch.setattr(otlp_module, "map_proto_exports", _overflowing(span_events.map_proto_exports, b"HUGE"))
    exports = [_proto(name) for name in ("a", "b", "HUGE", "c", "HUGE")] + [b"\xff\xff"]  # the last: no protobuf
    batch, bad = decode_proto_exports(exports, InputOptions())
    assert sorted(batch.rows["service"].to_pylist()) == ["a", "b", "c"]
    assert [(k, reason) for k, _, reason in bad[:2]] == [(2, TOO_LARGE), (4, TOO_LARGE)]
    assert [k for k, _, _ in bad] == [2, 4, 5] and bad[2][2].startswith("invalid OTLP protobuf")


def test_an_otlp_json_line_too_large_alone_is_rejected_with_its_line_number_and_the_others_kept(monkeypatch) -> None:
    monkeypatch.setattr(otlp_format, "map_json_block", _overflowing(span_events.map_json_block, b"HUGE"))

    def line(service: str) -> bytes:
        return json.dumps({"resourceSpans": [{"resource": {"attributes": [
            {"key": "service.name", "value": {"stringValue": service}}]}, "scopeSpans": [{"spans": [
            {"traceId": "0102030405060708090a0b0c0d0e0f10", "spanId": "0102030405060708", "name": "GET /x",
             "kind": 2, "startTimeUnixNano": "1000000000000000000", "endTimeUnixNano": "1000000001000000000"}]}]}]}
        ).encode() + b"\n"  # fmt: skip

    lines = [line(name) for name in ("a", "HUGE", "b", "c", "HUGE", "d")] + [b"not json\n"]
    batch, bad = otlp_format.decode_block(b"".join(lines), len(lines), 10, InputOptions())
    assert sorted(batch.rows["service"].to_pylist()) == ["a", "b", "c", "d"]
    assert bad == [(12, lines[1], TOO_LARGE), (15, lines[4], TOO_LARGE), (17, lines[6], "invalid JSON")]  # lines 11..


def test_an_otlp_json_export_too_large_keeps_its_reason_where_exports_are_read_whole(monkeypatch) -> None:
    """Bodies and Kafka values of OTLP JSON are read as one block; a whole-export reject is given the reference's
    reason, by decoding the export again, which for one too large overflowed once more (ArrowInvalid escaped: a
    Kafka message failed at every read, serve's 413 never came). Its reason is kept."""
    monkeypatch.setattr(otlp_format, "map_json_block", _overflowing(span_events.map_json_block, b"HUGE"))
    line = json.dumps({"resourceSpans": [{"resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": "HUGE"}}]}}]}).encode()  # fmt: skip
    batch, bad = otlp_format.decode_exports([line], InputOptions())
    assert batch.num_rows == 0 and bad == [(0, line, TOO_LARGE)]


def test_the_python_mapping_says_overflow_as_the_c_passes_do(monkeypatch) -> None:
    """Where the C pass declines an export (or is off), the mapping in pyarrow overflows as ArrowInvalid or
    ArrowCapacityError ("overflowed binary array capacity"): it is raised as OverflowError, which the halving
    catches; other Arrow errors pass as they are."""
    import pyarrow as pa

    def failing(message: str, kind: type[Exception]):
        def fail(*args, **kwargs):
            raise kind(message)

        return fail

    monkeypatch.setattr(
        span_events, "_map_columns", failing("Take operation overflowed binary array capacity", pa.ArrowInvalid)
    )
    with pytest.raises(OverflowError, match="2 GiB"):
        span_events.map_columns(None, None, None)  # type: ignore[arg-type]
    monkeypatch.setattr(span_events, "_map_columns", failing("offset overflow", pa.ArrowCapacityError))
    with pytest.raises(OverflowError):
        span_events.map_columns(None, None, None)  # type: ignore[arg-type]
    monkeypatch.setattr(span_events, "_map_columns", failing("some other invalid input", pa.ArrowInvalid))
    with pytest.raises(pa.ArrowInvalid):
        span_events.map_columns(None, None, None)  # type: ignore[arg-type]

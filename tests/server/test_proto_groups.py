"""A group of OTLP protobuf bodies decoded in one native pass (``decode_proto_bodies``, the intake's) gives each body
exactly what decoding it alone gives (``decode_body``): the same events, accepted count, rejects with their
reasons, warnings, and the same 400/413 for a bad or oversized body, over fuzzed exports (see ``otlp_exports``),
gzipped bodies, corrupt gzip and bodies over the limits. Groups the pass takes whole are most of them, and those
where it cannot attribute something per body (a declined export, a warning, a body over ``max_events``) are decoded
a body at a time: both kinds are checked."""

from __future__ import annotations

import gzip
import random
from typing import Any

import pyarrow as pa

from drainpipe.errors import BadBody
from drainpipe.inputs import EventBatch
from drainpipe.inputs.span_events import map_proto_exports
from drainpipe.inputs.spans import SpanMapping
from drainpipe.server import bodies as bodies_module
from drainpipe.server.bodies import Decoded, decode_body, decode_proto_bodies
from otlp_exports import fuzzed_export

MAX_DECODED = 4_000


def _rows(batch: EventBatch) -> tuple[list, int]:
    """The rows, sorted, a missing weight as 1 and a missing trace id as None (a group's batch has those columns
    where any body has them); and how many are requests."""
    rows = []
    for i, r in enumerate(pa.Table.from_batches([batch.rows]).to_pylist()):
        kind = "request" if i < batch.requests else "exit"
        rows.append((kind, *(r[c] for c in batch.rows.schema.names[:7]), r.get("weight") or 1, r.get("trace_id")))
    return sorted(rows, key=repr), batch.requests


def _alone(bodies: list[tuple[bytes, bool]], max_events: int, spans: SpanMapping) -> tuple[EventBatch, list[Any]]:
    batches, out = [], []
    for body, gzipped in bodies:
        try:
            batch, rejects = decode_body(body, form="otlp-protobuf", gzipped=gzipped, max_decoded=MAX_DECODED,
                                         max_events=max_events, spans=spans)  # fmt: skip
        except BadBody as exc:
            out.append((exc.status, exc.message))
            continue
        out.append(Decoded.of(batch, rejects))
        batches.append(batch)
    return EventBatch.join(batches), out


def _body(rng: random.Random, clean: list[bytes]) -> tuple[bytes, bool]:
    export = rng.choice(clean) if clean and rng.random() < 0.8 else fuzzed_export(rng)
    roll = rng.random()
    if roll < 0.15:
        return gzip.compress(export), True
    if roll < 0.18:
        return gzip.compress(export)[:-5], True  # truncated gzip: 400
    if roll < 0.2:
        return export + b"\x00" * MAX_DECODED, False  # over the limit: 413
    return export, False


def test_a_group_gives_each_body_what_it_gets_alone() -> None:
    assert _whole_groups(random.Random(57)) > 50  # the one pass was taken (and held to the bodies alone) that often


def test_a_group_larger_than_a_pass_is_decoded_a_run_at_a_time_with_the_same_answers(monkeypatch) -> None:
    """A pass takes at most PASS_BYTES of decoded bodies (gzip bodies may each decode to the limit): a group beyond
    it is decoded in runs, each body answered as alone."""
    monkeypatch.setattr(bodies_module, "PASS_BYTES", 300)
    _whole_groups(random.Random(58))


def _whole_groups(rng: random.Random) -> int:
    """300 groups, each body's outcome and the group's events held to decoding each body alone; how many groups
    the pass took whole."""
    # exports the pass takes alone without a warning: groups of these go through the one pass
    clean = []
    while len(clean) < 60:
        export = fuzzed_export(rng)
        mapped = map_proto_exports([export], SpanMapping(), _endpoints())
        if mapped is not None and not mapped.declined and not mapped.events.warnings and mapped.events.num_rows:
            clean.append(export)
    whole = 0
    for n in range(300):
        spans = SpanMapping(trace_ids=n % 3 == 0)
        bodies = [_body(rng, clean) for _ in range(rng.randrange(1, 9))]
        max_events = rng.choice([1, 2, 10_000, 10_000])  # (the exports the pass takes hold 1-3 events)
        batches, outcomes = decode_proto_bodies(bodies, max_decoded=MAX_DECODED, max_events=max_events, spans=spans)
        batch = EventBatch.join(batches)
        ref_batch, ref = _alone(bodies, max_events, spans)
        got = [(o.status, o.message) if isinstance(o, BadBody) else o for o in outcomes]
        assert got == ref, bodies
        assert _rows(batch) == _rows(ref_batch), bodies
        assert dict(batch.warnings) == dict(ref_batch.warnings)
        exports = [b for b, z in bodies if not z and len(b) <= MAX_DECODED]
        mapped = map_proto_exports(exports, spans, _endpoints()) if len(exports) == len(bodies) > 1 else None
        whole += mapped is not None and not mapped.declined and not mapped.events.warnings
    return whole


def _endpoints() -> Any:
    from drainpipe.inputs.endpoints import EndpointRules

    return EndpointRules()


def _export(spans: int, service: str) -> bytes:
    """One export of ``spans`` SERVER spans of one resource whose service name is ``service``."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest()
    resource = request.resource_spans.add()
    resource.resource.attributes.add(key="service.name").value.string_value = service
    scope = resource.scope_spans.add()
    for i in range(spans):
        scope.spans.add(trace_id=(i + 1).to_bytes(16, "big"), span_id=(i + 1).to_bytes(8, "big"), name="GET /x",
                        kind=2, start_time_unix_nano=10**18, end_time_unix_nano=10**18 + 1_000_000)  # fmt: skip
    return request.SerializeToString()


def test_a_body_whose_events_pass_2_gib_of_text_is_413_and_the_rest_of_its_group_is_logged() -> None:
    """An 11 MB export repeating an 11 KB service name on each of 200,000 spans asks for 2.2 GB of service text in
    one column: the C pass refuses to wrap its 32-bit offsets (OverflowError), the group is decoded a body at a
    time, and that body alone is answered 413; its neighbours' events are kept, none dropped (the reviewer's case
    was three such bodies failing the whole group, and a join past 2 GiB keeping its first chunk only)."""
    small = _export(3, "small")
    big = _export(200_000, "s" * 11_000)
    batches, outcomes = decode_proto_bodies([(small, False), (big, False), (small, False)],
                                            max_decoded=64 << 20, max_events=200_000)  # fmt: skip
    assert isinstance(outcomes[1], BadBody) and outcomes[1].status == 413, outcomes[1]
    assert "too large" in outcomes[1].message
    assert [o.accepted for o in (outcomes[0], outcomes[2])] == [3, 3]
    assert sum(b.requests for b in batches) == 6 and {s for b in batches for s in b.rows["service"].to_pylist()} == {
        "small"
    }


def test_a_body_whose_events_pass_the_request_bound_is_413_alone_in_its_group(monkeypatch) -> None:
    """A request's events are bounded (MAX_EVENT_BYTES, under the log's 1 GiB record): here made small, a group
    whose pass is over it is decoded a body at a time, and only the body over it alone is answered 413."""
    small, large = _export(3, "a"), _export(3, "b" * 2_000)
    monkeypatch.setattr(bodies_module, "MAX_EVENT_BYTES", 3_000)
    batches, outcomes = decode_proto_bodies([(small, False), (large, False), (small, False)],
                                            max_decoded=64 << 20, max_events=200_000)  # fmt: skip
    assert [getattr(o, "status", None) for o in outcomes] == [None, 413, None]
    assert "more than 3,000" in outcomes[1].message
    assert sum(b.requests for b in batches) == 6

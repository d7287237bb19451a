"""The event batch's request-row mark: a batch whose first N rows are requests and whose other rows are *exit rows*
(calls a service made, such as a CLIENT span's database statement, which feed only the top-Ns keyed on
``db_statement``), and joining and shipping such batches."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from .schema import EVENT_SCHEMA

__all__ = ["REQUESTS_KEY", "with_exits", "mark_requests", "batch_from_ipc", "request_rows", "join_events"]


#: Schema metadata key of a batch whose first N rows are requests and whose other rows are *exit rows*: calls a
#: service made (a CLIENT span's database statement), which feed only the top-Ns keyed on ``db_statement``.
REQUESTS_KEY = b"drainpipe.requests"


def with_exits(requests: pa.RecordBatch, exits: pa.RecordBatch) -> pa.RecordBatch:
    """One batch: ``requests`` rows, then ``exits`` rows, marked (see :data:`REQUESTS_KEY`)."""
    if exits.num_rows == 0:
        return requests
    joined = pa.Table.from_batches([requests, exits]).combine_chunks().to_batches()[0]
    return mark_requests(joined, requests.num_rows)


def mark_requests(batch: pa.RecordBatch, requests: int) -> pa.RecordBatch:
    """``batch``, whose first ``requests`` rows are requests and the others exit rows, marked as such (unmarked
    when all of them are requests)."""
    if requests == batch.num_rows:
        return batch
    return batch.replace_schema_metadata({REQUESTS_KEY: str(requests).encode()})


def batch_from_ipc(message: bytes | memoryview | pa.Buffer, requests: int) -> pa.RecordBatch:
    """An :data:`EVENT_SCHEMA` batch from an Arrow IPC message (``batch.serialize()``) and its request row count
    (:func:`request_rows`, which another process sends beside the message: the mark is schema metadata, which the
    message does not carry). Zero-copy: the batch holds on to ``message``."""
    return mark_requests(pa.ipc.read_record_batch(pa.py_buffer(message), EVENT_SCHEMA), requests)


def request_rows(batch: pa.RecordBatch | pa.Table) -> int:
    """How many leading rows of ``batch`` are requests (all of them unless it is marked)."""
    meta = batch.schema.metadata
    if meta is None or REQUESTS_KEY not in meta:
        return batch.num_rows
    return int(meta[REQUESTS_KEY])


def join_events(batches: Sequence[pa.RecordBatch]) -> pa.RecordBatch:
    """Batches -> one batch (requests of all first, then exit rows of all, marked if there are any)."""
    if len(batches) == 1:
        return batches[0]
    heads = [b.slice(0, request_rows(b)) for b in batches]
    tails = [b.slice(request_rows(b)) for b in batches if request_rows(b) < b.num_rows]
    plain = [h.replace_schema_metadata(None) for h in heads]
    requests = pa.Table.from_batches(plain, schema=EVENT_SCHEMA).combine_chunks().to_batches()
    req = requests[0] if requests else pa.RecordBatch.from_pylist([], schema=EVENT_SCHEMA)
    if not tails:
        return req
    exits = pa.Table.from_batches([t.replace_schema_metadata(None) for t in tails], schema=EVENT_SCHEMA)
    return with_exits(req, exits.combine_chunks().to_batches()[0])

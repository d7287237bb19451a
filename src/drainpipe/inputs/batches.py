"""The event batch: validated events in :data:`~.schema.EVENT_SCHEMA` columns and how many of them are requests.

Every reader gives :class:`EventBatch` values and every consumer takes them: the engine's front door
(``LocalEngine.ingest``), the aggregation (``aggregate_batch``), the serve write-ahead log, and the channels to the
parser and aggregator processes, which all ship a batch in one encoding (:meth:`EventBatch.encode`,
:meth:`EventBatch.decode`).

The first :attr:`EventBatch.requests` rows are requests; the others are *exit rows*: calls a service made (a
CLIENT span's database statement), which feed only the top-Ns keyed on ``db_statement``. A batch from a format
without exit rows (JSON Lines, CSV, Parquet, access logs) has ``requests == rows.num_rows``.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from .schema import EVENT_SCHEMA

__all__ = ["EventBatch"]

_EXITS = b"DPX1"  # an encoding that starts so holds a batch with exit rows: <N requests u64><IPC message>
_REQUESTS = struct.Struct("<Q")


@dataclass(frozen=True, slots=True)
class EventBatch:
    """``rows`` (:data:`~.schema.EVENT_SCHEMA` columns; the workers' Parquet strings may be dictionary-encoded) of
    which the first ``requests`` are requests and the rest exit rows. Immutable; safe to share between threads."""

    rows: pa.RecordBatch
    requests: int

    @classmethod
    def of(cls, rows: pa.RecordBatch | pa.Table) -> EventBatch:
        """A batch of requests only (a table is combined into one batch)."""
        if isinstance(rows, pa.Table):
            rows = rows.combine_chunks().to_batches()[0] if rows.num_rows else _empty()
        return cls(rows, rows.num_rows)

    @classmethod
    def empty(cls) -> EventBatch:
        """A batch of no rows."""
        return cls(_empty(), 0)

    @classmethod
    def with_exits(cls, requests: pa.RecordBatch, exits: pa.RecordBatch) -> EventBatch:
        """``requests`` rows, then ``exits`` rows."""
        if exits.num_rows == 0:
            return cls(requests, requests.num_rows)
        joined = pa.Table.from_batches([requests, exits]).combine_chunks().to_batches()[0]
        return cls(joined, requests.num_rows)

    @classmethod
    def join(cls, batches: Sequence[EventBatch]) -> EventBatch:
        """One batch: the requests of all, then the exit rows of all (none: an empty batch)."""
        if len(batches) == 1:
            return batches[0]
        heads = [b.rows.slice(0, b.requests) for b in batches]
        tails = [b.rows.slice(b.requests) for b in batches if b.requests < b.rows.num_rows]
        joined = pa.Table.from_batches(heads + tails, schema=EVENT_SCHEMA).combine_chunks().to_batches()
        return cls(joined[0] if joined else _empty(), sum(b.requests for b in batches))

    @property
    def num_rows(self) -> int:
        """Requests and exit rows."""
        return self.rows.num_rows

    @property
    def exits(self) -> int:
        return self.rows.num_rows - self.requests

    def request_rows(self) -> pa.RecordBatch:
        """The requests alone (zero-copy)."""
        return self.rows if self.exits == 0 else self.rows.slice(0, self.requests)

    def encode(self) -> memoryview:
        """The batch as bytes another process or the log can :meth:`decode`: an Arrow IPC message (it starts with
        0xFFFFFFFF), prefixed with a mark and the request count when there are exit rows. (The serve log's records
        have been written in this encoding since exit rows existed: old logs decode as they are.)"""
        message = self.rows.serialize()
        if self.exits == 0:
            return memoryview(message)  # zero-copy
        return memoryview(b"".join((_EXITS, _REQUESTS.pack(self.requests), message)))

    @classmethod
    def decode(cls, payload: bytes | memoryview) -> EventBatch:
        """The batch :meth:`encode` gave; zero-copy (the batch holds on to ``payload``)."""
        view = memoryview(payload)
        if view[:4] != _EXITS:
            rows = pa.ipc.read_record_batch(pa.py_buffer(view), EVENT_SCHEMA)
            return cls(rows, rows.num_rows)
        (requests,) = _REQUESTS.unpack_from(view, 4)
        return cls(pa.ipc.read_record_batch(pa.py_buffer(view[4 + _REQUESTS.size :]), EVENT_SCHEMA), requests)


def _empty() -> pa.RecordBatch:
    """No events (built from Arrow arrays: converting Python values would make pyarrow import pandas, which the
    processes drainpipe owns keep out, see ``drainpipe.processes.hide_pandas``)."""
    return pa.RecordBatch.from_arrays([pa.nulls(0, f.type) for f in EVENT_SCHEMA], schema=EVENT_SCHEMA)

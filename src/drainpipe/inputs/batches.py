"""The event batch: validated events in :data:`~.schema.EVENT_SCHEMA` columns and how many of them are requests.

Every reader gives :class:`EventBatch` values and every consumer takes them: the engine's front door
(``LocalEngine.ingest``), the aggregation (``aggregate_batch``), the serve write-ahead log, and the channels to the
parser processes, which all ship a batch in one encoding (:meth:`EventBatch.encode`,
:meth:`EventBatch.decode`).

The first :attr:`EventBatch.requests` rows are requests; the others are *exit rows*: calls a service made (a
CLIENT span's database statement), which feed only the top-Ns keyed on ``db_statement``. A batch from a format
without exit rows (JSON Lines, CSV, Parquet, access logs) has ``requests == rows.num_rows``.

After the seven columns a batch may have optional ones (:data:`~.schema.OPTIONAL_FIELDS`): ``weight``, how many
requests each row stands for (sampled spans), and ``trace_id`` (spans, for exemplars). A batch has one only when
its events carry it, so that other traffic pays nothing for it; :meth:`EventBatch.join` gives a mixed list the
union (weight 1, trace id null where a batch had none).

A batch also carries what its reader noted about rows it accepted with a caveat (:attr:`EventBatch.warnings`, such
as a sampling threshold that could not be used), so that the counts reach the read's stats wherever the batch goes
in the process. They are not part of the encoding: a process that ships a batch ships them beside it.
"""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from .schema import EVENT_SCHEMA, OPTIONAL_FIELDS, TRACE_ID, WEIGHT, batch_schema

__all__ = ["EventBatch"]

_EXITS = b"DPX1"  # an encoding that starts so holds a batch with exit rows: <N requests u64><IPC message>
_OPTIONAL = b"DPO1"  # ... a batch with optional columns: <N requests u64><columns bitmask u64><IPC message>
_REQUESTS = struct.Struct("<Q")
_MASK = struct.Struct("<Q")
_OPTIONAL_NAMES = tuple(f.name for f in OPTIONAL_FIELDS)


@dataclass(frozen=True, slots=True)
class EventBatch:
    """``rows`` (:data:`~.schema.EVENT_SCHEMA` columns, then any optional ones; the workers' Parquet strings may be
    dictionary-encoded) of which the first ``requests`` are requests and the rest exit rows. Immutable; safe to
    share between threads."""

    rows: pa.RecordBatch
    requests: int
    warnings: tuple[tuple[str, int], ...] = ()  # (reason, accepted rows read with that caveat); not encoded
    # the bytes :meth:`decode` read the rows from (they hold on to them anyway): :meth:`encode` gives them back, so a
    # batch that crosses a process boundary and goes on (a parser's batch into the serve log) is encoded once
    # (not an argument: set by decode only, so that no batch made from another, by replace() or a constructor, can
    # carry bytes that are not its rows')
    encoding: memoryview | None = field(default=None, init=False, compare=False, repr=False)

    def __reduce__(self) -> tuple[type[EventBatch], tuple[pa.RecordBatch, int, tuple[tuple[str, int], ...]]]:
        return EventBatch, (self.rows, self.requests, self.warnings)  # (a memoryview does not pickle: not kept)

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
        """One batch: the requests of all, then the exit rows of all (none: an empty batch). Raises
        :class:`OverflowError` where they do not fit one (more than 2 GiB of text in a column)."""
        if len(batches) == 1:
            return batches[0]
        optional = {name for b in batches for name in b.optional}
        if optional:
            batches = [b.with_optional(optional) for b in batches]
        heads = [b.rows.slice(0, b.requests) for b in batches]
        tails = [b.rows.slice(b.requests) for b in batches if b.requests < b.rows.num_rows]
        joined = pa.Table.from_batches(heads + tails, schema=batch_schema(optional)).combine_chunks().to_batches()
        if len(joined) > 1:  # a column past 2 GiB of text stays in chunks: never keep the first and drop the rest
            raise OverflowError(f"{len(batches)} batches of {sum(b.rows.nbytes for b in batches):,} bytes do not fit "
                                f"one batch (more than 2 GiB of text in a column)")  # fmt: skip
        warnings: Counter[str] = Counter()
        for b in batches:
            warnings.update(dict(b.warnings))
        return cls(joined[0] if joined else _empty(), sum(b.requests for b in batches), tuple(warnings.items()))

    @property
    def optional(self) -> tuple[str, ...]:
        """The optional columns the rows have (in :data:`~.schema.OPTIONAL_FIELDS`' order)."""
        return tuple(self.rows.schema.names[len(EVENT_SCHEMA) :])

    def with_column(self, name: str, values: pa.Array) -> EventBatch:
        """This batch with ``values`` (one per row) as its optional column ``name``."""
        columns = {n: self.rows.column(n) for n in self.optional}
        columns[name] = values
        schema = batch_schema(columns)
        extra = [columns[schema.field(i).name] for i in range(len(EVENT_SCHEMA), len(schema))]
        arrays = [*(self.rows.column(i) for i in range(len(EVENT_SCHEMA))), *extra]
        return EventBatch(pa.RecordBatch.from_arrays(arrays, schema=schema), self.requests, self.warnings)

    def with_weights(self, weights: np.ndarray) -> EventBatch:
        """This batch with ``weights`` (int64, one per row, each in [1, ``WEIGHT_MAX``]) as its weight column."""
        return self.with_column(WEIGHT, pa.array(weights, pa.int64()))

    def with_optional(self, names: set[str]) -> EventBatch:
        """This batch with at least the optional columns ``names``: weight 1, trace id null where it had none."""
        batch = self
        for name in names - set(self.optional):
            ones = pa.array(np.ones(self.num_rows, np.int64))
            batch = batch.with_column(name, ones if name == WEIGHT else pa.nulls(self.num_rows, pa.binary()))
        return batch

    @property
    def weighted(self) -> bool:
        """Whether the rows have a weight column (else each weighs 1)."""
        return WEIGHT in self.optional

    def weights(self) -> np.ndarray | None:
        """Each row's weight (int64), or None when every row weighs 1 (no weight column)."""
        if not self.weighted:
            return None
        return self.rows.column(WEIGHT).to_numpy()  # (zero-copy: int64 without nulls)

    def trace_ids(self) -> pa.Array | None:
        """Each row's trace id (binary, null for none), or None when the batch has no such column."""
        return self.rows.column(TRACE_ID) if TRACE_ID in self.optional else None

    @property
    def num_rows(self) -> int:
        """Requests and exit rows."""
        return self.rows.num_rows

    @property
    def buffer_bytes(self) -> int:
        """The bytes of the buffers the rows are in: what they hold, or more for a slice of larger buffers (counted
        whole). For bounds: 0.4 us, where ``rows.nbytes`` (exact for a slice) takes 13 us."""
        return self.rows.get_total_buffer_size()

    @property
    def exits(self) -> int:
        return self.rows.num_rows - self.requests

    def request_rows(self) -> pa.RecordBatch:
        """The requests alone (zero-copy)."""
        return self.rows if self.exits == 0 else self.rows.slice(0, self.requests)

    def encode(self) -> memoryview:
        """The batch as bytes another process or the log can :meth:`decode`: an Arrow IPC message (it starts with
        0xFFFFFFFF), prefixed with a mark and the request count when there are exit rows (``DPX1``), and with the
        optional columns' bitmask too when there are any (``DPO1``). (The serve log's records have been written in
        this encoding since exit rows existed: old logs decode as they are.) A batch from :meth:`decode` gives back
        the bytes it was read from."""
        parts = self.encode_parts()
        return memoryview(parts[0]) if len(parts) == 1 else memoryview(b"".join(parts))

    def encode_parts(self) -> tuple[bytes | memoryview, ...]:
        """What :meth:`encode` gives, in parts whose concatenation it is: the prefix and the IPC message apart, for a
        writer that gathers them (the serve log: joining them was a copy of every record more)."""
        if self.encoding is not None:
            return (self.encoding,)
        message = memoryview(self.rows.serialize())
        optional = self.optional
        if optional:
            mask = sum(1 << _OPTIONAL_NAMES.index(name) for name in optional)
            return _OPTIONAL + _REQUESTS.pack(self.requests) + _MASK.pack(mask), message
        if self.exits == 0:
            return (message,)  # zero-copy
        return _EXITS + _REQUESTS.pack(self.requests), message

    @classmethod
    def decode(cls, payload: bytes | memoryview, warnings: tuple[tuple[str, int], ...] = ()) -> EventBatch:
        """The batch :meth:`encode` gave, with ``warnings`` (they travel beside the encoding); zero-copy (the batch
        holds on to ``payload``, and :meth:`encode` gives it back)."""
        view = memoryview(payload)
        mark = view[:4]
        if mark == _EXITS:
            (requests,) = _REQUESTS.unpack_from(view, 4)
            rows = pa.ipc.read_record_batch(pa.py_buffer(view[4 + _REQUESTS.size :]), EVENT_SCHEMA)
        elif mark == _OPTIONAL:
            (requests,) = _REQUESTS.unpack_from(view, 4)
            (mask,) = _MASK.unpack_from(view, 4 + _REQUESTS.size)
            schema = batch_schema(name for i, name in enumerate(_OPTIONAL_NAMES) if mask >> i & 1)
            rows = pa.ipc.read_record_batch(pa.py_buffer(view[4 + _REQUESTS.size + _MASK.size :]), schema)
        else:
            rows = pa.ipc.read_record_batch(pa.py_buffer(view), EVENT_SCHEMA)
            requests = rows.num_rows
        batch = cls(rows, requests, warnings)
        object.__setattr__(batch, "encoding", view)  # (frozen: set once, here)
        return batch


def _empty() -> pa.RecordBatch:
    """No events (built from Arrow arrays: converting Python values would make pyarrow import pandas, which the
    processes drainpipe owns keep out, see ``drainpipe.processes.hide_pandas``)."""
    return pa.RecordBatch.from_arrays([pa.nulls(0, f.type) for f in EVENT_SCHEMA], schema=EVENT_SCHEMA)

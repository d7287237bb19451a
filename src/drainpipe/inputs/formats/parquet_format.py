"""Parquet (``.parquet``): columnar, validated by the columnar core; cut into parts of whole blocks by row group
(:meth:`Parquet.plan`), every part and a whole file read by one reader that re-cuts the row groups' batches into the
same blocks of ``batch_rows`` rows."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...errors import InputError
from ..batches import EventBatch
from ..options import InputOptions
from ..part import Blocks, Part
from ..position import Position
from ..rejects import Sink
from ..schema import EVENT_SCHEMA, FIELDS, TRACE_ID
from ..validation import validate_columns, warning_counts
from .base import Format

if TYPE_CHECKING:
    import pyarrow.parquet as pq

__all__ = ["Parquet", "parquet_batch", "parquet_columns", "open_parquet"]

#: most blocks per part (a row group with more is cut into near-equal parts)
PARQUET_PART_BLOCKS = 16
_ROW_GROUP_ROWS = 1 << 20


class Parquet(Format):
    name = "parquet"
    suffixes = (".parquet",)
    gzip = False
    by_rows = True
    cost_per_byte = 2.0

    def growable(self, gzipped: bool) -> bool:
        return False

    def splits(self, gzipped: bool) -> bool:
        return True

    def plan(self, path: str, gzipped: bool, batch_rows: int, workers: int, start: Position, hasher: Any,
             options: InputOptions, nbytes: int) -> Iterator[Part]:  # fmt: skip
        """A part per row group's blocks (at most :data:`PARQUET_PART_BLOCKS` each), the last round cut finer so
        that the workers finish together."""
        return iter(_parquet_parts(path, batch_rows, start.offset, workers, nbytes))

    def read(self, part: Part, sink: Sink, dictionaries: bool) -> Blocks:
        return _parquet_blocks(part, sink, dictionaries)

    def write(self, batches: Iterable[pa.RecordBatch], path: str, gzipped: bool) -> int:
        import pyarrow.parquet as pq  # (at its first use: see open_parquet)

        rows, pending, buffered = 0, [], 0
        with pq.ParquetWriter(path, EVENT_SCHEMA, compression="zstd") as writer:
            for batch in batches:
                pending.append(batch)
                buffered += batch.num_rows
                if buffered >= _ROW_GROUP_ROWS:
                    writer.write_table(pa.Table.from_batches(pending), row_group_size=_ROW_GROUP_ROWS)
                    rows, pending, buffered = rows + buffered, [], 0
            if pending or rows == 0:
                writer.write_table(pa.Table.from_batches(pending, schema=EVENT_SCHEMA), row_group_size=_ROW_GROUP_ROWS)
                rows += buffered
        return rows


def parquet_batch(
    batch: pa.RecordBatch, offset: int, sink: Sink, keep_dictionaries: bool = False
) -> pa.RecordBatch | None:
    """The accepted rows of one raw Parquet batch (its first row is file row ``offset``), None if none.

    ``keep_dictionaries``: string columns read dictionary-encoded stay so where validation changes none of their
    values (the canonical batch then has :data:`EVENT_SCHEMA`'s columns with ``dictionary<string>`` types there),
    for a consumer that groups by them (:func:`~drainpipe.pipeline.aggregate.aggregate_batch` takes the codes as
    they are instead of decoding and hashing every string again). Else every column has its EVENT_SCHEMA type."""
    canonical, rejects, warned = validate_columns(batch, keep_dictionaries)
    if rejects is not None:
        mask, reasons = rejects
        _reject_rows(batch, mask, reasons, offset, sink)
        canonical = canonical.filter(pa.array(~mask))
    for reason, n in warning_counts(warned).items():
        sink.stats.add_warning(reason, n)
    if canonical.num_rows:
        sink.stats.add_accepted(canonical.num_rows)
        return canonical
    return None


def parquet_columns(pf: pq.ParquetFile) -> list[str] | None:
    """The event columns a Parquet file has (what the reader asks for; the optional ``trace_id`` too: hex text or
    the 16 bytes), None for none of them."""
    names = pf.schema_arrow.names
    return [name for name in FIELDS if name in names] + ([TRACE_ID] if TRACE_ID in names else []) or None


def _reject_rows(batch: pa.RecordBatch, mask: np.ndarray, reasons: list[str], offset: int, sink: Sink) -> None:
    rejected = batch.filter(pa.array(mask))
    try:
        rows = rejected.to_pylist()
    except (OverflowError, ValueError, pa.ArrowException):  # a value Python has no type for (a timestamp past year
        rows = _text_rows(rejected)  # 9999: epoch ms in a seconds column): the row as text, never a crash
    for index, row, reason in zip(np.flatnonzero(mask).tolist(), rows, reasons):
        sink.reject(offset + index + 1, row, reason)


def _text_rows(batch: pa.RecordBatch) -> list[dict[str, object]]:
    """``batch``'s rows for the dead letter, each value as Python has it or, where it has none, as text."""
    columns: dict[str, list[object]] = {}
    for name, column in zip(batch.schema.names, batch.columns):
        try:
            columns[name] = column.to_pylist()
        except (OverflowError, ValueError, pa.ArrowException):
            try:
                columns[name] = pc.cast(column, pa.string()).to_pylist()
            except pa.ArrowException:  # (no cast to text for this type)
                columns[name] = [f"<{column.type}>" if column[i].is_valid else None for i in range(len(column))]
    return [{name: values[i] for name, values in columns.items()} for i in range(batch.num_rows)]


# ------------------------------------------------------------------------------------------------ planning


def _parquet_parts(path: str, batch_rows: int, start_row: int, workers: int, nbytes: int) -> list[Part]:
    import pyarrow.parquet as pq  # (at its first use: see open_parquet)

    try:
        md = pq.ParquetFile(path).metadata
    except (OSError, pa.ArrowException) as e:
        raise InputError(f"cannot read {path!r}: {e}") from e
    sizes = [md.row_group(g).num_rows for g in range(md.num_row_groups)]
    total = sum(sizes)
    blocks = -(-total // batch_rows)
    skip = -(-start_row // batch_rows)  # blocks an earlier run applied (a resume point ends a block, or the file)
    # per row group: the blocks that start in it (a part starts at a row group's first block boundary, so a
    # reader decodes at most one batch it does not use)
    ranges: list[tuple[int, int]] = []
    begin = 0
    for rows in sizes:
        first, stop = max(skip, -(-begin // batch_rows)), min(blocks, -(-(begin + rows) // batch_rows))
        if stop > first:
            ranges.append((first, stop))
        begin += rows
    pieces: list[tuple[int, int]] = []
    for first, stop in ranges:
        pieces.extend(_cut(first, stop, -(-(stop - first) // PARQUET_PART_BLOCKS)))
    return [
        Part(
            path,
            Parquet.name,
            False,
            batch_rows,
            a,
            b - a,
            lineno=a * batch_rows,
            nbytes=nbytes * (b - a) // max(1, blocks),
            rows=total,
            by_rows=Parquet.by_rows,
        )  # fmt: skip
        for a, b in _even_tail(pieces, workers)
    ]


def _cut(first: int, stop: int, pieces: int) -> list[tuple[int, int]]:
    """Blocks ``first .. stop`` in ``pieces`` near-equal ranges (fewer when there are fewer blocks)."""
    bounds = np.linspace(first, stop, min(pieces, stop - first) + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def _even_tail(ranges: list[tuple[int, int]], workers: int) -> list[tuple[int, int]]:
    """``ranges`` (contiguous, in order) with the last round cut finer, so that the workers finish together: when
    they do not divide among the workers, the ``len % workers`` last ones are re-cut into ``workers`` near-equal
    pieces. Five row groups on two workers had left one worker idle for the whole last part (~0.27 s of a 2 s run);
    a piece that starts inside a row group pays for decoding the rows before it, a fraction of what was lost."""
    tail = len(ranges) % workers if workers > 1 else 0
    if not tail:
        return ranges
    return ranges[:-tail] + _cut(ranges[-tail][0], ranges[-1][1], workers)


# ------------------------------------------------------------------------------------------------ reading


def open_parquet(path: str) -> pq.ParquetFile:
    """A Parquet file opened for the workers' blocks. Its string columns that are stored with a dictionary are read
    as dictionary arrays (validation decodes them): decoding the pages to indices and taking each batch's strings
    from the dictionary costs less than building every string from the pages (reading and decoding 5M events:
    0.118 -> 0.087 us/event of CPU). The rows are the same; the reader then ends a batch at every row group (the
    dictionary changes), which :func:`_parquet_blocks` re-cuts anyway.

    ``pyarrow.parquet`` is imported here and in the planner and writer, not with the module: the live commands,
    which read no Parquet, would each hold 10 MB more of PSS for its library's pages (docs/performance.md)."""
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    md = pf.metadata
    if md.num_row_groups == 0:
        return pf
    stored = {md.row_group(0).column(i).path_in_schema: md.row_group(0).column(i) for i in range(md.num_columns)}
    schema = pf.schema_arrow
    wanted = [
        name
        for name in _TEXT_COLUMNS
        if name in stored
        and stored[name].has_dictionary_page
        and schema.get_field_index(name) >= 0
        and pa.types.is_string(schema.field(name).type)
    ]
    return pq.ParquetFile(path, read_dictionary=wanted, metadata=md) if wanted else pf


_TEXT_COLUMNS = tuple(f.name for f in EVENT_SCHEMA if pa.types.is_string(f.type))


def _parquet_blocks(part: Part, sink: Sink, dictionaries: bool = False) -> Blocks:
    """Blocks ``first ..`` of ``iter_batches(batch_size=batch_rows)`` over the whole file, same rows (to the file's
    end for a whole part); the position after a block is the rows read.

    ``iter_batches`` batches run across row groups, so the reader starts at the row group holding the part's first
    row and re-cuts the stream at the same row offsets."""
    size = part.batch_rows
    begin = part.first * size
    if part.blocks == 0:
        return Position(begin, begin)
    pf = open_parquet(part.path)
    starts = np.cumsum([0] + [pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)])
    group = int(np.searchsorted(starts, begin, side="right")) - 1
    skip = begin - int(starts[group])
    stream = pf.iter_batches(
        batch_size=size, row_groups=list(range(group, pf.num_row_groups)), columns=parquet_columns(pf)
    )
    pending: list[pa.RecordBatch] = []
    held = 0
    index, offset = part.first, begin
    stop = part.first + part.blocks if part.blocks >= 0 else float("inf")

    def take(rows: int) -> pa.RecordBatch:
        nonlocal pending, held
        held -= rows
        if len(pending) == 1 and pending[0].num_rows == rows:
            return pending.pop()
        table = pa.Table.from_batches(pending)
        rest = table.slice(rows)
        pending = rest.to_batches() if rest.num_rows else []
        return table.slice(0, rows).combine_chunks().to_batches()[0]

    def validated(batch: pa.RecordBatch) -> pa.RecordBatch | None:
        nonlocal offset
        canonical = parquet_batch(batch, offset, sink, dictionaries)
        offset += batch.num_rows
        return canonical

    for raw in stream:
        if skip:
            if raw.num_rows <= skip:
                skip -= raw.num_rows
                continue
            raw, skip = raw.slice(skip), 0
        pending.append(raw)
        held += raw.num_rows
        while held >= size and index < stop:
            canonical = validated(take(size))
            yield index, None if canonical is None else EventBatch.of(canonical), Position(offset, offset)
            index += 1
        if index >= stop:
            return Position(offset, offset)
    if held and index < stop:  # the file's last, short block
        canonical = validated(take(held))
        yield index, None if canonical is None else EventBatch.of(canonical), Position(offset, offset)
    return Position(offset, offset)

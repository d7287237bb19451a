"""The C extension ``drainpipe.native.spanmap``'s two functions in numpy, same arguments, same results
(``native/_spanmap.c`` states the rules): for where the extension is not there or is off (a Spark executor whose
Python or platform differs from the build's: it reads OTLP files and messages too). The property test of the span
mapping runs both.

On the ingest benchmark's exports, map_spans takes 1.5 us per request span with it, 0.9 with the C pass: some forty
numpy and pyarrow calls per export instead of one loop."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .trace_ids import trace_id_column

_NONE = np.iinfo(np.int64).max


def _bits(bitmap: Any, n: int) -> np.ndarray:
    if bitmap is None:
        return np.ones(n, bool)
    return np.unpackbits(np.frombuffer(bitmap, np.uint8), bitorder="little")[:n].astype(bool)


def _strings(offsets: Any, data: Any, n: int, kind: pa.DataType = pa.string()) -> pa.Array:
    data = pa.py_buffer(b"" if data is None else data)  # (an array of empty strings may have no data buffer)
    return pa.Array.from_buffers(kind, n, [None, pa.py_buffer(offsets), data])


def pick(owners: int, list_offsets: Any, present: Any, key_offsets: Any, key_data: Any, value_valid: Any,
         text_valid: Any, text_offsets: Any, text_data: Any, int_valid: Any, int_data: Any,
         roles: list[tuple[bytes, int, int]], fields: int, status_field: int, out_pair: Any, out_status: Any,
         /) -> None:  # fmt: skip
    offsets = np.frombuffer(list_offsets, np.int32, owners + 1)
    n = int(offsets[-1])
    owner = np.repeat(np.arange(owners), np.diff(offsets))
    usable = _bits(value_valid, n) & _bits(present, owners)[owner]
    keys = _strings(key_offsets, key_data, n)
    texts = _strings(text_offsets, text_data, n)
    text_len = np.where(_bits(text_valid, n), np.diff(np.frombuffer(text_offsets, np.int32, n + 1)), 0)
    is_int = _bits(int_valid, n)
    ints = np.frombuffer(int_data, np.int64, n) if n else np.zeros(0, np.int64)
    pairs = np.asarray(out_pair).reshape(fields, owners)
    pairs[:] = -1
    status = None
    if status_field >= 0:
        status = np.asarray(out_status)
        status[:] = -1
    for field in range(fields):
        ranks = np.full(n, _NONE, np.int64)
        for key, f, rank in roles:
            if f == field and n:
                matches = pc.equal(keys, key.decode()).to_numpy(zero_copy_only=False)
                ranks[matches] = np.minimum(ranks[matches], rank)
        if field == status_field:
            value = np.where(is_int, ints, -1)
            for i in np.flatnonzero(~is_int & (text_len > 0) & (ranks != _NONE)):
                text = texts[int(i)].as_py()
                if text.isascii() and text.isdigit():
                    value[i] = min(int(text), 1 << 62)
            suits = is_int | (value >= 0)
        else:
            suits = text_len > 0
        candidates = np.flatnonzero(usable & suits & (ranks != _NONE))
        if not len(candidates):
            continue
        # per owner, the lowest rank, the earliest among equals (a stable sort by owner, then rank)
        order = candidates[np.lexsort((ranks[candidates], owner[candidates]))]
        holder = owner[order]
        first = np.ones(len(order), bool)
        first[1:] = holder[1:] != holder[:-1]
        pairs[field, holder[first]] = order[first]
        if field == status_field and status is not None:
            status[holder[first]] = value[order[first]]


def classify(kind: Any, start: Any, end: Any, status_valid: Any, status_code: Any, tid_offsets: Any, tid_data: Any,
             sid_offsets: Any, sid_data: Any, statement: Any, http_status: Any, request_kinds: int, client: int,
             server: int, latency_max_ms: float, out_cat: Any, out_ok: Any, out_latency: Any,
             /) -> tuple[int, int]:  # fmt: skip
    kinds = np.frombuffer(kind, np.int32)
    n = len(kinds)
    starts = np.frombuffer(start, np.uint64, n)
    ends = np.frombuffer(end, np.uint64, n)
    in_range = (kinds >= 0) & (kinds < 64)
    is_request = in_range & ((np.uint64(request_kinds) >> np.where(in_range, kinds, 0).astype(np.uint64)) & 1 == 1)
    is_exit = ~is_request & (kinds == client) & (np.asarray(statement) >= 0)
    backwards = ends < starts
    latency = np.where(backwards, 0, ends - starts).astype(np.float64) / 1e6  # as Python's (end - start) / 1e6
    reason = np.select([backwards, latency > latency_max_ms], [-3, -4], 0)
    code = np.where(_bits(status_valid, n), np.frombuffer(status_code, np.int32, n), 0)
    http = np.asarray(http_status)
    ok = (code != 2) & ~((code == 0) & (kinds == server) & (http >= 500))
    mapped = is_request | is_exit
    good = mapped & (reason == 0)
    np.asarray(out_cat)[:] = np.where(mapped, np.where(reason < 0, reason, np.where(is_request, 1, 2)), 0)
    np.asarray(out_ok)[:] = good & ok
    np.asarray(out_latency)[:] = np.where(good, latency, 0.0)
    # the ids never cost a span (see _spanmap.c): the mapped ones whose ids cannot be used are counted
    _, dropped = trace_id_column(_strings(tid_offsets, tid_data, n, pa.binary()).filter(good))
    sizes = np.diff(np.frombuffer(sid_offsets, np.int32, n + 1))
    zero = pc.equal(_strings(sid_offsets, sid_data, n, pa.binary()), pa.scalar(bytes(8), pa.binary()))
    usable = (sizes == 8) & ~zero.to_numpy(zero_copy_only=False)
    return (0 if dropped is None else int(dropped.sum())), int((good & ~usable).sum())

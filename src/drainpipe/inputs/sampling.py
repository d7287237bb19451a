"""Sampled spans counted right: a span's *adjusted count* (how many requests it stands for) from OpenTelemetry
probability sampling's threshold in its W3C trace state (``ot=th:...``).

A sampler that keeps a span with probability ``p`` writes its rejection threshold ``T`` (56 bits; ``th`` holds its
leading hex digits, trailing zeros dropped), with ``p = (2^56 - T) / 2^56``. The span's adjusted count is
``1 / p = 2^56 / (2^56 - T)``: ``th:8`` counts 2, ``th:c`` 4, ``th:0`` 1.

The rules are those of the OpenTelemetry Collector's spanmetrics connector (v0.165), so that both count the same
spans the same way:

* no trace state, or none with an ``ot`` member holding ``th``: the span counts 1;
* a trace state that does not parse (W3C syntax; the ``ot`` member's syntax; an ``rv`` that is not 14 hex digits,
  a ``th`` that is not 1-14): it counts 1, and is reported as :data:`MALFORMED`;
* a power-of-two probability gives a whole count. Any other gives ``floor(1/p)`` or one more, the larger with
  probability ``frac(1/p)``: unbiased, as the connector rounds, but drawn from the span id's bits (mixed) instead of
  a random generator, so that a span counts the same each time it is read (a replay of the log, a Kafka message read
  again after a crash, either engine);
* a count above :data:`~.schema.WEIGHT_MAX` (a probability under one in four billion) counts 1, reported as
  :data:`OUT_OF_RANGE` (the connector would count it; no sum of such counts could be trusted).

A batch's trace states are parsed once per distinct value (most traffic has a handful), the rest is numpy.
"""

from __future__ import annotations

import functools
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .schema import WEIGHT_MAX

__all__ = ["MALFORMED", "OUT_OF_RANGE", "adjusted_counts", "parse_trace_state"]

MALFORMED = "malformed sampling threshold"
OUT_OF_RANGE = "sampling threshold out of range"

_BITS = 56
_WHOLE = 1 << _BITS  # the connector's MaxAdjustedCount
_HEX = frozenset("0123456789abcdefABCDEF")  # (Go's ParseUint in base 16 takes either case; int() takes more)


def parse_trace_state(text: str) -> tuple[int, int] | str | None:
    """A W3C trace state -> ``(q, cut)``: the span counts ``q``, or ``q + 1`` when its mixed span id's top 56 bits
    are below ``cut`` (0 for a whole count); None when it holds no threshold (counts 1); :data:`MALFORMED` or
    :data:`OUT_OF_RANGE` when it holds one that cannot be used (counts 1). Pure; memoized per distinct value."""
    if "ot=" not in text:
        return None
    threshold = _threshold(text)
    if isinstance(threshold, str) or threshold is None:
        return threshold
    d = _WHOLE - threshold
    q, r = divmod(_WHOLE, d)
    if q + (r > 0) > WEIGHT_MAX:
        return OUT_OF_RANGE
    return q, (r << _BITS) // d


_parsed = functools.lru_cache(maxsize=4096)(parse_trace_state)


def adjusted_counts(trace_states: pa.Array, span_ids: pa.Array, rows: np.ndarray) -> tuple[np.ndarray | None, Counter]:
    """Per row (``rows``: indexes into the spans), its span's adjusted count (int64), or None when every one counts
    1; and how many counted 1 for a threshold they could not use, by reason. ``trace_states``: each span's trace
    state (string; null or empty for none); ``span_ids``: their 8-byte ids (binary; another length reads as 0)."""
    warnings: Counter = Counter()
    if not len(rows) or _all_empty(trace_states):
        return None, warnings
    encoded = pc.dictionary_encode(trace_states.take(pa.array(rows)))
    parsed = [None if text is None else _parsed(text) for text in encoded.dictionary.to_pylist()]
    q = np.ones(len(parsed) + 1, np.int64)  # the last entry: a null trace state
    cut = np.zeros(len(parsed) + 1, np.uint64)
    for i, p in enumerate(parsed):
        if isinstance(p, tuple):
            q[i], cut[i] = p
    codes = encoded.indices.fill_null(len(parsed)).to_numpy()
    reasons = [(i, p) for i, p in enumerate(parsed) if isinstance(p, str)]
    if reasons:
        tally = np.bincount(codes, minlength=len(parsed))
        for i, reason in reasons:
            if tally[i]:
                warnings[reason] += int(tally[i])
    weights = q[codes]
    fractional = np.flatnonzero(cut[codes])
    if len(fractional):
        mixed = _mix(_ids(span_ids, rows[fractional]))
        weights[fractional] += (mixed >> np.uint64(64 - _BITS)) < cut[codes[fractional]]
    return (None if (weights == 1).all() else weights), warnings


# ----------------------------------------------------------------------------------------------- parsing


def _threshold(text: str) -> int | str | None:
    """The threshold of the last ``ot`` member (None: it has no ``th``), or :data:`MALFORMED`: the connector's
    parser (the W3C syntax first, then each member; any error fails the whole trace state)."""
    if len(text) > 1024 or not _valid_w3c(text):
        return MALFORMED
    threshold: int | str | None = None
    items, rest = 0, text
    while rest:
        items += 1
        if items >= 32:  # (the connector's limit, counted as it counts: every separated chunk)
            return MALFORMED
        member, _, rest = rest.partition(",")
        member = member.strip(" \t")
        if not member:
            continue
        key, _, value = member.partition("=")
        tenant, at, system = key.partition("@")
        if len(key) > 256 or (at and (len(tenant) > 241 or len(system) > 14)):
            return MALFORMED
        if key == "ot":
            threshold = _ot_threshold(value)
            if threshold == MALFORMED:
                return MALFORMED
    return threshold


def _ot_threshold(value: str) -> int | str | None:
    """The ``ot`` member's threshold (None: no ``th``), or :data:`MALFORMED`."""
    if len(value) > 256 or not value or value.endswith(";"):
        return MALFORMED
    threshold = None
    for member in value.split(";"):
        key, colon, field = member.partition(":")
        if not colon or not _otel_key(key) or not all(c.isascii() and (c.isalnum() or c in "._-") for c in field):
            return MALFORMED
        if key == "rv" and (len(field) != 14 or not _HEX.issuperset(field)):
            return MALFORMED
        if key == "th":
            if not 1 <= len(field) <= 14 or not _HEX.issuperset(field):
                return MALFORMED
            threshold = int(field, 16) << 4 * (14 - len(field))
    return threshold


def _otel_key(key: str) -> bool:
    return bool(key) and "a" <= key[0] <= "z" and all("a" <= c <= "z" or "0" <= c <= "9" for c in key)


_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-*/")


def _valid_w3c(text: str) -> bool:
    for member in text.split(","):
        member = member.strip(" \t")
        if not member:
            continue
        key, eq, value = member.partition("=")
        if not eq or not _w3c_key(key) or not _w3c_value(value):
            return False
    return True


def _w3c_key(key: str) -> bool:
    tenant, at, system = key.partition("@")
    if at:
        first = bool(tenant) and bool(system) and (tenant[0].isdigit() or "a" <= tenant[0] <= "z")
        return first and "a" <= system[0] <= "z" and _KEY_CHARS.issuperset(tenant + system)
    return bool(key) and "a" <= key[0] <= "z" and _KEY_CHARS.issuperset(key)


def _w3c_value(value: str) -> bool:
    if not value or len(value) > 256 or not _nonblank(value[-1]):
        return False
    return all(c == " " or _nonblank(c) for c in value[:-1])


def _nonblank(c: str) -> bool:
    return "\x21" <= c <= "\x7e" and c not in ",="


# ----------------------------------------------------------------------------------------------- rounding


def _all_empty(strings: pa.Array) -> bool:
    """No string in the array has a character (all empty or null), read from its offsets: no pass over the data."""
    offsets = strings.buffers()[1]
    if offsets is None:
        return True
    first = np.frombuffer(offsets, np.int32, 1, strings.offset * 4)[0]
    last = np.frombuffer(offsets, np.int32, 1, (strings.offset + len(strings)) * 4)[0]
    return bool(first == last)


def _ids(span_ids: pa.Array, rows: np.ndarray) -> np.ndarray:
    """The 8-byte span ids of ``rows`` as little-endian uint64; 0 for a span id that is not 8 bytes (such a span is
    mapped all the same, and rounds as the same span each time it is read)."""
    offsets = np.frombuffer(span_ids.buffers()[1], np.int32, len(span_ids) + 1, span_ids.offset * 4)
    data = span_ids.buffers()[2]
    data = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    starts = offsets[rows]
    sized = offsets[rows + 1] - starts == 8
    if not sized.all():
        data = np.concatenate([data, np.zeros(8, np.uint8)])  # (a short id at the end: nothing read past it)
        starts = np.where(sized, starts, len(data) - 8)
    return data[starts[:, None] + np.arange(8)].copy().view("<u8").ravel()


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer: span ids made by a counter (some tests, some tracers) still round without bias."""
    z = x + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))

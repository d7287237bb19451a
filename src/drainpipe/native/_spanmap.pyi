"""Typed stub of the C extension ``drainpipe.native._spanmap`` (source and its rules: ``_spanmap.c``). Buffers are
any objects with the buffer protocol (numpy arrays, pyarrow buffers); None for an absent validity bitmap."""

from typing import Any

def pick(owners: int, list_offsets: Any, present: Any, key_offsets: Any, key_data: Any, value_valid: Any,
         text_valid: Any, text_offsets: Any, text_data: Any, int_valid: Any, int_data: Any,
         roles: list[tuple[bytes, int, int]], fields: int, status_field: int, out_pair: Any, out_status: Any,
         /) -> None:  # fmt: skip
    """Per owner and field (``out_pair``: int64, fields x owners, -1 for none): the attribute of the lowest rank
    among the field's ``(key, field, rank)`` roles whose value suits the field; ``out_status`` (int64 per owner,
    -1 for none): the status field's value."""

def classify(kind: Any, start: Any, end: Any, status_valid: Any, status_code: Any, tid_offsets: Any, tid_data: Any,
             sid_offsets: Any, sid_data: Any, statement: Any, http_status: Any, request_kinds: int, client: int,
             server: int, latency_max_ms: float, out_cat: Any, out_ok: Any, out_latency: Any,
             /) -> tuple[int, int]:  # fmt: skip
    """Per span: ``out_cat`` (int8: 1 request, 2 exit row, 0 neither, -3/-4 the first check that fails),
    ``out_ok`` and ``out_latency`` (ms) of the mapped ones. Returns how many mapped spans have a trace id, and how
    many a span id, that cannot be used (they are mapped all the same)."""

"""Parts: how every engine cuts an input file into pieces of work, how a piece is read, and what a file is.

One scheme for every engine (the in-process reader, the local engine's worker processes, Spark tasks):

* A file is read as consecutive **blocks**: ``batch_rows`` lines of JSON Lines, ``batch_rows`` CSV records, or
  ``batch_rows`` rows of Parquet.
* A **part** (:class:`~.part.Part`) is a run of consecutive blocks of one file: a byte range of whole lines for
  JSON Lines, a range of blocks for Parquet, or the whole file (CSV, whose quoted fields may span lines, the line
  formats, and gzip, which cannot be entered in the middle). :func:`plan_parts` cuts a file from a
  :class:`Position` on, as its format (:mod:`.formats`) says; :func:`read_part` reads one part, anywhere (parts are
  plain picklable data), with the one reader of its format: a whole file is a part that spans it. Parts end where
  they say (:attr:`Part.end_position`), and a reader knows where it stopped (:meth:`PartReader.snapshot`), so an
  engine that applied parts up to one records how far the file is applied.
* What a file **is**: uncompressed text files can grow (logs: :func:`~.formats.growable`); they are read up to
  their last complete line, found again by a fingerprint of their head (:func:`head_of`) and checked by a hash of
  the part already applied (:func:`prefix_hasher`). Compressed files and Parquet are immutable, named by a hash of
  their content (:func:`file_identity`). :mod:`drainpipe.pipeline.progress` keeps the books.

Reading a part gives ``(block index, EventBatch)`` for each block with accepted rows; the rejects go to the
part's :class:`~drainpipe.inputs.rejects.Sink` with file line numbers (1-based physical lines for text, 1-based
rows for Parquet), the same whichever part and engine read them.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from typing import Any

from ..errors import InputError
from .formats import format_named, format_of
from .options import InputOptions
from .part import Part, PartReader
from .position import Position
from .rejects import Sink

__all__ = ["HEAD_BYTES", "file_identity", "head_of", "node_of", "prefix_hasher", "plan_parts", "whole_file",
           "read_part"]  # fmt: skip

#: a growable file's head fingerprint covers its first complete lines within this many bytes
HEAD_BYTES = 4096


def file_identity(path: str, digest: str | None = None) -> str:
    """A content fingerprint: the same bytes anywhere give the same identity (96 bits of SHA-256, hex).

    ``digest``: the file's SHA-256 hex digest if already known."""
    if digest is None:
        try:
            with open(path, "rb") as f:
                digest = hashlib.file_digest(f, "sha256").hexdigest()
        except OSError as exc:
            raise InputError(f"cannot read {path!r}: {exc.strerror or exc}") from None
    return digest[:24]


def head_of(path: str) -> str:
    """The fingerprint a file is looked up by: for a growable file, SHA-256 of its complete lines within the first
    :data:`HEAD_BYTES` bytes (appending to the file does not change it once it is that long); for an immutable
    one, its content identity. Raises :class:`InputError` if the file cannot be read."""
    fmt, gzipped = format_of(path)
    if not fmt.growable(gzipped):
        return file_identity(path)
    try:
        with open(path, "rb") as f:
            head = f.read(HEAD_BYTES)
    except OSError as exc:
        raise InputError(f"cannot read {path!r}: {exc.strerror or exc}") from None
    cut = head.rfind(b"\n")
    return hashlib.sha256(head[: cut + 1] if cut >= 0 else head).hexdigest()[:24]


def node_of(path: str) -> str:
    """``"<device>:<inode>"``: which file this is on its filesystem (a file rewritten in place keeps it, a rotated
    log's new file gets a new one)."""
    st = os.stat(path)
    return f"{st.st_dev}:{st.st_ino}"


#: hex digits of a prefix digest an earlier version stored (SHA-256); a store's digests of that length are checked,
#: and their files continued, with SHA-256
_SHA256_HEX = 64


def prefix_hasher(path: str, end: int, like: str = "") -> Any:
    """A hash object fed the first ``end`` bytes of ``path`` (fewer if the file is shorter): XXH3-128, or SHA-256
    when ``like`` (a digest to check or to continue) is one. Why XXH3: the planner hashes every byte it cuts and a
    resumed file is hashed again from its start; at ~10 GB/s against SHA-256's ~1.2 GB/s that was a sixth of a
    ``drainpipe run`` over JSON Lines, and seconds for each restart on a large log. The digest detects a file
    rewritten in place, an accident, not an adversary: 128 bits of a non-cryptographic hash suffice."""
    import xxhash  # here, not at the top: Spark executors import this module, never hash, and need not have it

    hasher = hashlib.sha256() if len(like) == _SHA256_HEX else xxhash.xxh3_128()
    try:
        with open(path, "rb") as f:
            left = end
            while left > 0:
                chunk = f.read(min(left, 8 << 20))
                if not chunk:
                    break
                hasher.update(chunk)
                left -= len(chunk)
    except OSError as exc:
        raise InputError(f"cannot read {path!r}: {exc.strerror or exc}") from None
    return hasher


# ------------------------------------------------------------------------------------------------ planning


def whole_file(
    path: str, batch_rows: int, start: Position = Position(), options: InputOptions = InputOptions()
) -> Part:
    """The part that reads ``path`` sequentially from ``start`` (a growable text file's resume point) to its end."""
    fmt, gzipped = format_of(path)
    return fmt.whole(path, gzipped, batch_rows, start, options, _size(path))


def plan_parts(
    path: str,
    batch_rows: int,
    *,
    workers: int = 2,
    start: Position = Position(),
    hasher: Any = None,
    options: InputOptions = InputOptions(),
) -> Iterator[Part]:
    """The parts of one file from ``start`` on, in file order, as its format plans them (JSON Lines: lazily, the
    newline scan keeping just ahead of the consumer; a format that does not split: one whole part). ``hasher``
    (a growable file): a hashlib object already fed the bytes before ``start``; each part records the digest of
    everything before its end (``Part.prefix``). Raises :class:`InputError` for an unreadable file."""
    fmt, gzipped = format_of(path)
    return fmt.plan(path, gzipped, batch_rows, workers, start, hasher, options, _size(path))


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError as exc:
        raise InputError(f"cannot read {path!r}: {exc.strerror or exc}") from None


# ------------------------------------------------------------------------------------------------ reading


def read_part(part: Part, sink: Sink, *, dictionaries: bool = False) -> PartReader:
    """A reader of ``part`` (iterate it once): ``(block index, EventBatch)`` for each block with accepted rows,
    counts and rejects to ``sink``, and where it read to (:meth:`PartReader.snapshot`: after its last complete
    line, for a whole growable file). A file that cannot be read raises :class:`InputError` while iterating.

    ``dictionaries``: string columns the reader gives dictionary-encoded (Parquet columns stored with a
    dictionary, the JSON and CSV scanners' service, instance and endpoint) may stay so in the batches, where
    validation changes none of their values (``keep_dictionaries`` of
    :func:`~drainpipe.inputs.validation.validate_columns`), for a reader that only aggregates them; the rows are
    the same."""
    return PartReader(part, format_named(part.fmt).read(part, sink, dictionaries))

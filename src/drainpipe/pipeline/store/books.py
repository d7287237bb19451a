"""The store's books: how far each part of each input source is applied, per definition (``source_progress``), and
the parts' fencing tokens, which are rows of the same table.

Exactly once rests on them: a writer commits its parts' progress rows (:class:`~.protocol.SourceProgress`) in the
same transaction as the states they brought (:meth:`~.sql.SqlStore.merge`), so a killed writer leaves each part
applied up to a commit, and a restarted one resumes from the rows (:mod:`drainpipe.pipeline.progress` reads them).
A transaction whose rows are all recorded already (a retry after a COMMIT whose acknowledgement was lost) writes
nothing (:func:`recorded`).

Fencing: a new owner of a part (a member given a Kafka partition) issues the part's next token before it reads the
part's progress; a merge carrying an older token is refused (:func:`check_fences`) before it writes anything. A
token is the row of the part named :data:`FENCE`, recorded again by every merge that carries it; a retention purge of
the books, which goes by record time, keeps it (:mod:`.purge`): a part idle for longer than the longest retention is
still owned, and a token is never issued twice.

Every row records when it was written (``applied_at``, epoch ms of the store's clock), so that a purge can prune the
books with the data they vouch for (:mod:`drainpipe.pipeline.retention`).

Functions over a :class:`~.backend.Backend`, called inside the store's session and, to write, inside its writing
transaction (whose lock makes a check hold until the commit); blocking; database errors propagate.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from ...errors import Fenced
from .backend import Backend
from .protocol import SourceProgress

__all__ = ["FENCE", "TABLE", "check_fences", "fence_of", "fence_rows", "read", "record", "recorded"]

#: the table of the books
TABLE = "source_progress"
#: the ``source_progress`` name of a part's fencing token; no definition is named so (definition names are identifiers)
FENCE = "#fence"


def fence_of(backend: Backend, source: str, part: str) -> int:
    """``part``'s latest fencing token (0: none issued)."""
    rows = backend.fetchall(
        "SELECT end_offset FROM source_progress WHERE source = ? AND part = ? AND name = ?", (source, part, FENCE)
    )
    return int(rows[0][0]) if rows else 0


def check_fences(backend: Backend, fences: Sequence[SourceProgress]) -> None:
    """:class:`~drainpipe.errors.Fenced` when a part's token has moved past the one given (``end`` is the token)."""
    for fence in fences:
        now = fence_of(backend, fence.source, fence.part)
        if now != fence.end:
            raise Fenced(f"{fence.source} part {fence.part!r} is fenced: token {fence.end}, the store's is {now} "
                         "(another owner took it over)")  # fmt: skip


def fence_rows(fences: Sequence[SourceProgress]) -> list[SourceProgress]:
    """The rows that record ``fences`` (tokens as :func:`check_fences` takes them) again with a merge."""
    return [SourceProgress(f.source, f.part, FENCE, f.end) for f in fences]


def recorded(backend: Backend, progress: Sequence[SourceProgress]) -> bool:
    """Whether the books already have every row of ``progress`` at or past its position: the transaction that
    brought them committed."""
    stored: dict[tuple[str, str, str], int] = {}
    for source, part in _by_part(progress):
        for name, end in backend.fetchall(
            "SELECT name, end_offset FROM source_progress WHERE source = ? AND part = ?", (source, part)
        ):
            stored[(source, part, name)] = end
    for row in progress:
        end = stored.get((row.source, row.part, row.name))
        if end is None or (end != -1 and (row.end == -1 or end < row.end)):
            return False
    return True


def record(backend: Backend, progress: Sequence[SourceProgress], now_ms: int) -> None:
    """Replace the rows of ``progress`` (a part's row per definition), recorded at ``now_ms``: two statements per
    part, not two per row (a checkpoint of 17 definitions spent 25 ms on 34 statements)."""
    for (source, part), named in _by_part(progress).items():
        rows = list(named.values())
        backend.execute(
            f"DELETE FROM source_progress WHERE source = ? AND part = ? AND name IN ({', '.join('?' * len(rows))})",
            (source, part, *(row.name for row in rows)),
        )
        backend.execute(
            f"INSERT INTO source_progress VALUES {', '.join(['(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)'] * len(rows))}",
            [v for r in rows for v in (r.source, r.part, r.name, r.end, r.lines, r.head, r.node, r.path, r.prefix,
                                       now_ms)],
        )  # fmt: skip


def read(
    backend: Backend, source: str, *, part: str | None = None, head: str | None = None, node: str | None = None
) -> list[SourceProgress]:
    """The rows of ``source`` (of its ``part`` if given; with ``head``/``node``, of the files with this head
    fingerprint or this device/inode), ordered by part and definition."""
    where, params = ["source = ?"], [source]
    if part is not None:
        where.append("part = ?")
        params.append(part)
    if head is not None or node is not None:
        where.append("(head = ? OR node = ?)")
        params += [head or "", node or ""]
    rows = backend.fetchall(
        "SELECT source, part, name, end_offset, end_lines, head, node, path, prefix FROM source_progress "
        f"WHERE {' AND '.join(where)} ORDER BY part, name",
        params,
    )
    return [SourceProgress(*row) for row in rows]


def _by_part(progress: Sequence[SourceProgress]) -> dict[tuple[str, str], dict[str, SourceProgress]]:
    """The rows per (source, part), the last of a (source, part, name) holding, as one replace after another."""
    by_part: dict[tuple[str, str], dict[str, SourceProgress]] = defaultdict(dict)
    for row in progress:
        by_part[(row.source, row.part)][row.name] = row
    return by_part

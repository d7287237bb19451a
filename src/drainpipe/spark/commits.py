"""The commit of a Spark job on its driver: the partials Spark's tasks made, merged into the store in one transaction
with the books of the parts they came from.

It is the :class:`~drainpipe.pipeline.Sink` of the exactly-once :class:`~drainpipe.pipeline.Driver` for Spark's file
ingest and Kafka micro-batches: the driver keeps the books, the one policy for which definitions need which data, and
the dead letter's flush before a commit, as for the local engine; this commits. A Spark job has no rollback: its
merge is one transaction, which raises (:class:`~drainpipe.errors.StoreError`) or commits.

Thread-safety: the thread that runs the job's driver side.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from drainpipe.pipeline import Commit, Definition, MergeReport, Partial, SourceProgress, Store

__all__ = ["JobCommit"]


class JobCommit:
    """Merges the partials :meth:`stage` was given when the driver checkpoints; :attr:`report` says what the last
    merge applied."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.report = MergeReport(applied=0, skipped=0)
        self._staged: tuple[Iterable[Definition], Iterable[Partial]] | None = None

    def stage(self, definitions: Iterable[Definition], partials: Iterable[Partial]) -> None:
        """The next commit's partials (of ``definitions``): consumed by that commit, as they stream in."""
        self._staged = (definitions, partials)
        self.report = MergeReport(applied=0, skipped=0)

    def checkpoint(self, progress: Sequence[SourceProgress], events: int, *, wait: bool = False,
                   rollback: bool = False, fences: Sequence[SourceProgress] = ()) -> Commit:  # fmt: skip
        """Merge the staged partials with ``progress`` in one transaction (blocks until it is done; raises what
        the store raises). ``fences`` and ``rollback`` are the local engine's: a Spark job has neither."""
        if rollback or fences or self._staged is None:
            raise ValueError("a Spark job commits staged partials, without fences or rollback")
        definitions, partials = self._staged
        self._staged = None
        self.report = self.store.merge_chunks(definitions, partials, progress=progress)
        commit = Commit(list(progress), events)
        commit.finish()
        return commit

"""Where a job's task states wait between its actions, and how the driver fetches them.

A job's tasks make :data:`~drainpipe.spark.rows.STATE_ROWS`. :func:`~drainpipe.spark.engine.merge_states` fetches
them in one action, or more: the first takes the rows its :class:`Route` names (the bookkeeping, the top-N rows,
the metric states of the tasks that made few); a later one, when some task made too many for the driver (or many
tasks made top-N rows), fetches or merges the rest where the tasks left them. Two kinds of job keep them:

========================= ==============================================================================
:class:`FrameStates`      a DataFrame's rows (``mapInArrow``: Kafka micro-batches, the per-type stage,
                          every job under Spark Connect). The rows are persisted in Spark's cache when a
                          later action may need them; each action filters them in the JVM.
:class:`OutputStates`     a classic session's file job, run as an RDD of Python tasks (:func:`task_output`):
                          the first action's rows come back with each task's result, added to an
                          accumulator (:class:`FirstRows`); the tasks' output is only the rows kept for a
                          later action, cached as tagged bytes. The JVM plans no query and converts no
                          row: a job of 4M events on two cores took 0.65-0.75 s instead of 0.8-0.9 s, the
                          JVM's CPU 0.15-0.3 s instead of 0.45-0.85 s (docs/performance.md).
========================= ==============================================================================

Both hand out STATE_ROWS tables and DataFrames alike, so the merge above them is one.

**The accumulator's rows and retries.** Spark applies a task's accumulator update once, from the attempt that
succeeded. But an attempt can cache its partition and fail after (its result lost, the count over the cached
partition failing): the retry then reads the cached partition, the task function does not run again, and that
group's first rows never arrive (SPARK-41497). :meth:`OutputStates.first` checks that every group's rows came and
runs the missing groups again, uncached; their kept rows are the cached ones (a task's rows are a function of its
input).

Thread-safety: the driver's job thread; :meth:`TaskStates.release` once, after the last fetch (also after a
failure).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from drainpipe.errors import SparkJobError

from . import actions
from .rows import METRIC, STATE_ROWS, TOPN, from_ipc, spark_schema, state_table, to_ipc
from .tasks import ArrowMapFn

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.accumulators import Accumulator, AccumulatorParam
    from pyspark.core.rdd import RDD
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = ["Route", "TaskStates", "FrameStates", "OutputStates", "FirstRows", "task_output"]


@dataclass(frozen=True)
class Route:
    """Which of a job's STATE_ROWS its first action takes (the others are kept on the executors for a later one):
    every row (``everything``: a job merged on the driver in one action); otherwise the bookkeeping, the metric
    states marked ``inline`` and, unless ``topn_kept`` (many tasks: merged by Spark first), the TOPN rows.
    ``metrics``: whether the job has metric definitions (whose states a task may make too many of)."""

    everything: bool
    topn_kept: bool
    metrics: bool

    @property
    def keeps(self) -> bool:
        """Whether a later action may need rows the first leaves (so they are kept: persisted, cached)."""
        return not self.everything and (self.metrics or self.topn_kept)

    def kept(self, batch: pa.RecordBatch) -> np.ndarray | None:
        """Per row of a STATE_ROWS batch, whether it is kept (None: none is)."""
        if self.everything:
            return None
        kind = batch.column("kind").to_numpy(zero_copy_only=False)
        kept = (kind == METRIC) & ~batch.column("inline").fill_null(False).to_numpy(zero_copy_only=False)
        if self.topn_kept:
            kept |= kind == TOPN
        return kept if kept.any() else None


class TaskStates(abc.ABC):
    """A job's STATE_ROWS: :meth:`first` runs the job; the other methods fetch what it kept."""

    route: Route

    @abc.abstractmethod
    def first(self) -> pa.Table:
        """The rows of the job's first action (the job runs here)."""

    @abc.abstractmethod
    def withheld(self) -> pa.Table:
        """The metric states the first action left (of the tasks that made too many), collected."""

    @abc.abstractmethod
    def rows(self, kind: int) -> DataFrame:
        """Every row of ``kind`` (METRIC or TOPN) the tasks made, in Spark, for a merge there (once a kind: the
        METRIC rows the first action brought are handed over to that DataFrame)."""

    @abc.abstractmethod
    def release(self) -> None:
        """Drop what was kept for later actions (idempotent)."""


class FrameStates(TaskStates):
    """The states of a DataFrame of STATE_ROWS, persisted while a later action may need them."""

    def __init__(self, frame: DataFrame, route: Route) -> None:
        from pyspark import StorageLevel

        self.route = route
        self._frame = frame.persist(StorageLevel.MEMORY_AND_DISK) if route.keeps else frame

    def first(self) -> pa.Table:
        from pyspark.sql import functions as F

        if self.route.everything:
            return state_table(actions.collect(self._frame))
        kept: Column = (F.col("kind") == METRIC) & ~F.col("inline")
        if self.route.topn_kept:
            kept = kept | (F.col("kind") == TOPN)
        return state_table(actions.collect(self._frame.filter(~kept)))

    def withheld(self) -> pa.Table:
        from pyspark.sql import functions as F

        return state_table(actions.collect(self._frame.filter((F.col("kind") == METRIC) & ~F.col("inline"))))

    def rows(self, kind: int) -> DataFrame:
        from pyspark.sql import functions as F

        return self._frame.filter(F.col("kind") == kind)

    def release(self) -> None:
        if self.route.keeps:
            self._frame.unpersist()


class FirstRows:
    """The accumulator parameter of the rows the first action of an RDD job takes from its tasks: a list of
    ``(group, Arrow IPC stream)``, one per task that ran its function to the end."""

    def zero(self, value: list[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
        return []

    def addInPlace(self, into: list[tuple[int, bytes]], more: list[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
        into.extend(more)
        return into


def task_output(fn: ArrowMapFn, route: Route, first: Any) -> Callable[[Iterable[int]], Iterator[tuple[int, bytes]]]:
    """``fn`` (a STATE_ROWS function over the group numbers of a ``spark.range``) as the function of an RDD job
    over the group numbers, one a partition: the rows ``route`` gives the first action are added to the ``first``
    accumulator (:class:`FirstRows`) as one Arrow IPC stream; the task's output is the rows kept, as
    ``(kind, IPC stream)``: a packed METRIC row each (a few MB), the TOPN rows a batch each."""

    def run(groups: Iterable[int]) -> Iterator[tuple[int, bytes]]:
        numbers = list(groups)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, STATE_ROWS) as writer:  # (the packed states in it are compressed already)
            for batch in fn(iter([pa.record_batch({"id": pa.array(numbers, pa.int64())})])):
                kept = route.kept(batch)
                if kept is not None:
                    rows = batch.filter(pa.array(kept))
                    metric = rows.filter(pc.equal(rows.column("kind"), METRIC))
                    for i in range(metric.num_rows):
                        yield METRIC, to_ipc(metric.slice(i, 1))
                    topn = rows.filter(pc.equal(rows.column("kind"), TOPN))
                    if topn.num_rows:
                        yield TOPN, to_ipc(topn, compress=True)
                    batch = batch.filter(pa.array(~kept))
                if batch.num_rows:
                    writer.write_batch(batch)
        first.add([(numbers[0] if numbers else -1, sink.getvalue().to_pybytes())])

    return run


def _kept_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The STATE_ROWS of the IPC streams in the ``ipc`` column (an RDD job's kept rows, in Spark)."""
    for batch in batches:
        for blob in batch.column("ipc"):
            yield from from_ipc(blob.as_buffer()).to_batches()


class OutputStates(TaskStates):
    """The states of an RDD job over ``tasks`` groups, each task running ``fn`` (a STATE_ROWS function over the
    group numbers, as a file job's ``mapInArrow`` would): the first action's rows by accumulator, the kept rows as
    the tasks' output, cached when a later action may need them (``route.keeps``). Failures of its actions are
    drainpipe's errors (:mod:`.actions`)."""

    def __init__(self, spark: SparkSession, fn: ArrowMapFn, tasks: int, route: Route) -> None:
        from pyspark import StorageLevel

        self.route = route
        self._spark = spark
        self._fn = fn
        self._tasks = tasks
        output, self._first = self._job(list(range(tasks)))
        self._output = output.persist(StorageLevel.MEMORY_AND_DISK) if route.keeps else output
        # the first action's METRIC rows, while a merge in Spark may need them (rows(METRIC))
        self._inline: pa.Table | None = None

    def _job(self, groups: list[int]) -> tuple[RDD[tuple[int, bytes]], Accumulator[list[tuple[int, bytes]]]]:
        """The RDD job over ``groups`` (a task each) and the accumulator its tasks add their first rows to."""
        context = self._spark.sparkContext
        first = context.accumulator([], cast("AccumulatorParam[list[tuple[int, bytes]]]", FirstRows()))
        output = context.parallelize(groups, len(groups)).mapPartitions(task_output(self._fn, self.route, first))
        return output, first

    @staticmethod
    def _run(output: RDD[tuple[int, bytes]], first: Accumulator[list[tuple[int, bytes]]]) -> dict[int, bytes]:
        """Run the job of ``output`` (a count); the first rows that came, per group (one an attempt that ran)."""
        try:
            actions.run(output.count)
            return dict(reversed(first.value))
        finally:
            first.value = []  # (the session keeps every accumulator it made; not these rows)

    def first(self) -> pa.Table:
        rows = self._run(self._output, self._first)
        missing = sorted(set(range(self._tasks)) - set(rows))
        if missing:  # retried attempts read their partitions from the cache (the module docstring): run them again
            rows.update(self._run(*self._job(missing)))
            if len(rows) < self._tasks:
                raise SparkJobError(f"spark job failed: no first rows from {self._tasks - len(rows)} task(s)")
        table = _tables(rows[g] for g in sorted(rows))
        if self.route.keeps and self.route.metrics:
            self._inline = table.filter(pc.equal(table.column("kind"), METRIC))
        return table

    def _kept(self, kind: int) -> RDD[bytes]:
        return self._output.filter(lambda row: row[0] == kind).map(lambda row: row[1])

    def withheld(self) -> pa.Table:
        return _tables(actions.run(self._kept(METRIC).collect))

    def rows(self, kind: int) -> DataFrame:
        def build() -> DataFrame:
            kept = self._spark.createDataFrame(self._kept(kind).map(lambda blob: (blob,)), "ipc binary")
            frame = kept.mapInArrow(_kept_rows, spark_schema(STATE_ROWS))
            if kind == METRIC and self._inline is not None and self._inline.num_rows:
                # the inline states came to the driver with the first action: a merge in Spark needs them too (the
                # DataFrame holds them from here: the driver lets go of its copy)
                frame = frame.unionByName(self._spark.createDataFrame(self._inline))
                self._inline = None
            return frame

        return actions.run(build)

    def release(self) -> None:
        self._inline = None
        self._first.value = []  # (what tasks recomputed after the first action added: an evicted cached partition)
        if self.route.keeps:
            self._output.unpersist()


def _tables(streams: Iterable[bytes]) -> pa.Table:
    """Arrow IPC streams of STATE_ROWS as one table."""
    tables = [from_ipc(blob) for blob in streams]
    return pa.concat_tables(tables) if tables else STATE_ROWS.empty_table()

"""Where a job's task states wait between its actions, and how the driver fetches them.

A job's tasks make :data:`~drainpipe.spark.rows.STATE_ROWS`. :func:`~drainpipe.spark.engine.merge_states` fetches
them in one action, or two: the first takes the rows its :class:`~drainpipe.spark.tasks.Route` names (bookkeeping,
top-N rows, the metric states of the tasks that made few); a second, when some task made too many for the driver,
fetches or merges the rest where the tasks left them. Two kinds of job keep them:

========================= ==============================================================================
:class:`FrameStates`      a DataFrame's rows (``mapInArrow``: Kafka micro-batches, the per-type stage,
                          every job under Spark Connect). The rows are persisted in Spark's cache when a
                          second action may need them; each action filters them in the JVM.
:class:`OutputStates`     a classic session's file job, run as an RDD of Python: the first action's rows
                          come back with each task's result (an accumulator, :class:`~drainpipe.spark.
                          tasks.FirstRows`); only the rows kept for a second action are the tasks' output,
                          cached as the bytes they are. The JVM plans no query and converts no row: a job
                          of 4M events on two cores took 0.6-0.7 s instead of 0.8-0.9 s, the JVM's CPU
                          0.15-0.3 s instead of 0.45-0.85 s (docs/performance.md).
========================= ==============================================================================

Both hand out the same tables and DataFrames, so the merge above them is one.

Thread-safety: the driver's job thread; :meth:`TaskStates.release` once, after the last fetch.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from . import actions
from .rows import METRIC, STATE_ROWS, TOPN, spark_schema
from .tasks import ArrowMapFn, FirstRows, Route, task_output, unpack_ipc

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.accumulators import Accumulator
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = ["TaskStates", "FrameStates", "OutputStates"]


class TaskStates:
    """A job's STATE_ROWS: :meth:`first` runs the job; the other methods fetch what it kept."""

    route: Route

    def first(self) -> pa.Table:
        """The rows of the job's first action (the job runs here)."""
        raise NotImplementedError

    def withheld(self) -> pa.Table:
        """The metric states the first action left (of the tasks that made too many), collected."""
        raise NotImplementedError

    def rows(self, kind: int) -> DataFrame:
        """Every row of ``kind`` (METRIC or TOPN) the tasks made, in Spark, for a merge there."""
        raise NotImplementedError

    def release(self) -> None:
        """Drop what was kept for later actions."""


class FrameStates(TaskStates):
    """The states of a DataFrame of STATE_ROWS, persisted while a second action may need them."""

    def __init__(self, frame: DataFrame, route: Route) -> None:
        from pyspark import StorageLevel

        self.route = route
        self._frame = frame.persist(StorageLevel.MEMORY_AND_DISK) if route.keeps else frame

    def first(self) -> pa.Table:
        from pyspark.sql import functions as F

        if self.route.everything:
            return actions.collect(self._frame)
        kept: Column = (F.col("kind") == METRIC) & ~F.col("inline")
        if self.route.topn_kept:
            kept = kept | (F.col("kind") == TOPN)
        return actions.collect(self._frame.filter(~kept))

    def withheld(self) -> pa.Table:
        from pyspark.sql import functions as F

        return actions.collect(self._frame.filter((F.col("kind") == METRIC) & ~F.col("inline")))

    def rows(self, kind: int) -> DataFrame:
        from pyspark.sql import functions as F

        return self._frame.filter(F.col("kind") == kind)

    def release(self) -> None:
        if self.route.keeps:
            self._frame.unpersist()


class OutputStates(TaskStates):
    """The states of an RDD job over ``tasks`` groups, each task running ``fn`` (a STATE_ROWS function over the
    group numbers): the first action's rows by accumulator, the kept rows as the tasks' output, cached when a
    second action may need them (``route.keeps``)."""

    def __init__(self, spark: SparkSession, fn: ArrowMapFn, tasks: int, route: Route) -> None:
        from pyspark import StorageLevel

        self.route = route
        self._spark = spark
        context = spark.sparkContext
        self._first: Accumulator[list[tuple[int, bytes]]] = context.accumulator([], FirstRows())
        output = context.parallelize(range(tasks), tasks).mapPartitionsWithIndex(task_output(fn, route, self._first))
        self._output = output.persist(StorageLevel.MEMORY_AND_DISK) if route.keeps else output
        self._inline: pa.Table | None = None

    def first(self) -> pa.Table:
        actions.run(self._output.count)
        by_partition = dict(reversed(self._first.value))  # (one a partition: the first attempt that added)
        self._first.value = []  # (the session keeps every accumulator it made: not their rows)
        table = _tables(by_partition[p] for p in sorted(by_partition))
        self._inline = table.filter(pc.equal(table.column("kind"), METRIC))
        return table

    def withheld(self) -> pa.Table:
        table = _tables(actions.run(self._output.collect))
        return table.filter(pc.equal(table.column("kind"), METRIC))

    def rows(self, kind: int) -> DataFrame:
        from pyspark.sql import functions as F

        kept = self._spark.createDataFrame(self._output.map(lambda blob: (blob,)), "ipc binary")
        frame = kept.mapInArrow(unpack_ipc, spark_schema(STATE_ROWS))
        if kind == METRIC and self._inline is not None and self._inline.num_rows:
            # the inline states came to the driver with the first action: a merge in Spark needs them too
            frame = frame.unionByName(self._spark.createDataFrame(self._inline))
        return frame.filter(F.col("kind") == kind)

    def release(self) -> None:
        if self.route.keeps:
            self._output.unpersist()


def _tables(streams: Iterable[bytes]) -> pa.Table:
    """Arrow IPC streams of STATE_ROWS as one table."""
    tables = [pa.ipc.open_stream(pa.py_buffer(blob)).read_all() for blob in streams]
    return pa.concat_tables(tables) if tables else STATE_ROWS.empty_table()

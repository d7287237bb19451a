"""The Spark job: input files -> validated events -> partial states per task -> merged states -> partials.

:func:`aggregate_splits` is the job (no store, no dead letter); :func:`ingest_files` adds what makes it a
pipeline run: idempotency through the store's applied sources, the dead letter, one store transaction.
Both batch (:func:`drainpipe.spark.run_batch`) and streaming (each micro-batch) go through
:func:`ingest_files`, so they share every step.

Stages (``per_type="map"``, the default)::

    the task groups (runs of splits, a task a core) --scan_states-->
        read + validate + aggregate_batch over the task's splits  -> STATE_ROWS (metric states packed as
                                                                     LZ4-compressed Arrow IPC, ``inline`` when the
                                                                     task's are at most driver_merge_rows / tasks)
        a classic session: an RDD job (states.OutputStates): the first action's rows come back with each task's
          result (an accumulator), the rows kept for later actions are cached as bytes
        Spark Connect: spark.range(groups).mapInArrow (states.FrameStates): the rows persisted, filtered by actions
    TOPN, REJECT, SPLIT, TASK rows and the inline METRIC rows ------------------------> driver   (action 1)
      (over DRIVER_TOPN_MERGE_TASKS tasks, the TOPN rows are kept and merged in Spark by an action of their own:
       repartition(d, entity, bucket) --mapInArrow(merge_topn))
    every task's came inline: merged on the driver with the shared merge, the guard by name (one action)
    the others' METRIC rows, all tasks' together at most driver_merge_rows --------> driver   (action 2)
    more: METRIC rows --unpack_rows--groupBy(d, entity, bucket, b).agg(sum | min | max per state column)
        [--> the cardinality guard (a window per scope and minute), when the tasks' reports say it can fold]
        ------------------------------------------------------------------------------> driver   (action 2)

    (``driver_merge``, a stream's micro-batch after a small one: every row in action 1, nothing kept)

The merge across tasks of many states uses Spark's built-in ``sum``/``min``/``max``, chosen per state column from
:data:`~drainpipe.pipeline.partials.STATE_COLUMNS` (the shared merge operations; few states are merged on the
driver with those operations themselves, :func:`~drainpipe.pipeline.partials.merge`): exact for the integer
states and min/max; float sums (``sum``, ``avg``) add in another order than the local engine, so they may
differ in the last ulp. The top-N merges with the shared :func:`~drainpipe.pipeline.partials.merge` (on the
driver, after a Spark stage of it when many tasks contribute).

``per_type="placed"`` (and its baseline ``"hash"``) insert the per-type stage: the scan only parses
(``scan_events``), type weights come from a sample of every split (``sample_types``), the rows are placed with
:mod:`drainpipe.spark.skew` (salted hot types, LPT, ``repartitionById``) and ``aggregate_events`` aggregates
each partition; the states then merge exactly as above. Results are identical in every mode.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import reduce
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from drainpipe.inputs import EVENT_SCHEMA, TRACE_ID, WEIGHT, DeadLetter, Part, Position, ReadStats, plan_parts
from drainpipe.inputs.log_formats import DEFAULT_LOG_FORMAT, LogFormat
from drainpipe.inputs.options import InputOptions
from drainpipe.pipeline import (
    GRANULARITY_MS,
    OVERFLOW,
    PERCENTILE_LABELS,
    STATE_COLUMNS,
    Definitions,
    Driver,
    EntityGuard,
    InputFile,
    MetricDef,
    MetricPartial,
    Partial,
    Store,
    TopNDef,
    fold_entities,
    merge,
    normalize,
    resolve,
)

from . import actions, skew
from .commits import JobCommit
from .rows import (
    EVENT,
    EVENT_ROWS,
    EXIT,
    META_COLUMNS,
    METRIC,
    REJECT,
    SPLIT,
    STATE_ROWS,
    TASK,
    TOPN,
    columns_used,
    empty_like,
    from_ipc,
    metric_partial,
    select_rows,
    spark_schema,
    state_table,
    topn_only_filter,
    topn_partial,
    unpack_rows,
    unpacked_partials,
)
from .session import is_connect
from .splits import Split, plan_splits
from .states import FrameStates, OutputStates, Route, TaskStates
from .tasks import (
    SAMPLE_SCHEMA,
    aggregate_events,
    merge_topn,
    pack_ipc,
    sample_types,
    scan_events,
    scan_states,
)

log = logging.getLogger("drainpipe.spark")

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "PER_TYPE_MODES",
    "JobOptions",
    "JobResult",
    "aggregate_splits",
    "per_type_stage",
    "merge_states",
    "parallelism",
    "ingest_files",
    "inline_rows",
    "task_groups",
    "Progress",
]

# pyspark 4.x warns when a pandas/Arrow UDF is declared that it does not fully support pandas 3; the engine
# exchanges Arrow only
warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)

PER_TYPE_MODES = ("map", "placed", "hash")
Progress = Callable[[int, int], None]  # (events read so far, input bytes done so far)


@dataclass(frozen=True)
class JobOptions:
    """Tuning of the Spark job; none of it changes results."""

    per_type: str = "map"  # map | placed | hash (see the module docstring)
    type_key: str = "service"  # the event column that names a type for the per-type stage
    partitions: int | None = None  # per-type stage / top-N merge partitions (default: shuffle partitions)
    batch_rows: int = 65_536  # rows per input block (the local engine's default: the same source ids)
    sample_rows: int = 4_096  # events sampled from the head of each split for type weights
    weights: dict[str, float] | None = None  # type weights to use instead of sampling (previous window)
    service: str = ""  # the service access logs (.log) belong to (not tuning: what the logs are)
    log_format: LogFormat = DEFAULT_LOG_FORMAT  # the access logs' line format
    # hand the merged metric states out in chunks (JobResult.metric_chunks) instead of collecting them: the
    # driver then holds one chunk at a time (``ingest_files`` writes them to the store as they come)
    stream_metrics: bool = False
    # the tasks' metric state rows at most which the driver merges them (collected as they are, no shuffle); more
    # are merged by Spark. 0: Spark always merges
    driver_merge_rows: int = 2_000_000
    # collect the tasks' states in one action and merge them on the driver (nothing persisted, no shuffle): for a
    # job known to make few state rows, such as a micro-batch after one that made at most driver_merge_rows
    driver_merge: bool = False
    # file splits are dealt to at most this many tasks per core (task_groups): a task's fixed cost is paid once.
    # Two give a slow executor half a share to hold the job up by instead of a whole one, for 6% more time on an
    # even cluster (local[2] and 2 executors x 1 core, 4M events)
    tasks_per_core: int = 1

    def __post_init__(self) -> None:
        if self.per_type not in PER_TYPE_MODES:
            raise ValueError(f"unknown per-type mode {self.per_type!r} (expected one of {', '.join(PER_TYPE_MODES)})")


@dataclass
class JobResult:
    """What :func:`aggregate_splits` computed: one partial per definition (no sources yet), counts, rejects
    (``(path, line, raw, reason)`` in file/line order), per stage the tasks' ``(seconds, events, cpu seconds)``
    and the stages' wall times."""

    partials: list[Partial]
    stats: ReadStats
    rejects: list[tuple[str, int, Any, str]]
    tasks: dict[str, list[tuple[float, int, float]]]
    stage_s: dict[str, float] = field(default_factory=dict)
    placement: skew.Placement | None = None
    ends: dict[int, tuple[int, int] | None] = field(default_factory=dict)  # per split: where a whole file ended
    # with JobOptions.stream_metrics: the metric partials come from here (``partials`` then holds the top-Ns),
    # chunk by chunk, each holding every row of its entities; call ``release`` once they have been consumed
    metric_chunks: Callable[[], Iterator[Partial]] | None = None
    release: Callable[[], None] | None = None
    # per scope: state rows folded into __overflow__ by the cardinality guard (metric counts grow as the
    # metric_chunks are consumed)
    overflow: Counter[str] = field(default_factory=Counter)
    # tasks per (C extensions their Python ran, why any was missing): which tier the executors ran
    tiers: Counter[tuple[str, str]] = field(default_factory=Counter)
    state_rows: int = 0  # the metric state rows the tasks made (what a driver merge would collect)
    # how the metric states were merged: "first action" (every task's came with the bookkeeping), "collected"
    # (the rest collected by a second action), "spark", "streamed" (by Spark, handed out in chunks), "one action"
    # (JobOptions.driver_merge), "" (no metric definitions)
    metric_merge: str = ""

    def all_partials(self) -> Iterator[Partial]:
        """The partials, then the streamed metric chunks if any (once: chunks are consumed as they come)."""
        yield from self.partials
        if self.metric_chunks is not None:
            yield from self.metric_chunks()

    def spread(self, measure: str = "seconds") -> dict[str, dict[str, float]]:
        """Per stage, :func:`~drainpipe.spark.skew.task_spread` of the tasks' wall ``seconds``, ``cpu``
        seconds or ``events``."""
        column = ("seconds", "events", "cpu").index(measure)
        return {stage: skew.task_spread(t[column] for t in tasks) for stage, tasks in self.tasks.items()}


# ------------------------------------------------------------------------------------------ the job


def parallelism(spark: SparkSession) -> int:
    """The cores Spark runs tasks on (the default parallelism; under Spark Connect, which has no SparkContext, the
    session's shuffle partitions say how wide it is)."""
    if is_connect(spark):
        return max(1, int(spark.conf.get("spark.sql.shuffle.partitions") or 2))
    return max(1, spark.sparkContext.defaultParallelism)


def _shuffle_partitions(spark: SparkSession, options: JobOptions) -> int:
    if options.partitions:
        return options.partitions
    return max(1, int(spark.conf.get("spark.sql.shuffle.partitions") or 8))


def task_groups(splits: Sequence[Split], tasks: int) -> list[list[Split]]:
    """The splits in plan order cut into at most ``tasks`` runs of about equal weight (a run ends once the runs so
    far reach their share of the total: no run exceeds its share by more than one split), heaviest run first:
    Spark schedules partition i before i + 1.

    Fewer tasks than splits because a task has a fixed cost (its scheduling, the Python worker's round trips:
    40-70 ms on two cores) and makes its own states to merge. Runs of consecutive parts because an input in time
    order then gives each task its own minutes: fewer state rows than tasks that each see the whole span."""
    count = max(1, min(tasks, len(splits)))
    total = sum(s.weight for s in splits)
    groups: list[list[Split]] = [[]]
    done = 0
    for position, split in enumerate(splits):
        groups[-1].append(split)
        done += split.weight
        left = len(splits) - position - 1  # splits still to place, for count - len(groups) runs still to open
        if len(groups) < count and left and (done * count >= total * len(groups) or left == count - len(groups)):
            groups.append([])
    return sorted(groups, key=lambda g: -sum(s.weight for s in g))


def _splits_frame(spark: SparkSession, count: int) -> DataFrame:
    """``id`` 0..count-1, one per partition: partition i reads the i-th group of :func:`task_groups`
    (the groups travel with the task function; no shuffle)."""
    return spark.range(0, count, 1, numPartitions=max(1, count))


_STATE_KEY = ("d", "entity", "bucket", "b")


def _merge_aggregates(definitions: Definitions) -> list[Any]:
    """Per state column, the shared merge operation (``StateColumn.merge``) of the definitions that use it, as
    Spark aggregates over rows keyed by :data:`_STATE_KEY`."""
    from pyspark.sql import functions as F

    ops: dict[str, dict[str, list[int]]] = {}
    for index, definition in enumerate(definitions.all):
        if isinstance(definition, MetricDef):
            for column in STATE_COLUMNS[definition.function]:
                ops.setdefault(column.name, {}).setdefault(column.merge, []).append(index)
    aggregates = []
    for name, by_op in ops.items():
        parts = [getattr(F, op)(F.when(F.col("d").isin(ids), F.col(name))) for op, ids in by_op.items()]
        aggregates.append((parts[0] if len(parts) == 1 else F.coalesce(*parts)).alias(name))
    return aggregates


def _metric_merge(packed: DataFrame, definitions: Definitions, guard: bool = True) -> DataFrame:
    """Merge the packed METRIC rows of every task with Spark aggregates (:func:`_merge_aggregates`), then hold them
    to the cardinality guard (:func:`_guard_entities`) if ``guard`` (False when no bucket can exceed
    ``max_entities``: the guard's window costs a shuffle of every merged row)."""
    from pyspark.sql import functions as F

    aggregates = _merge_aggregates(definitions)
    rows = packed.mapInArrow(unpack_rows, spark_schema(STATE_ROWS))
    merged = rows.groupBy(*_STATE_KEY).agg(*aggregates)
    if not guard:
        return merged.withColumn("folded", F.lit(0).cast("long"))
    return _guard_entities(merged, definitions, aggregates)


def _guard_entities(merged: DataFrame, definitions: Definitions, aggregates: list[Any]) -> DataFrame:
    """The cardinality guard on merged minute states: per definition scope and minute, the first ``max_entities``
    entities in name order are kept (an input entity named ``__overflow__`` is never one of them); the states of
    the others are merged into the entity ``__overflow__`` of that scope and minute, so no total changes. Adds the
    column ``folded``: on an ``__overflow__`` row, how many merged state rows were folded into it (else 0).

    The local engine keeps the first entities to arrive (:class:`~drainpipe.pipeline.cardinality.EntityGuard`);
    a Spark job has no arrival order, so it keeps the first by name, the same on every run and cluster size. Below
    the limit both keep every entity, and results are identical."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    scopes: list[Any] = []
    for index, definition in enumerate(definitions.all):
        if isinstance(definition, MetricDef):
            scopes += [F.lit(index), F.lit(definition.scope)]
    overflow = F.col("entity") == OVERFLOW
    by_name = Window.partitionBy(F.create_map(*scopes)[F.col("d")], "bucket").orderBy(overflow, "entity")
    ranked = merged.withColumn("_fold", (F.dense_rank().over(by_name) > definitions.max_entities) & ~overflow)
    kept = ranked.filter(~(F.col("_fold") | overflow)).drop("_fold").withColumn("folded", F.lit(0).cast("long"))
    into = (
        ranked.filter(F.col("_fold") | overflow)
        .withColumn("entity", F.lit(OVERFLOW))
        .groupBy(*_STATE_KEY)
        .agg(*aggregates, F.sum(F.col("_fold").cast("long")).alias("folded"))
    )
    return kept.unionByName(into)


def _folded(table: pa.Table, definitions: Definitions, into: Counter[str]) -> None:
    """Add the ``folded`` counts of merged metric rows to ``into``, per scope (the local engine's keys)."""
    counts = table.filter(pc.greater(table.column("folded"), 0))
    for d, n in zip(counts.column("d").to_pylist(), counts.column("folded").to_pylist()):
        definition = definitions.all[d]
        into[definition.scope] += n


def _sample_weights(frame: DataFrame, groups: Sequence[Sequence[Split]], options: JobOptions) -> dict[str, float]:
    rows = actions.collect(
        frame.mapInArrow(sample_types(groups, options.type_key, options.sample_rows), spark_schema(SAMPLE_SCHEMA))
    )
    return skew.weights_from_counts(zip(rows.column("type").to_pylist(), rows.column("weight").to_pylist()))


def aggregate_splits(
    spark: SparkSession,
    splits: Sequence[Split],
    definitions: Definitions,
    options: JobOptions = JobOptions(),
    accumulators: tuple[Any, Any] | None = None,
) -> JobResult:
    """Run the job over ``splits`` (see the module docstring); partials are returned without sources."""
    stage_s: dict[str, float] = {}
    clock = time.perf_counter()
    groups = task_groups(splits, options.tasks_per_core * parallelism(spark))
    if options.per_type == "map":
        scan = scan_states(definitions, groups, accumulators, inline_rows(options, len(groups)))
        route = job_route(definitions, options, len(groups))
        states: TaskStates = (
            FrameStates(_splits_frame(spark, len(groups)).mapInArrow(scan, spark_schema(STATE_ROWS)), route)
            if is_connect(spark)  # (no RDDs under Spark Connect)
            else OutputStates(spark, scan, len(groups), route)
        )
        return merge_states(spark, states, definitions, options, splits, stage_s)
    frame = _splits_frame(spark, len(groups))
    partitions = _shuffle_partitions(spark, options)
    if options.per_type == "placed":
        weights = options.weights if options.weights is not None else _sample_weights(frame, groups, options)
        placement = skew.plan_placement(weights, partitions)
        stage_s["sample"] = time.perf_counter() - clock
    else:
        placement = skew.hash_placement(partitions)
    events = frame.mapInArrow(scan_events(groups, accumulators), spark_schema(EVENT_ROWS))
    return per_type_stage(spark, events, definitions, placement, options, splits, stage_s)


def per_type_stage(
    spark: SparkSession,
    events: DataFrame,
    definitions: Definitions,
    placement: skew.Placement,
    options: JobOptions = JobOptions(),
    splits: Sequence[Split] | Mapping[int, Split] = (),
    stage_s: dict[str, float] | None = None,
) -> JobResult:
    """Aggregate an events DataFrame (the canonical event columns; with ``kind``, EVENT rows are requests, EXIT rows
    a CLIENT span's statement, other rows pass through as bookkeeping) per type: rows placed by ``placement`` on
    ``options.type_key`` (``repartitionById``), each partition aggregated with ``aggregate_batch``, the sub-groups'
    partial states merged like any task's.

    Only the columns the definitions read cross the shuffle (:func:`~drainpipe.spark.rows.columns_used`, and the
    events' weights when they have them, and their trace ids for a top-N on them), and for top-N-only definitions
    only the rows with a key."""
    from pyspark.sql import functions as F

    bookkeeping = "kind" in events.columns
    keep = [*columns_used(definitions), *([options.type_key] if options.type_key not in EVENT_SCHEMA.names else []),
            *([WEIGHT] if WEIGHT in events.columns else []),  # (a sampled span's adjusted count)
            *([TRACE_ID] if TRACE_ID in events.columns and any(t.key == TRACE_ID for t in definitions.topns)
              else [])]  # (exemplars)  # fmt: skip
    if bookkeeping:
        keep += list(META_COLUMNS)
    events = events.select(*dict.fromkeys(keep))
    keys = topn_only_filter(definitions)
    if keys:
        present = [F.col(k).isNotNull() & (F.length(k) > 0) for k in keys if k in events.columns]
        has_key = reduce(lambda a, b: a | b, present) if present else F.lit(False)
        events = events.where(has_key | ~F.col("kind").isin(EVENT, EXIT) if bookkeeping else has_key)
    states = skew.place(events, placement, options.type_key).mapInArrow(
        aggregate_events(definitions, inline_rows=inline_rows(options, placement.partitions)), spark_schema(STATE_ROWS)
    )
    route = job_route(definitions, options, placement.partitions)
    return merge_states(spark, FrameStates(states, route), definitions, options, splits, dict(stage_s or {}), placement)


def job_route(definitions: Definitions, options: JobOptions, tasks: int) -> Route:
    """Which of the STATE_ROWS of a job of about ``tasks`` state-making tasks its first action takes
    (:class:`~drainpipe.spark.states.Route`): everything with ``options.driver_merge``; the TOPN rows stay for a
    merge in Spark over :data:`DRIVER_TOPN_MERGE_TASKS` tasks."""
    return Route(
        everything=options.driver_merge,
        topn_kept=bool(definitions.topns) and tasks > DRIVER_TOPN_MERGE_TASKS,
        metrics=bool(definitions.metrics),
    )


def inline_rows(options: JobOptions, tasks: int) -> int:
    """The most metric state rows a task may make for the job's first action to collect them (``inline``): the driver
    then holds at most ``options.driver_merge_rows`` of them whatever the tasks made (0: Spark always merges)."""
    return options.driver_merge_rows // max(1, tasks)


#: up to this many state-producing tasks, the top-N rows (at most n per key and task) are merged on the driver;
#: beyond, by a Spark stage first (both with the shared ``merge``)
DRIVER_TOPN_MERGE_TASKS = 64


def merge_states(
    spark: SparkSession,
    states: TaskStates,
    definitions: Definitions,
    options: JobOptions = JobOptions(),
    splits: Sequence[Split] | Mapping[int, Split] = (),
    stage_s: dict[str, float] | None = None,
    placement: skew.Placement | None = None,
) -> JobResult:
    """Merge a job's STATE_ROWS across its tasks (``states`` keeps them between actions, :mod:`.states`; their
    :class:`~drainpipe.spark.states.Route` is :func:`job_route`'s) and collect them with the bookkeeping rows;
    ``splits`` (or a mapping from their indexes) name the sources of the rejects.

    The first action collects the top-N and bookkeeping rows with the metric states of the tasks that marked theirs
    ``inline`` (each at most :func:`inline_rows`: the driver holds at most ``options.driver_merge_rows`` of them);
    over :data:`DRIVER_TOPN_MERGE_TASKS` tasks the top-N rows are left out of it and merged in Spark by an action of
    their own (as are the metric states, they are kept for it: persisted or cached). The tasks' reports say
    whether the cardinality guard can fold anything (:func:`_entity_bound`) and how many state rows they made. When
    every task's came inline they are merged on the driver: one action. Otherwise a second: the other tasks' states
    are collected when all are at most ``options.driver_merge_rows``, or every task's are merged by Spark (and
    collected, or handed out in chunks with ``options.stream_metrics``). :attr:`JobResult.metric_merge` says which.
    ``options.driver_merge``: one action, everything collected and merged on the driver, nothing kept."""
    clock = time.perf_counter()
    stage_s = {} if stage_s is None else stage_s
    if states.route.everything:
        return _merge_on_driver(states, definitions, splits, stage_s, placement)
    stream = options.stream_metrics and bool(definitions.metrics)
    merged = on_driver = None
    how = ""
    try:
        # the first action: bookkeeping, the top-N rows and the metric states of the tasks that made few (inline)
        collected = states.first()
        if states.route.topn_kept:
            topn_rows = states.rows(TOPN).repartition(_shuffle_partitions(spark, options), "d", "entity", "bucket")
            topn = actions.collect(topn_rows.mapInArrow(merge_topn(definitions), spark_schema(STATE_ROWS)))
            collected = pa.concat_tables([collected, state_table(topn)])
        meta = collected.filter(pc.greater_equal(collected.column("kind"), REJECT))
        guard = any(n > definitions.max_entities for n in _entity_bound(meta).values())
        rows, withheld = _state_rows(meta), _withheld_rows(meta)
        # streamed only when the merged states may be too many to collect at once (the tasks' state rows bound
        # them): a stream's partitions cost a job each, seconds for a few hundred thousand rows
        stream = stream and bool(withheld) and rows > STREAM_METRICS_ABOVE_ROWS
        stage_s["aggregate+bookkeeping"] = time.perf_counter() - clock
        if definitions.metrics and not stream:
            clock = time.perf_counter()
            if not withheld:  # every task's states came with the first action
                on_driver, how = collected, "first action"
            elif options.driver_merge_rows and rows <= options.driver_merge_rows:  # few: merged here
                on_driver, how = pa.concat_tables([collected, states.withheld()]), "collected"
            else:  # (the inline states collected are merged again by Spark: not held meanwhile)
                collected = collected.filter(pc.not_equal(collected.column("kind"), METRIC))
                merged, how = actions.collect(_metric_merge(states.rows(METRIC), definitions, guard)), "spark"
            stage_s["metric merge"] = time.perf_counter() - clock
        if stream:  # (built here: it may fail, and then the kept states are released)
            frame = _metric_merge(states.rows(METRIC), definitions, guard).repartition(max(_STREAM_PARTITIONS,
                _shuffle_partitions(spark, options)), "entity")  # fmt: skip
    except BaseException:
        states.release()
        raise
    if not stream:
        states.release()
    overflow: Counter[str] = Counter()
    metrics: dict[int, MetricPartial] = {}
    try:
        if merged is not None:
            _folded(merged, definitions, overflow)
            metrics = {i: metric_partial(d, merged.filter(pc.equal(merged.column("d"), i)))
                       for i, d in enumerate(definitions.all) if isinstance(d, MetricDef)}  # fmt: skip
        elif on_driver is not None:
            clock = time.perf_counter()
            metrics = _driver_merge(on_driver, definitions, guard, overflow)
            stage_s["metric merge"] += time.perf_counter() - clock
        result = _result(definitions, metrics, collected, meta, splits, stage_s, placement, overflow)
    except BaseException:
        states.release()  # (what a streamed merge still keeps; releasing twice is nothing)
        raise
    result.metric_merge = "streamed" if stream else how
    if stream:
        result.partials = [p for p in result.partials if not isinstance(p, MetricPartial)]
        result.metric_chunks = lambda: _metric_chunks(frame, definitions, overflow)
        result.release = states.release
    return result


def _result(
    definitions: Definitions, metrics: Mapping[int, MetricPartial], collected: pa.Table, meta: pa.Table,
    splits: Sequence[Split] | Mapping[int, Split], stage_s: dict[str, float], placement: skew.Placement | None,
    overflow: Counter[str],
) -> JobResult:  # fmt: skip
    """The job's result from its merged metric partials, its collected TOPN rows and its bookkeeping rows."""
    partials = _partials(definitions, metrics, collected if definitions.topns else None, overflow)
    stats, rejects, ends = _read_report(splits, meta)
    result = JobResult(partials, stats, rejects, _task_times(meta), stage_s, placement, ends, overflow=overflow,
                       tiers=_task_tiers(meta), state_rows=_state_rows(meta))  # fmt: skip
    _say_tiers(result.tiers)
    return result


def _merge_on_driver(
    states: TaskStates, definitions: Definitions, splits: Sequence[Split] | Mapping[int, Split],
    stage_s: dict[str, float], placement: skew.Placement | None,
) -> JobResult:  # fmt: skip
    """``merge_states`` with ``driver_merge``: every row collected in one action, the metric states merged with the
    shared merge (:func:`~drainpipe.pipeline.merge`) and held to the cardinality guard by entity name, as the
    Spark merge does (:func:`_guard_by_name`)."""
    clock = time.perf_counter()
    collected = states.first()
    stage_s["aggregate+collect"] = time.perf_counter() - clock
    clock = time.perf_counter()
    meta = collected.filter(pc.greater_equal(collected.column("kind"), REJECT))
    overflow: Counter[str] = Counter()
    guard = any(n > definitions.max_entities for n in _entity_bound(meta).values())
    metrics = _driver_merge(collected, definitions, guard, overflow)
    result = _result(definitions, metrics, collected, meta, splits, stage_s, placement, overflow)
    result.metric_merge = "one action" if definitions.metrics else ""
    stage_s["metric merge"] = time.perf_counter() - clock
    return result


def _driver_merge(
    rows: pa.Table, definitions: Definitions, guard: bool, overflow: Counter[str]
) -> dict[int, MetricPartial]:
    """The tasks' packed METRIC rows merged here with the shared merge (:func:`~drainpipe.pipeline.merge`), per metric
    definition; held to the cardinality guard by name if ``guard`` (its folds added to ``overflow``)."""
    metrics = {i: merge(partials) for i, partials in unpacked_partials(rows, definitions).items()}
    if guard:
        _guard_by_name(metrics, definitions, overflow)
    return metrics


def _guard_by_name(metrics: dict[int, MetricPartial], definitions: Definitions, overflow: Counter[str]) -> None:
    """The cardinality guard of :func:`_guard_entities` on merged partials: per scope and minute, the first
    ``max_entities`` entities by name over the scope's definitions are kept, the others folded into
    ``__overflow__`` (:func:`~drainpipe.pipeline.fold_entities`); the folded rows are counted in ``overflow``."""
    scopes: dict[str, list[int]] = {}
    for index in metrics:
        scopes.setdefault(definitions.all[index].scope, []).append(index)
    for scope, indexes in scopes.items():
        pairs = pa.concat_tables(metrics[i].table.select(["bucket", "entity"]) for i in indexes)
        pairs = pairs.filter(pc.not_equal(pairs.column("entity"), OVERFLOW))
        pairs = (
            pairs.group_by(["bucket", "entity"])
            .aggregate([])
            .sort_by([("bucket", "ascending"), ("entity", "ascending")])
        )
        buckets = pairs.column("bucket").to_numpy()
        starts = np.flatnonzero(np.r_[True, buckets[1:] != buckets[:-1]])
        rank = np.arange(len(buckets)) - np.repeat(starts, np.diff(np.r_[starts, len(buckets)]))
        kept = pairs.filter(pa.array(rank < definitions.max_entities))
        kept_keys = _pair_keys(kept)
        for index in indexes:
            table = metrics[index].table
            fold = pc.and_(pc.invert(pc.is_in(_pair_keys(table), value_set=kept_keys)),
                           pc.not_equal(table.column("entity"), OVERFLOW)).to_numpy(zero_copy_only=False)  # fmt: skip
            if fold.any():
                overflow[scope] += int(fold.sum())
                metrics[index] = fold_entities(metrics[index], fold, OVERFLOW)


def _pair_keys(table: pa.Table) -> pa.Array:
    """One string per (bucket, entity) row."""
    return pc.binary_join_element_wise(table.column("bucket").cast(pa.string()), table.column("entity"), "\x1f")


def _state_rows(meta: pa.Table) -> int:
    """The metric state rows the aggregating tasks emitted: no more are merged."""
    return sum(json.loads(info).get("rows", 0) for info in select_rows(meta, TASK).column("info").to_pylist())


def _withheld_rows(meta: pa.Table) -> int:
    """The metric state rows of the tasks whose states were too many for the first action (not ``inline``)."""
    reports = (json.loads(info) for info in select_rows(meta, TASK).column("info").to_pylist())
    return sum(r.get("rows", 0) for r in reports if not r.get("inline"))


def _entity_bound(meta: pa.Table) -> dict[str, int]:
    """Per metric scope, the sum over the aggregating tasks of the most distinct entities one bucket of theirs
    holds: no bucket of the merged states holds more. A bucket can exceed ``max_entities`` only where this does."""
    bound: Counter[str] = Counter()
    for info in select_rows(meta, TASK).column("info").to_pylist():
        bound.update(json.loads(info).get("entities") or {})
    return bound


#: the streamed metric states are cut into at least this many chunks (each holds all the rows of its entities)
_STREAM_PARTITIONS = 64
#: an input group of more bytes than this may stream its merged metric states to the driver (``stream_metrics``) ...
STREAM_METRICS_ABOVE_BYTES = 256 << 20
#: ... and does when its tasks emitted more metric state rows than this (a bound on the merged ones: collected at
#: once, these take a few hundred MB of the driver's memory at most)
STREAM_METRICS_ABOVE_ROWS = 2_000_000


def _metric_chunks(frame: DataFrame, definitions: Definitions, overflow: Counter[str]) -> Iterator[Partial]:
    """The merged metric rows of ``frame``, one partition at a time: each executor packs its partition into Arrow
    IPC blobs (:func:`~drainpipe.spark.tasks.pack_ipc`) and ``toLocalIterator`` fetches one partition after the
    other, so the driver holds one partition's states, however large the output. Yields one partial per metric
    definition and partition; adds the guard's folds to ``overflow``."""
    from pyspark.sql.types import BinaryType, IntegerType, StructField, StructType

    schema = StructType([StructField("part", IntegerType()), StructField("ipc", BinaryType())])
    packed = frame.mapInArrow(pack_ipc, schema)
    current: int | None = None
    blobs: list[bytes] = []
    for row in actions.local_iterator(packed):
        if row.part != current and blobs:
            yield from _chunk_partials(definitions, blobs, overflow)
            blobs = []
        current = row.part
        blobs.append(row.ipc)
    if blobs:
        yield from _chunk_partials(definitions, blobs, overflow)


def _chunk_partials(definitions: Definitions, blobs: list[bytes], overflow: Counter[str]) -> Iterator[Partial]:
    table = pa.concat_tables(from_ipc(b) for b in blobs)
    _folded(table, definitions, overflow)
    for index, definition in enumerate(definitions.all):
        if isinstance(definition, MetricDef):
            rows = table.filter(pc.equal(table.column("d"), index))
            if rows.num_rows:
                yield metric_partial(definition, rows)


def _partials(
    definitions: Definitions, metrics: Mapping[int, MetricPartial], topn: pa.Table | None, overflow: Counter[str]
) -> list[Partial]:
    """One partial per definition: the merged metric partials, the top-N rows merged once more (across merge
    tasks, then held to the cardinality guard; its folds are added to ``overflow``)."""
    guard = EntityGuard(definitions.max_entities)  # top-N rows come sorted by entity: the first by name are kept
    out: list[Partial] = []
    for index, definition in enumerate(definitions.all):
        if isinstance(definition, MetricDef):
            partial = metrics.get(index)
            out.append(partial if partial is not None and partial.table.num_rows else empty_like(definition))
        else:
            assert isinstance(definition, TopNDef)
            rows = select_rows(topn, TOPN, index) if topn is not None else None
            out.append(
                guard.apply([normalize(topn_partial(definition, rows))])[0]
                if rows is not None and rows.num_rows
                else empty_like(definition)
            )
    overflow.update(guard.folded)
    return out


def _read_report(
    splits: Sequence[Split] | Mapping[int, Split], meta: pa.Table
) -> tuple[ReadStats, list[tuple[str, int, Any, str]], dict[int, tuple[int, int] | None]]:
    """Counts summed over the SPLIT rows; rejects (file line numbers) in file then line order; per split, where a
    whole text file's read stopped (the furthest, when several tasks read parts of one split)."""
    stats = ReadStats()
    by_index = splits if isinstance(splits, Mapping) else {s.index: s for s in splits}
    ends: dict[int, tuple[int, int] | None] = {}
    for d, info in zip(*(select_rows(meta, SPLIT).column(c).to_pylist() for c in ("d", "info"))):
        report = json.loads(info)
        part = ReadStats(report["read"], report["accepted"], report["rejected"], Counter(report["reasons"]),
                         Counter(report.get("warnings") or {}))  # fmt: skip
        stats.merge(part)
        end = report["end"]
        if end is None:
            ends.setdefault(d, None)
        elif (seen := ends.get(d)) is None or seen < (int(end[0]), int(end[1])):
            ends[d] = (int(end[0]), int(end[1]))
    rejected = select_rows(meta, REJECT)
    columns = [rejected.column(c).to_pylist() for c in ("d", "line", "raw", "reason")]
    order: dict[str, int] = {}  # the paths in split order
    for d in sorted(set(columns[0])):
        order.setdefault(by_index[d].path, len(order))
    rejects = [(by_index[d].path, line, json.loads(raw), reason) for d, line, raw, reason in zip(*columns)]
    rejects.sort(key=lambda r: (order[r[0]], r[1]))
    return stats, rejects, ends


def _task_tiers(meta: pa.Table) -> Counter[tuple[str, str]]:
    tiers: Counter[tuple[str, str]] = Counter()
    for info in select_rows(meta, TASK).column("info").to_pylist():
        report = json.loads(info)
        tiers[(report.get("native", ""), report.get("missing", ""))] += 1
    return tiers


_TIERS_SAID: set[tuple[str, str]] = set()  # each (tier, why) is logged once per driver process


def describe_tiers(tiers: Counter[tuple[str, str]]) -> str:
    """One phrase for a run's summary: the native tier and its C extensions, or the Python fallback and why (the
    tasks' most common report, with how many tasks ran otherwise)."""
    if not tiers:
        return ""
    (ran, why), n = tiers.most_common(1)[0]
    phrase = (f"the native tier ({len(ran.split(',')) if ran else 0} C extensions)" if not why
              else f"the Python fallback where a C extension was missing ({why})")  # fmt: skip
    others = sum(tiers.values()) - n
    return phrase + (f"; {others} other task(s) ran otherwise" if others else "")


def _say_tiers(tiers: Counter[tuple[str, str]]) -> None:
    """Log once which tier the executors' tasks ran: the C extensions, or the Python fallback and why."""
    for key in tiers:
        if key in _TIERS_SAID:
            continue
        _TIERS_SAID.add(key)
        ran, why = key
        if why:
            log.warning("Spark tasks ran the Python fallback for what they lack (%s); C extensions in use: %s", why,
                        ran or "none")  # fmt: skip
        else:
            log.info("Spark tasks ran the native tier: %s", ran or "none")


def _task_times(meta: pa.Table) -> dict[str, list[tuple[float, int, float]]]:
    out: dict[str, list[tuple[float, int, float]]] = {}
    for info in select_rows(meta, TASK).column("info").to_pylist():
        report = json.loads(info)
        out.setdefault(report["stage"], []).append((report["seconds"], report["events"], report["cpu_s"]))
    return out


# ------------------------------------------------------------------------------------------ a pipeline run


def _accumulators(spark: SparkSession) -> tuple[Any, Any] | None:
    """The progress counters (events, bytes) tasks add to; None under Spark Connect (no accumulators, no progress)."""
    if is_connect(spark):
        return None
    context = spark.sparkContext
    return context.accumulator(0), context.accumulator(0)


class _ProgressPoller:
    """Calls ``progress(events, bytes)`` every ``every_s`` from the accumulators (updated as tasks end)."""

    def __init__(
        self,
        progress: Progress | None,
        accumulators: tuple[Any, Any] | None,
        base: tuple[int, int],
        every_s: float = 0.5,
    ) -> None:
        self.progress, self.accumulators, self.base, self.every_s = progress, accumulators, base, every_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if progress is not None and accumulators is not None:
            self._thread = threading.Thread(target=self._run, name="drainpipe-spark-progress", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.report()

    def report(self) -> None:
        if self.progress is not None and self.accumulators is not None:
            self.progress(self.base[0] + self.accumulators[0].value, self.base[1] + self.accumulators[1].value)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.report()


def ingest_files(
    spark: SparkSession,
    paths: Sequence[str],
    definitions: Definitions,
    store: Store,
    dead_letter: DeadLetter | None,
    options: JobOptions = JobOptions(),
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Aggregate ``paths`` on Spark and merge the states into ``store`` in one transaction per group of files.

    Exactly once, on the exactly-once driver (:class:`~drainpipe.pipeline.Driver`) with the local engine's books:
    each file is read from where the store has it applied (nothing, for a file stored in full), and the transaction
    that writes the states records how far each file is now applied. A file stored for some definitions only (the
    definitions changed) is aggregated for the missing ones (the driver's policy; a group per set of definitions,
    the fewest first). Rejects go to ``dead_letter`` before the store commit (a crash in between repeats them on the
    re-run: the dead letter is at least once, the store exactly once). Returns the counts, the stage times and the
    task-time spread.
    """
    t0 = time.perf_counter()
    cores = parallelism(spark)
    names = frozenset(definitions.names)
    store.register(definitions.all)
    files = [resolve(path, store, names) for path in dict.fromkeys(paths)]
    commits = JobCommit(store)
    driver = Driver(definitions, commits, dead_letter=dead_letter)
    for file in files:
        driver.hold(file.path, file)
    groups: dict[frozenset[str], list[tuple[InputFile, Part]]] = {}
    unchanged = 0
    for file in files:
        parts = (
            []
            if file.done
            else list(
                plan_parts(
                    file.path,
                    options.batch_rows,
                    workers=cores,
                    start=file.start,
                    hasher=file.hasher,
                    options=InputOptions(
                        options.service, definitions.spans, definitions.endpoints, options.log_format
                    ),  # fmt: skip
                )
            )
        )
        unchanged += not parts  # stored in full by an earlier run: nothing new
        for part in parts:
            groups.setdefault(driver.wanted(file, part.start_offset), []).append((file, part))
    stats = ReadStats()
    summary: dict[str, Any] = {
        "files": len(files),
        "unchanged_files": unchanged,
        "splits": 0,
        "applied": 0,
        "metrics_rows": 0,
        "topn_rows": 0,
        "pending": {},
        "overflow": Counter(),  # per scope: state rows folded into __overflow__ (the cardinality guard)
        "stage_s": {},
        "spread": {},
        "tiers": Counter(),  # tasks per (C extensions their Python ran, why any was missing)
    }
    accumulators = _accumulators(spark) if progress is not None else None
    poller = _ProgressPoller(progress, accumulators, (0, 0))
    try:
        for wanted, items in driver.in_order(groups):
            selected = definitions.select(wanted)
            splits = plan_splits([part for _, part in items])
            # a large input's merged metric states reach the driver one partition at a time; a small one's at once
            # (the streamed merge's 64 partitions' jobs cost seconds: half of a small stream's micro-batch)
            stream = sum(part.nbytes for _, part in items) > STREAM_METRICS_ABOVE_BYTES
            job = replace(options, stream_metrics=stream, driver_merge=options.driver_merge and not stream)
            result = aggregate_splits(spark, splits, selected, job, accumulators)
            for (file, part), split in zip(items, splits):
                end = result.ends.get(split.index)
                position = part.end_position
                if position is None and file.growable and end is not None:
                    position = Position(*end)
                file.advance(wanted, position, part.prefix)
            if dead_letter is not None:
                for path, line, raw, reason in result.rejects:
                    dead_letter.write(path, line, raw, reason)
            metric_rows = [0]

            def chunks(result: JobResult = result, metric_rows: list[int] = metric_rows) -> Iterator[Partial]:
                for partial in result.all_partials():  # (exact per chunk: a chunk has all of its entities)
                    if isinstance(partial, MetricPartial):
                        metric_rows[0] += _value_rows([partial], metrics=True)
                    yield partial

            try:
                commits.stage(selected.all, chunks())
                driver.fed(result.stats.accepted)
                driver.checkpoint(wait=True)  # the dead letter flushed, then every file's books with the states
            finally:
                if result.release is not None:
                    result.release()
            report = commits.report
            summary["pending"].update({f.path: f.pending() for f in files if f.pending()})
            stats.merge(result.stats)
            summary["splits"] += len(splits)
            summary["applied"] += report.applied
            summary["metrics_rows"] += metric_rows[0]
            summary["topn_rows"] += _value_rows(result.partials, metrics=False)
            summary["overflow"].update(result.overflow)  # complete: merge_chunks consumed every chunk
            for stage, seconds in result.stage_s.items():
                summary["stage_s"][stage] = summary["stage_s"].get(stage, 0.0) + seconds
            summary["spread"].update(result.spread())
            summary["tiers"].update(result.tiers)
            if result.placement is not None:
                summary["placement"] = {
                    "partitions": result.placement.partitions,
                    "salted": result.placement.salted,
                    "expected_ratio": result.placement.expected_ratio,
                }
    finally:
        poller.close()
    elapsed = time.perf_counter() - t0
    summary.update(
        read=stats.read,
        accepted=stats.accepted,
        rejected=stats.rejected,
        dropped=0,
        reasons=dict(stats.reasons),
        warnings=dict(stats.warnings),
        elapsed_s=elapsed,
        events_per_s=stats.accepted / elapsed if elapsed > 0 else 0.0,
        executors=describe_tiers(summary["tiers"]),
    )
    return summary


def _value_rows(partials: Sequence[Partial], *, metrics: bool) -> int:
    """Value rows the partials update: metric rows over minute, hour and day buckets (distinct keys times
    labels), or top-N rows."""
    total = 0
    for partial in partials:
        table = partial.table
        if not table.num_rows or metrics != isinstance(partial, MetricPartial):
            continue
        if not metrics:
            total += table.num_rows
            continue
        assert isinstance(partial.definition, MetricDef)
        labels = len(PERCENTILE_LABELS) if partial.definition.function == "percentile" else 1
        # a partial's key columns are unique (Partial's contract): (entity, bucket) holds a minute's value rows
        # once a percentile's bins are folded; each coarser granularity's are counted over the finer one's keys
        keys = table.select(["entity", "bucket"])
        if not partial.one_row_per_key:
            keys = _distinct(keys)
        total += keys.num_rows * labels
        for width in sorted(w for w in GRANULARITY_MS.values() if w != GRANULARITY_MS["minute"]):
            slots = pa.array(keys.column("bucket").to_numpy() // width * width)
            keys = _distinct(pa.table({"entity": keys.column("entity"), "bucket": slots}))
            total += keys.num_rows * labels
    return total


def _distinct(keys: pa.Table) -> pa.Table:
    """The distinct ``(entity, bucket)`` rows of ``keys``."""
    return keys.group_by(["entity", "bucket"], use_threads=False).aggregate([])

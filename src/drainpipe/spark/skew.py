"""Skew-aware placement of per-type work on Spark partitions, and the task-time spread it is judged by.

Per-type work is work Spark cannot partially aggregate by itself (a pandas/Arrow function over all events of a
type: the top-N, user handlers). Spark's own answer, ``groupBy(type).applyInPandas`` or ``repartition(type)``,
hashes each type to one partition, so under Zipf skew the hot type is one giant task. Here instead:

1. **weights** per type are measured on a sample (:func:`sample_weights`; the engine's own scan samples the
   head of every input split) or passed in (``JobOptions.weights``, e.g. the previous window's counts);
2. **salting**: a type heavier than ``split_share`` of a fair partition load is split into
   ``ceil(weight / (split_share * fair))`` salted sub-groups (rows are dealt round-robin within each input
   partition), so no sub-group outweighs half a partition;
3. **placement**: the sub-groups are placed on partitions with :meth:`drainpipe.DrainBalancer.place`, the queue's
   LPT planner (heaviest first onto the least loaded partition); types the sample did not see are hashed;
4. the rows are moved with ``DataFrame.repartitionById`` (Spark >= 4.1: the partition is the ``_pid`` value,
   no hashing), the work runs per partition, and the sub-groups' **partial states are merged** (they are
   mergeable states: :func:`drainpipe.pipeline.partials.merge` or exact Spark aggregates).

The partition of a row is a Spark expression (:meth:`Placement.column`: a literal map type -> sub-group
partitions, the salt from ``monotonically_increasing_id``), so rows never detour through Python before the
shuffle; the map lookup is linear in the planned types, fine for the hundreds a sample sees.

:func:`hash_placement` is the "without" baseline (Spark's hash partitioning of the type, one group per type).
:func:`task_spread` summarises task times (from the TASK rows the tasks emit) as max / median.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from drainpipe import DrainBalancer

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import Column, DataFrame

__all__ = ["Placement", "plan_placement", "hash_placement", "sample_weights", "place", "task_spread", "PID_COLUMN"]

PID_COLUMN = "_pid"
DEFAULT_SPLIT_SHARE = 0.5


@dataclass(frozen=True)
class Placement:
    """Where each type's rows go: ``bins[type]`` lists the partition of each of its salted sub-groups.

    An empty ``bins`` is plain hash placement. ``loads`` are the expected partition loads (sampled weights).
    """

    partitions: int
    bins: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    loads: tuple[float, ...] = ()
    weights: Mapping[str, float] = field(default_factory=dict)

    @property
    def salted(self) -> dict[str, int]:
        """Types split into more than one sub-group, with their number of sub-groups."""
        return {t: len(b) for t, b in self.bins.items() if len(b) > 1}

    @property
    def expected_ratio(self) -> float:
        """max / median of the expected partition loads (1.0 = perfectly even)."""
        if not self.loads:
            return float("nan")
        median = statistics.median(self.loads)
        return max(self.loads) / median if median > 0 else float("inf")

    def column(self, type_column: str) -> Column:
        """The Spark expression of each row's target partition (an int in ``[0, partitions)``): for a planned
        type, its sub-groups' partitions dealt round-robin by row; otherwise the type's hash."""
        from pyspark.sql import functions as F

        fallback = F.pmod(F.hash(F.col(type_column)), F.lit(self.partitions))
        if not self.bins:
            return fallback.cast("int")
        # type -> [partition of each sub-group] (a literal map: fine for the few hundred types a sample sees)
        pairs: list[Any] = []
        for name, bins in self.bins.items():
            pairs += [F.lit(name), F.array(*(F.lit(b) for b in bins))]
        targets = F.try_element_at(F.create_map(*pairs), F.col(type_column))
        salt = F.pmod(F.monotonically_increasing_id(), F.size(targets))
        return F.coalesce(F.try_element_at(targets, (salt + 1).cast("int")), fallback).cast("int")


def plan_placement(
    weights: Mapping[str, float], partitions: int, *, split_share: float = DEFAULT_SPLIT_SHARE
) -> Placement:
    """Salt the hot types and place all sub-groups with LPT (see the module docstring)."""
    if partitions < 1:
        raise ValueError("partitions must be >= 1")
    items = sorted((t, w) for t, w in weights.items() if w > 0)
    total = sum(w for _, w in items)
    if not items:
        return Placement(partitions, {}, (0.0,) * partitions, dict(weights))
    limit = max(split_share * total / partitions, 1e-12)
    groups: list[tuple[str, float]] = []
    for name, weight in items:
        pieces = min(partitions, max(1, math.ceil(weight / limit)))
        groups += [(name, weight / pieces)] * pieces
    # the planner takes integer weights: scale so that the lightest group keeps a few significant digits
    scale = 1_000_000 / max(w for _, w in groups)
    placed = DrainBalancer.place([max(1, round(w * scale)) for _, w in groups], partitions)
    bins: dict[str, list[int]] = {}
    loads = [0.0] * partitions
    for (name, weight), b in zip(groups, placed):
        bins.setdefault(name, []).append(b)
        loads[b] += weight
    return Placement(partitions, {t: tuple(b) for t, b in bins.items()}, tuple(loads), dict(weights))


def hash_placement(partitions: int, weights: Mapping[str, float] | None = None) -> Placement:
    """Spark's own placement of a type (``pmod(hash(type), partitions)``), for comparison."""
    loads: tuple[float, ...] = ()
    if weights:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        if spark is not None:
            names = sorted(weights)
            rows = (
                spark.createDataFrame([(n,) for n in names], "t string")
                .selectExpr("t", f"pmod(hash(t), {partitions}) AS p")
                .collect()
            )
            acc = [0.0] * partitions
            for row in rows:
                acc[row.p] += weights[row.t]
            loads = tuple(acc)
    return Placement(partitions, {}, loads, dict(weights or {}))


def sample_weights(df: DataFrame, type_column: str, fraction: float = 0.02, seed: int = 7) -> dict[str, float]:
    """Rows per type in a Bernoulli sample of ``df``, scaled back by ``1 / fraction``."""
    counts = df.sample(fraction=fraction, seed=seed).groupBy(type_column).count().collect()
    return {row[0]: row[1] / fraction for row in counts if row[0] is not None}


def weights_from_counts(rows: Iterable[tuple[str, float]]) -> dict[str, float]:
    """Sum (type, weight) pairs (e.g. the previous window's event counts per type)."""
    out: dict[str, float] = {}
    for name, weight in rows:
        if name is not None:
            out[name] = out.get(name, 0.0) + float(weight)
    return out


def place(df: DataFrame, placement: Placement, type_column: str) -> DataFrame:
    """``df`` moved to its planned partitions: ``repartitionById`` on the :data:`PID_COLUMN` column."""
    with_pid = df.withColumn(PID_COLUMN, placement.column(type_column))
    if hasattr(with_pid, "repartitionById"):
        return with_pid.repartitionById(placement.partitions, PID_COLUMN)
    return with_pid.repartition(placement.partitions, PID_COLUMN)  # Spark 4.0: hash of the id (close enough)


def task_spread(seconds: Iterable[float]) -> dict[str, float]:
    """``{"tasks", "max_s", "median_s", "ratio"}`` of task times (ratio = max / median)."""
    values = sorted(float(s) for s in seconds)
    if not values:
        return {"tasks": 0, "max_s": 0.0, "median_s": 0.0, "ratio": float("nan")}
    median = statistics.median(values)
    return {
        "tasks": len(values),
        "max_s": values[-1],
        "median_s": median,
        "ratio": values[-1] / median if median > 0 else float("inf"),
    }

"""A file job whose first action's count fails once on partition 0 after the partition was cached, so that the
retry reads the cached partition (its task function does not run again): prints one JSON line comparing the job
with the same job run without the failure. Run by ``test_spark_states.py`` in a process of its own: the session
needs ``local[2,2]`` (a failed task is retried once, as on a cluster).

    python retry_child.py INPUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # tests/ (jvm_archive, for the conftest's TEST_CONF)
from pyspark.core.rdd import RDD
from spark_testlib import assert_same_partials

from conftest import TEST_CONF
from drainpipe.inputs import plan_parts
from drainpipe.pipeline import DEFAULT_DEFINITIONS
from drainpipe.spark import spark_session
from drainpipe.spark.engine import aggregate_splits
from drainpipe.spark.splits import plan_splits


def count_failing_once_after_the_cache(self: RDD[Any]) -> int:
    """``RDD.count``, whose first attempt on partition 0 fails after reading (and so caching) its partition."""

    def count(rows: Any) -> Any:
        from pyspark import TaskContext

        n = sum(1 for _ in rows)
        context = TaskContext.get()
        if context.partitionId() == 0 and context.attemptNumber() == 0:
            raise RuntimeError("the first attempt fails after its partition was cached")
        yield n

    return self.mapPartitions(count).sum()


def main(path: str) -> None:
    spark = spark_session("local[2,2]", TEST_CONF, app_name="drainpipe-retry")
    splits = plan_splits(list(plan_parts(path, 2_000, workers=2)))
    reference = aggregate_splits(spark, splits, DEFAULT_DEFINITIONS)
    RDD.count = count_failing_once_after_the_cache  # type: ignore[method-assign]
    retried = aggregate_splits(spark, splits, DEFAULT_DEFINITIONS)
    same = True
    try:
        assert_same_partials(reference.partials, retried.partials)
    except AssertionError:
        same = False
    print(json.dumps({"read": [reference.stats.read, retried.stats.read], "same_partials": same,
                      "tasks": [len(reference.tasks.get("scan+aggregate", [])),
                                len(retried.tasks.get("scan+aggregate", []))]}))  # fmt: skip
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])

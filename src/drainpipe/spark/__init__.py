"""The metrics pipeline on Apache Spark (PySpark >= 4.0): batch over files, streaming over a directory.

Contract (``docs/pipeline.md``, "Engines"):

* Same definitions, same code: events are read and validated by :mod:`drainpipe.inputs` (the same
  rules, reasons and dead-letter records as the local engine), partially aggregated per Spark task by
  :func:`drainpipe.pipeline.aggregate.aggregate_batch`, merged across tasks with Spark's ``sum``/``min``/``max``
  as each state column's shared merge operation prescribes (exact for integer states and min/max) and
  :func:`~drainpipe.pipeline.partials.merge` for the top-N, and written by the driver through
  :mod:`drainpipe.pipeline.store` (one transaction; hour and day roll-ups by the store). Results equal the local
  engine's row for row; float sums (``sum``/``avg`` values) may differ in the last ulp because additions happen
  in another order (the local engine itself is not order-stable there either).
* Idempotent: every file has a source identity (``path@size:mtime_ns``) recorded per definition in the same
  transaction as the states; re-running a file changes nothing, a new file adds to the states.
* ``read == accepted + rejected`` always; rejects go to the dead letter (``<store>.rejected.jsonl`` by default)
  with the local engine's record format, line numbers and order.
* A local session's workers run this interpreter (``PYSPARK_PYTHON``); every executor imports drainpipe from
  the zip the job ships (:func:`~drainpipe.spark.session.code_zip`), its C extensions where they load; input
  paths must be readable on the executors (a shared filesystem), as for any ``file://`` input.

Entry points: :func:`run_batch`, :func:`run_stream`, :func:`check_java`; :mod:`drainpipe.spark.skew` holds the
skew-aware placement of per-type work. The names load on first use (PEP 562): importing the package imports
neither pyspark nor numpy, so that a local session's Python daemon (:mod:`drainpipe.spark.daemon`) can start from
it without a thread before it forks its workers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - for type checkers: the names as if imported eagerly
    from .batch import default_dead_letter, run_batch
    from .engine import PER_TYPE_MODES, JobOptions
    from .kafka import KafkaTopics
    from .session import check_java, check_pyspark, short_lived_jvm, spark_session
    from .stream import run_stream

__all__ = [
    "run_batch",
    "run_stream",
    "KafkaTopics",
    "check_java",
    "check_pyspark",
    "spark_session",
    "short_lived_jvm",
    "JobOptions",
    "PER_TYPE_MODES",
    "default_dead_letter",
]

_HOMES = {
    "run_batch": "batch",
    "default_dead_letter": "batch",
    "run_stream": "stream",
    "KafkaTopics": "kafka",
    "check_java": "session",
    "check_pyspark": "session",
    "spark_session": "session",
    "short_lived_jvm": "session",
    "JobOptions": "engine",
    "PER_TYPE_MODES": "engine",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{home}", __name__), name)

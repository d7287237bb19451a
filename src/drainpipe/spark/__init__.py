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
* Workers run this interpreter (``PYSPARK_PYTHON``); on a cluster, drainpipe must be installed on the
  executors and the input paths readable there (a shared filesystem), as for any ``file://`` input.

Entry points: :func:`run_batch`, :func:`run_stream`, :func:`check_java`; :mod:`drainpipe.spark.skew` holds the
skew-aware placement of per-type work. Importing this package does not import pyspark.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from drainpipe.inputs import DeadLetter, LogFormat, default_dead_letter, detect_format, expand_inputs
from drainpipe.pipeline import DEFAULT_DEFINITIONS, DEFAULT_STORE_URL, Definitions

from .engine import PER_TYPE_MODES, JobOptions, ingest_files
from .kafka import KafkaTopics
from .session import add_rate, check_java, check_pyspark, job, short_lived_jvm, spark_session

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

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


def run_batch(
    inputs: Sequence[str],
    *,
    definitions: Definitions = DEFAULT_DEFINITIONS,
    store_url: str = DEFAULT_STORE_URL,
    master: str = "local[*]",
    conf: Mapping[str, str] | None = None,
    dead_letter: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    spark: SparkSession | None = None,
    options: JobOptions | None = None,
    quiet: bool = False,
    service: str = "",
    remote: str | None = None,
    log_format: LogFormat | None = None,
) -> dict[str, Any]:
    """Process event files (paths or globs: JSON Lines, CSV, each optionally gzipped, Parquet) on Spark.

    Input and store problems raise before Spark starts (``InputError``/``StoreError``, one line); no usable
    Java or pyspark raises :class:`SparkSetupError`. ``progress(events_read, bytes_done)`` is called about
    twice a second. ``spark``: an existing session to use (it is left running); otherwise one is built from
    ``master`` and ``conf`` and stopped at the end. ``options``: :class:`JobOptions` (per-type mode, split
    size, ...), none of which changes results. ``quiet``: the JVM's own output goes to a log file. ``remote``: a Spark
    Connect URL (``sc://host:port``; default ``$SPARK_REMOTE``) instead of ``master``. Input paths are made absolute
    here, on the driver, and the job ships drainpipe's task code: the executors need nothing of ours installed.

    Returns ``read accepted rejected dropped`` (``dropped`` is always 0 for files), ``metrics_rows`` (metric
    value rows updated, all granularities), ``topn_rows``, ``elapsed_s``, ``events_per_s`` and details:
    ``files unchanged_files splits pending reasons stage_s spread dead_letter``, ``start_s`` (seconds before the
    job could start: the session's start, unless one was handed in) and ``executors`` (which tier their tasks ran).
    """
    t0 = time.perf_counter()
    # absolute, resolved here on the driver: executors run in their own working directories
    paths = [os.path.abspath(p) for p in expand_inputs(list(inputs))]
    for path in paths:
        detect_format(path)
    target = dead_letter or default_dead_letter(store_url)
    with job(store_url, master, conf, spark, quiet, remote) as (store, session), DeadLetter(target) as dl:
        start_s = time.perf_counter() - t0  # the session's start (none when one was handed in), the store's open
        job_options = replace(options or JobOptions(), service=service or (options.service if options else ""))
        if log_format is not None:
            job_options = replace(job_options, log_format=log_format)
        summary = ingest_files(session, paths, definitions, store, dl, job_options, progress)
    summary.update(dead_letter=target, start_s=start_s)
    return add_rate(summary, t0)


def run_stream(input_dir: str | KafkaTopics, **kwargs: Any) -> dict[str, Any]:
    """Structured Streaming over a directory of new files, or Kafka topics (:class:`KafkaTopics`); see
    :func:`drainpipe.spark.stream.run_stream`."""
    from .stream import run_stream as _run_stream

    return _run_stream(input_dir, **kwargs)

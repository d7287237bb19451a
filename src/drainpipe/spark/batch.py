"""``run_batch``: event files into a store on Spark, one job per group of files (:func:`~.engine.ingest_files`)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from drainpipe.inputs import DeadLetter, LogFormat, default_dead_letter, detect_format, expand_inputs
from drainpipe.pipeline import DEFAULT_DEFINITIONS, DEFAULT_STORE_URL, Definitions

from .engine import JobOptions, ingest_files
from .session import add_rate, job

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

__all__ = ["run_batch", "default_dead_letter"]


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
    keep_session: bool = False,
) -> dict[str, Any]:
    """Process event files (paths or globs: JSON Lines, CSV, each optionally gzipped, Parquet) on Spark.

    Input and store problems raise before Spark starts (``InputError``/``StoreError``, one line); no usable
    Java or pyspark raises :class:`SparkSetupError`. ``progress(events_read, bytes_done)`` is called about
    twice a second. ``spark``: an existing session to use (it is left running); otherwise one is built from
    ``master`` and ``conf`` and stopped at the end, unless ``keep_session`` (a command that exits right after:
    its JVM stops itself when the process exits, its standard input closing, and Spark's shutdown hook removes
    its files, without the 0.3-0.5 s ``stop()`` takes). ``options``: :class:`JobOptions` (per-type mode, split
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
    with job(store_url, master, conf, spark, quiet, remote, keep_session) as (store, session), DeadLetter(target) as dl:
        start_s = time.perf_counter() - t0  # the session's start (none when one was handed in), the store's open
        job_options = replace(options or JobOptions(), service=service or (options.service if options else ""))
        if log_format is not None:
            job_options = replace(job_options, log_format=log_format)
        summary = ingest_files(session, paths, definitions, store, dl, job_options, progress)
    summary.update(dead_letter=target, start_s=start_s)
    return add_rate(summary, t0)

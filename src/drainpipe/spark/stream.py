"""Streaming mode: Structured Streaming over a directory of new event files (or Kafka topics, :mod:`.kafka`),
exactly once into the store.

The stream's source is Spark's file source (``binaryFile`` format, only the ``path`` column is read, so file
contents never pass through it): it lists the directory, and the checkpoint's offset log pins which new files
make up each micro-batch. ``foreachBatch`` hands those paths to :func:`drainpipe.spark.engine.ingest_files`,
the batch engine, so a micro-batch is parsed, validated, aggregated and merged exactly like ``run_batch``.

Exactly once: Spark writes micro-batch N's files to the offset log before running it and marks it in the commit
log after ``foreachBatch`` returns; after a crash, a batch without a commit entry is run again with the same
files. The store records the source ids of each file's blocks (content fingerprint, block size, block index:
:mod:`drainpipe.inputs.parts`) per definition in the same transaction as its states, so the re-run finds them
applied and skips them (or applies them, if the crash came before the store commit). A killed and restarted
stream therefore ends with exactly the values of an uninterrupted one. The dead letter is appended to before
each store commit, so a crash between the two repeats those rejects: it is at-least-once.

Files must appear atomically (write elsewhere, then rename into the directory), as for any Spark file source.
Names with an unsupported suffix are skipped and counted (``ignored_files``).

Through Spark Connect (``remote``), Spark runs the ``foreachBatch`` function in a Python process on the Connect
server, not in this client: the function (:class:`_ConnectBatches`) carries only plain data (definitions, options,
the store URL and the dead letter's path), opens the store there for each micro-batch, and leaves its running
totals in a global temporary view of the server's application, which the client reads when the query ends.
Hence the Connect server's Python needs drainpipe and its store driver (duckdb or psycopg) installed, and the store
must be reachable from the server (a PostgreSQL URL, or a DuckDB path on the server's machine); the executors
still need nothing of ours. A per-batch callback (``on_batch``) is pickled with the function and runs there too.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from drainpipe.errors import InputError, first_line
from drainpipe.inputs import DeadLetter, default_dead_letter, detect_format
from drainpipe.pipeline import DEFAULT_DEFINITIONS, DEFAULT_STORE_URL, Definitions

from .engine import JobOptions, ingest_files
from .kafka import KafkaTopics, connector_package, ingest_messages
from .session import add_rate, is_connect, job, job_session

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["run_stream", "STREAM_GLOB"]

log = logging.getLogger("drainpipe.spark.stream")

#: names the stream picks up (others are never listed)
STREAM_GLOB = "*.{jsonl,json,ndjson,csv,gz,parquet}"
_SUMMED = ("read", "accepted", "rejected", "files", "unchanged_files", "splits", "applied", "metrics_rows", "topn_rows")


def _local_path(uri: str) -> str:
    """``file:/a/b%20c`` -> ``/a/b c`` (other schemes are passed through)."""
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme == "file":
        return urllib.request.url2pathname(parsed.path)
    return uri


def run_stream(
    input_dir: str | KafkaTopics,
    *,
    definitions: Definitions = DEFAULT_DEFINITIONS,
    store_url: str = DEFAULT_STORE_URL,
    checkpoint: str,
    master: str = "local[*]",
    conf: Mapping[str, str] | None = None,
    trigger_once: bool = False,
    stop_after_s: float | None = None,
    dead_letter: str | None = None,
    spark: SparkSession | None = None,
    options: JobOptions | None = None,
    poll_s: float = 1.0,
    max_files_per_trigger: int | None = None,
    on_batch: Callable[[int, dict[str, Any]], None] | None = None,
    remote: str | None = None,
) -> dict[str, Any]:
    """Run the pipeline over the files arriving in ``input_dir`` (or the messages of Kafka topics) until stopped.

    ``trigger_once``: process everything present now (in as many micro-batches as ``max_files_per_trigger``
    makes) and return. Otherwise poll every ``poll_s`` seconds until ``stop_after_s`` elapses (None: until
    interrupted). ``checkpoint`` is the Structured Streaming checkpoint directory: restart with the same one to
    resume. ``on_batch(batch_id, summary)`` is called after each micro-batch's store commit (through Spark
    Connect it runs on the server, so it must pickle, and its output goes to the server's log).

    Returns the summed counts (``read accepted rejected files unchanged_files ignored_files metrics_rows
    topn_rows``), ``batches``, ``elapsed_s`` and ``events_per_s``. ``remote``: a Spark Connect URL (default
    ``$SPARK_REMOTE``), see the module docstring.
    """
    t0 = time.perf_counter()
    remote = remote or os.environ.get("SPARK_REMOTE") or None
    if isinstance(input_dir, KafkaTopics):  # (under Connect, the server is started with the connector)
        packages = ",".join(filter(None, [(conf or {}).get("spark.jars.packages"), connector_package()]))
        conf = {**(conf or {}), "spark.jars.packages": packages}
    elif not os.path.isdir(input_dir):
        raise InputError(f"stream input {input_dir!r} is not a directory")
    else:
        input_dir = os.path.abspath(input_dir)
    if remote is not None or (spark is not None and is_connect(spark)):
        totals = _run_connect(
            input_dir, definitions, store_url, checkpoint, master, conf, trigger_once, stop_after_s,
            dead_letter, spark, options or JobOptions(), poll_s, max_files_per_trigger, remote, on_batch,
        )  # fmt: skip
        return add_rate(totals, t0)
    with (
        job(store_url, master, conf, spark) as (store, session),
        DeadLetter(dead_letter or default_dead_letter(store_url)) as dl,
    ):
        kafka = input_dir if isinstance(input_dir, KafkaTopics) else None
        batches = _MicroBatches(session, definitions, store, dl, options or JobOptions(), on_batch, kafka)
        try:
            query = _start(session, input_dir, checkpoint, batches, trigger_once, poll_s, max_files_per_trigger)
            _await(query, None if trigger_once else stop_after_s)
        finally:
            totals = batches.release()
    totals.update(dropped=0)
    return add_rate(totals, t0)


class _MicroBatches:
    """The ``foreachBatch`` function: each micro-batch's new files through :func:`ingest_files`.

    Py4J may keep the function alive after the query ends, so :meth:`release` drops its references to the
    session, store and dead letter (and returns the totals)."""

    def __init__(
        self,
        session: SparkSession,
        definitions: Definitions,
        store: Any,
        dead_letter: DeadLetter,
        options: JobOptions,
        on_batch: Callable[[int, dict[str, Any]], None] | None,
        kafka: KafkaTopics | None = None,
    ) -> None:
        self._context: dict[str, Any] = {
            "kafka": kafka,
            "session": session,
            "definitions": definitions,
            "store": store,
            "dead_letter": dead_letter,
            "options": options,
            "on_batch": on_batch,
        }
        self.totals = _new_totals()
        self._lock = threading.Lock()

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        c = self._context
        summary, ignored = _ingest_batch(frame, c["session"], c["definitions"], c["store"], c["dead_letter"],
                                         c["options"], c["kafka"])  # fmt: skip
        c["options"] = _next_options(c["options"], summary, c["kafka"])
        with self._lock:
            _add(self.totals, summary, ignored)
        if c["on_batch"] is not None:
            c["on_batch"](batch_id, summary)

    def release(self) -> dict[str, Any]:
        self._context.clear()
        return _plain(self.totals)


def _new_totals() -> dict[str, Any]:
    totals: dict[str, Any] = {key: 0 for key in _SUMMED}
    totals.update(batches=0, ignored_files=0, reasons=Counter(), warnings=Counter(), overflow=Counter())
    return totals


def _plain(totals: dict[str, Any]) -> dict[str, Any]:
    """The totals with plain dicts for their counters (as JSON writes them)."""
    return dict(totals, reasons=dict(totals["reasons"]), warnings=dict(totals["warnings"]),
                overflow=dict(totals["overflow"]))  # fmt: skip


def _add(totals: dict[str, Any], summary: dict[str, Any], ignored: int) -> None:
    for key in _SUMMED:
        totals[key] += summary.get(key, 0)
    totals["reasons"].update(summary.get("reasons") or {})
    totals["warnings"].update(summary.get("warnings") or {})
    totals["overflow"].update(summary.get("overflow") or {})
    totals["batches"] += 1
    totals["ignored_files"] += ignored


def _next_options(options: JobOptions, summary: dict[str, Any], kafka: KafkaTopics | None) -> JobOptions:
    """The next micro-batch's job options. A Kafka stream's next batch reads at most ``max_messages``: its states
    are collected in the job's one action and merged on the driver if this batch's state rows per message, times
    that bound, come to at most ``driver_merge_rows``. Otherwise (a file stream, no bound, a batch that read
    nothing) the job persists its states and looks first (:func:`~drainpipe.spark.engine.merge_states`)."""
    rows, messages = summary.get("state_rows", 0), summary.get("messages", 0)
    bound = kafka.max_messages if kafka is not None else None
    few = bool(bound and rows and messages) and rows * bound / messages <= options.driver_merge_rows
    return replace(options, driver_merge=few)


def _ingest_batch(
    frame: DataFrame,
    session: Any,
    definitions: Definitions,
    store: Any,
    dead_letter: DeadLetter,
    options: JobOptions,
    kafka: KafkaTopics | None = None,
) -> tuple[dict[str, Any], int]:
    """One micro-batch: its messages through :func:`ingest_messages` (``kafka``), or its new files' paths through
    :func:`ingest_files`: (its summary, files skipped)."""
    if kafka is not None:
        return ingest_messages(session, frame, kafka, definitions, store, dead_letter, options), 0
    paths, ignored = [], 0
    for row in frame.select("path").collect():
        path = _local_path(row.path)
        try:
            detect_format(path)
        except InputError:
            ignored += 1
            log.warning("stream: skipping %s (unsupported suffix)", path)
            continue
        paths.append(path)
    summary = ingest_files(session, sorted(paths), definitions, store, dead_letter, options) if paths else {}
    return summary, ignored


class _ConnectBatches:
    """The ``foreachBatch`` function under Spark Connect: it runs on the Connect server, in one long-lived Python
    process per query, so it holds plain data only (it is pickled there) and opens the store for each micro-batch
    (a DuckDB file is then free between batches). After each batch the running totals go to the global temporary
    view ``view`` (the function's session is not the client's, but both are in the server's application)."""

    def __init__(self, definitions: Definitions, store_url: str, dead_letter: str, options: JobOptions,
                 view: str, kafka: KafkaTopics | None = None,
                 on_batch: Callable[[int, dict[str, Any]], None] | None = None) -> None:  # fmt: skip
        self.definitions, self.store_url, self.dead_letter, self.options, self.view = (
            definitions, store_url, dead_letter, options, view)  # fmt: skip
        self.kafka, self.on_batch = kafka, on_batch
        self.totals = _new_totals()

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        import json

        from drainpipe.pipeline import open_store

        session = frame.sparkSession
        store = open_store(self.store_url)
        try:
            with DeadLetter(self.dead_letter) as dl:
                summary, ignored = _ingest_batch(frame, session, self.definitions, store, dl, self.options,
                                                 self.kafka)  # fmt: skip
        finally:
            store.close()
        self.options = _next_options(self.options, summary, self.kafka)
        _add(self.totals, summary, ignored)
        row = json.dumps(_plain(self.totals))
        session.createDataFrame([(row,)], "totals string").createOrReplaceGlobalTempView(self.view)
        if self.on_batch is not None:
            self.on_batch(batch_id, summary)


def _absolute_store(url: str) -> str:
    """A DuckDB store URL with a relative path made absolute (the Connect server has another working directory)."""
    if url.startswith("duckdb:///") and ":memory:" not in url and not url.startswith("duckdb:////"):
        path, sep, options = url[len("duckdb:///") :].partition("?")
        return "duckdb:///" + os.path.abspath(path) + sep + options
    return url


def _run_connect(
    input_dir: str | KafkaTopics,
    definitions: Definitions,
    store_url: str,
    checkpoint: str,
    master: str,
    conf: Mapping[str, str] | None,
    trigger_once: bool,
    stop_after_s: float | None,
    dead_letter: str | None,
    spark: SparkSession | None,
    options: JobOptions,
    poll_s: float,
    max_files: int | None,
    remote: str | None,
    on_batch: Callable[[int, dict[str, Any]], None] | None,
) -> dict[str, Any]:
    """:func:`run_stream` through Spark Connect (see the module docstring); returns the totals."""
    import json

    from drainpipe.pipeline import open_store

    store_url = _absolute_store(store_url)
    open_store(store_url).close()  # fail here, in one line, if the store cannot be opened at all
    target = os.path.abspath(dead_letter or default_dead_letter(store_url))
    session, created = job_session(master, conf, spark, remote=remote)
    view = f"drainpipe_stream_totals_{os.getpid()}_{int(time.time() * 1000)}"
    try:
        kafka = input_dir if isinstance(input_dir, KafkaTopics) else None
        process = _ConnectBatches(definitions, store_url, target, options, view, kafka, on_batch)
        query = _start(session, input_dir, os.path.abspath(checkpoint), process, trigger_once, poll_s, max_files)
        _await(query, None if trigger_once else stop_after_s)
        from pyspark.errors import AnalysisException

        try:
            row = session.sql(f"SELECT totals FROM global_temp.{view}").first()
            session.catalog.dropGlobalTempView(view)
        except AnalysisException:  # no micro-batch ran: the view was never made
            row = None
        totals = json.loads(row[0]) if row is not None else dict(_new_totals(), reasons={})
    finally:
        if created:
            session.stop()
    totals.update(dropped=0)
    return totals


def _await(query: Any, timeout_s: float | None) -> None:
    """Wait for the query to finish (or ``timeout_s``), stop it, and raise its failure as one line."""
    from pyspark.errors import StreamingQueryException

    try:
        if timeout_s is None:
            query.awaitTermination()
        else:
            query.awaitTermination(timeout_s)
    except StreamingQueryException as exc:
        message = first_line(exc)
        raise RuntimeError(f"stream failed: {message}") from exc
    finally:
        if query.isActive:
            query.stop()


def _start(
    session: SparkSession,
    input_dir: str | KafkaTopics,
    checkpoint: str,
    process: Callable[[DataFrame, int], None],
    trigger_once: bool,
    poll_s: float,
    max_files: int | None,
) -> Any:
    if isinstance(input_dir, KafkaTopics):
        frame = input_dir.reader(session).load()
        name = "kafka-" + "-".join(input_dir.topics)
    else:
        schema = "path string, modificationTime timestamp, length bigint, content binary"  # binaryFile's schema
        reader = session.readStream.format("binaryFile").schema(schema).option("pathGlobFilter", STREAM_GLOB)
        if max_files:
            reader = reader.option("maxFilesPerTrigger", str(max_files))
        frame = reader.load(input_dir).select("path")
        name = os.path.basename(os.path.abspath(input_dir))
    writer = (
        frame.writeStream.queryName(f"drainpipe-{name}").option("checkpointLocation", checkpoint).foreachBatch(process)
    )
    writer = writer.trigger(availableNow=True) if trigger_once else writer.trigger(processingTime=f"{poll_s} seconds")
    return writer.start()

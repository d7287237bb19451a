"""The ``drainpipe`` command.

Errors: a :class:`~drainpipe.errors.DrainpipeError` (a mistake the user can fix: bad option, missing file, bad
store URL, ...) is printed as one line and exits 2. A run whose data did not all reach the store prints its summary
with a line saying what was not stored and exits 1 (2 when the cause is an unreadable input file). Anything else is
a bug in drainpipe: the traceback is printed with a line saying so, and the exit status is 70 (EX_SOFTWARE).
Ctrl-C exits 130.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import re
import sys
import traceback
from collections.abc import Sequence
from typing import Any

from .errors import DrainpipeError, UsageError

EXIT_USER = 2
EXIT_NOT_STORED = 1  # a run whose data did not all reach the store
EXIT_BUG = 70

_STORE_HELP = (
    "store URL: duckdb:///relative/path.duckdb, duckdb:////absolute/path.duckdb (four slashes) or "
    "postgresql://user:pass@host:port/db (default: %(default)s)"
)
_DATE_ONLY = re.compile(r"\d{4}-\d{2}-\d{2}\Z")


def cmd_generate(args: argparse.Namespace) -> int:
    from .pipeline import generate_events, write_events

    for name in ("services", "endpoints", "duration"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.skew < 0:
        raise UsageError(f"--skew must be >= 0, got {args.skew}")
    _check_output_dir(args.output)
    batches = generate_events(
        args.events,
        services=args.services,
        endpoints_per_service=args.endpoints,
        skew=args.skew,
        seed=args.seed,
        duration_s=args.duration,
    )
    n = write_events(batches, args.output)
    print(f"wrote {n:,} events to {args.output}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    if args.checkpoint_s <= 0:
        raise UsageError(f"--checkpoint-s must be > 0, got {args.checkpoint_s}")
    if args.engine != "spark" and args.own_process:
        from .processes import tune_own_process

        tune_own_process()  # before numpy is imported, anything converts Python values to Arrow or starts a worker
    from .pipeline import definitions_from, remote_write_options

    definitions = definitions_from(args.metrics)  # validated before any data is read
    remote = remote_write_options(args)
    from .inputs import log_format_of

    log_format = log_format_of(args.log_format)  # an unusable format is refused before anything starts
    if args.engine == "spark":
        from .spark import run_batch, short_lived_jvm

        if args.spark_master.startswith("local") and not (args.spark_remote or os.environ.get("SPARK_REMOTE")):
            short_lived_jvm()  # one job, then the process exits
        conf = dict(_kv(c) for c in args.spark_conf)
        result = run_batch(
            args.input,
            definitions=definitions,
            store_url=args.store,
            master=args.spark_master,
            remote=args.spark_remote,
            conf=conf,
            dead_letter=args.dead_letter,
            quiet=args.quiet,
            service=args.service or "",
            log_format=log_format,
            keep_session=args.own_process,  # the process exits next: its JVM stops with it
        )
        from .pipeline import RunSummary

        for line in RunSummary.from_totals(result, store=args.store, dead_letter=result.get("dead_letter"),
                                           engine="spark").lines():  # fmt: skip
            print(line)
        if remote is not None:
            print(_remote_write(args.store, definitions, remote))
        return 0
    from ._progress import file_progress
    from .pipeline import EngineOptions, run_local

    with file_progress(quiet=args.quiet, inputs=args.input) as progress:
        summary = run_local(
            args.input,
            definitions=definitions,
            store_url=args.store,
            dead_letter=args.dead_letter,
            progress=progress,
            options=EngineOptions(l2_flush_s=args.checkpoint_s),
            service=args.service or "",
            log_format=log_format,
        )
    for line in summary.lines():
        print(line)
    if remote is not None and summary.stored:
        print(_remote_write(args.store, definitions, remote))
    if summary.complete:
        return 0
    print(f"drainpipe: error: {summary.failure()}", file=sys.stderr)
    return EXIT_USER if summary.input_error else EXIT_NOT_STORED


def cmd_stream(args: argparse.Namespace) -> int:
    from .pipeline import definitions_from

    definitions = definitions_from(args.metrics)
    from .spark import run_stream

    def on_batch(batch_id: int, info: dict[str, Any]) -> None:
        if not args.quiet:
            counts = f"read {info.get('read', 0):,} = accepted {info.get('accepted', 0):,} + rejected "
            what = "" if args.bootstrap_servers else f", {info.get('files', 0):,} new files"
            print(f"micro-batch {batch_id}: {counts}{info.get('rejected', 0):,}{what}", flush=True)

    kafka = bool(args.bootstrap_servers)
    if bool(args.input) == kafka or bool(args.topic) != kafka:
        raise UsageError("stream reads either --input DIR or --bootstrap-servers with --topic")
    source: Any = args.input
    if kafka:
        from .spark import KafkaTopics

        if args.max_messages is not None and args.max_messages < 0:
            raise UsageError("--max-messages must be 0 (no bound) or more")
        bound = {} if args.max_messages is None else {"max_messages": args.max_messages or None}
        source = KafkaTopics.at(args.bootstrap_servers, args.topic, args.encoding, **bound)
    result = run_stream(
        source,
        definitions=definitions,
        store_url=args.store,
        checkpoint=args.checkpoint,
        master=args.spark_master,
        conf=dict(_kv(c) for c in args.spark_conf),
        trigger_once=args.trigger_once,
        stop_after_s=args.stop_after,
        dead_letter=args.dead_letter,
        on_batch=on_batch,
        remote=args.spark_remote,
    )
    from .inputs import default_dead_letter
    from .pipeline import RunSummary

    summary = RunSummary.from_totals(result, store=args.store, engine="spark streaming",
                                     dead_letter=args.dead_letter or default_dead_letter(args.store))  # fmt: skip
    for line in summary.lines():
        print(line)
    return 0


def cmd_definitions(args: argparse.Namespace) -> int:
    from .pipeline import definitions_from, definitions_toml

    definitions = definitions_from(args.metrics)
    header = (
        f"The metric definitions of {args.metrics} (its own and, with defaults = true, the built-in set), as drainpipe "
        "reads them." if args.metrics else
        "drainpipe's built-in metric definitions (docs/pipeline.md, \"Metric definitions\"): a metrics file to edit.\n"
        "A file with settings only ([prometheus], [retention], [spans], ...) keeps this set; a file with\n"
        "defaults = true adds its own [[metric]] and [[topn]] tables to it."
    )  # fmt: skip
    sys.stdout.write(definitions_toml(definitions, header))
    return 0


def cmd_compact(args: argparse.Namespace) -> int:
    from .pipeline import definitions_from, open_store, parse_time

    retention = definitions_from(args.metrics).retention.with_flags(args.retention)
    now = None
    if args.now is not None:
        import datetime as dt

        text = args.now.strip()
        when = parse_time(int(text) if text.isdigit() else text)  # StoreError (one line) for a bad time
        now = int(dt.datetime.fromisoformat(when.replace("Z", "+00:00")).timestamp() * 1000)
    store = open_store(args.store, must_exist=True)
    try:
        before = store.size_bytes()
        report = store.purge(retention, now)
        store.reclaim()
        after = store.size_bytes()
    finally:
        store.close()
    deleted = ", ".join(f"{table} {n:,}" for table, n in sorted(report.deleted.items()) if n) or "nothing"
    print(f"retention: {retention.describe()}")
    print(f"deleted {report.total:,} rows: {deleted}")
    print(f"store size {before / 1e6:,.1f} MB -> {after / 1e6:,.1f} MB (freed space is reused by later writes)")
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    from .pipeline import open_store, render

    end = _end_bound(args.end)
    store = open_store(args.store, must_exist=True)
    try:
        names = store.stored_names()
        wanted, kind = (args.topn, "topn") if args.topn else (args.metric, "metric")
        if wanted is not None and names.get(wanted) != kind:
            stored = ", ".join(n for n, k in names.items() if k == kind) or "none"
            label = "top-N" if kind == "topn" else "metric"
            raise UsageError(f"no {label} named {wanted!r} in the store; stored {label}s: {stored}")
        rows: Sequence[Sequence[Any]]
        if args.topn:
            rows = store.query_topn(args.topn, entity=args.entity, start=args.start, end=end)
            columns: tuple[str, ...] = ("name", "entity", "time_bucket", "rank", "key", "latency_ms")
        else:
            rows = store.query(
                metric=args.metric, entity=args.entity, granularity=args.granularity, start=args.start, end=end
            )
            columns = ("metric", "entity", "granularity", "time_bucket", "label", "value")
    finally:
        store.close()
    if args.limit:
        rows = rows[: args.limit]
    sys.stdout.write(render(rows, columns, args.format))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    if args.events < 1:
        raise UsageError(f"--events must be >= 1, got {args.events}")
    return run_demo(events=args.events, out_dir=args.out, seed=args.seed)


def _end_bound(value: str | None) -> str | None:
    """``--to``: an inclusive bucket start; a bare date means the whole day (up to its last minute)."""
    if value is not None and _DATE_ONLY.match(value.strip()):
        return value.strip() + "T23:59:59Z"
    return value


def _check_output_dir(path: str) -> None:
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UsageError(f"cannot write {path!r}: directory {parent!r} does not exist")


def _kv(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise UsageError(f"--spark-conf expects key=value, got {text!r}")
    k, v = text.split("=", 1)
    return k.strip(), v.strip()


def _remote_write(store_url: str, definitions: Any, options: Any) -> str:
    """Send the store's final minutes after a run (``--remote-write``); one line saying what was sent."""
    from .pipeline import open_store, send_stored

    store = open_store(store_url)
    try:
        s = send_stored(store, definitions, options)
    finally:
        store.close()
    line = f"remote write to {options.url}: {s['sent_samples']:,} values sent in {s['requests']} requests"
    if s["sent_exemplars"]:
        line += f" with {s['sent_exemplars']:,} exemplars"
    if s["skipped_minutes"]:
        line += (f"; {s['skipped_minutes']:,} minutes older than {options.max_age_s:.0f} s not sent (a receiver with "
                 "an out-of-order window takes them: raise --remote-write-max-age-s)")  # fmt: skip
    if s["rejected_samples"]:
        line += f"; {s['rejected_samples']:,} refused by the receiver (logged)"
    if s["unsent"]:
        line += "; the receiver is down: the rest is sent by the next run or server"
    return line


def _count(minimum: int) -> Any:
    """An argparse type: an int >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    parse.__name__ = "count"
    return parse


def _store_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", default="duckdb:///drainpipe.duckdb", metavar="URL", help=_STORE_HELP)


def _metrics_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--metrics",
        metavar="FILE",
        help="metric definitions (TOML), validated before any data is "
        "read; default: the built-in set (docs/pipeline.md)",
    )


def _spark_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--spark-master",
        default="local[*]",
        metavar="URL",
        help="Spark master: local[N], spark://host:port, ... (default: %(default)s)",
    )
    p.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting (repeatable), e.g. spark.executor.memory=4g; the executors' Python: "
        "spark.pyspark.python=..., or a packed venv: spark.archives=venv.tar.gz#env with "
        "PYSPARK_PYTHON=./env/bin/python",
    )
    p.add_argument(
        "--spark-remote",
        metavar="URL",
        help="run through Spark Connect (sc://host:port) instead of --spark-master (default: $SPARK_REMOTE)",
    )


def build_parser() -> argparse.ArgumentParser:
    from .kafka import add_consume_command
    from .server.commands import add_commands

    p = argparse.ArgumentParser(
        prog="drainpipe",
        description="Partitioned, self-balancing batch processing and the metrics pipeline that runs on it.",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log what the queues do")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    d = sub.add_parser(
        "demo",
        help="a skewed synthetic workload through the local engine into DuckDB",
        description="Generate a skewed workload, run it through the local engine with rebalancing "
        "into an embedded DuckDB file, and show what happened.",
    )
    d.add_argument("--events", type=_count(1), default=2_000_000, help="events to generate (default: %(default)s)")
    d.add_argument(
        "--out",
        default=os.path.join(".drainpipe", "demo"),
        metavar="DIR",
        help="directory for the files it writes (default: %(default)s)",
    )
    d.add_argument("--seed", type=int, default=42, help="random seed (default: %(default)s)")
    d.set_defaults(fn=cmd_demo)

    g = sub.add_parser(
        "generate",
        help="write a synthetic workload to a file (.jsonl[.gz], .csv, .parquet)",
        description="Write synthetic request events (Zipf-skewed services) to a file; the format follows the suffix.",
    )
    g.add_argument("--events", type=_count(0), default=1_000_000, help="how many events (default: %(default)s)")
    g.add_argument("--services", type=int, default=20, help="number of services (default: %(default)s)")
    g.add_argument("--endpoints", type=int, default=10, help="endpoints per service (default: %(default)s)")
    g.add_argument(
        "--skew", type=float, default=1.1, help="Zipf exponent of service popularity, >= 0 (default: %(default)s)"
    )
    g.add_argument(
        "--duration", type=int, default=3600, help="seconds of traffic the events span (default: %(default)s)"
    )
    g.add_argument("--seed", type=int, default=42, help="random seed (default: %(default)s)")
    g.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="FILE",
        help="output file (.jsonl, .jsonl.gz, .csv, .csv.gz or .parquet)",
    )
    g.set_defaults(fn=cmd_generate)

    r = sub.add_parser(
        "run",
        help="process event files into a store",
        description="Read, validate and aggregate event files into a store. Running the same input "
        "again changes nothing; rejected records go to the dead letter with a reason.",
    )
    r.add_argument(
        "--input",
        nargs="+",
        required=True,
        metavar="PATH",
        help="files or globs: events (.jsonl, .json, .ndjson, .csv), OpenTelemetry traces as OTLP JSON "
        "(.otlp.jsonl) or web-server access logs (.log), each optionally .gz, or events in .parquet",
    )
    r.add_argument("--service", metavar="NAME",
                   help="the service that access logs (.log) belong to (each line is one of its requests)")  # fmt: skip
    r.add_argument("--log-format", metavar="FORMAT",
                   help="the format of the access logs: an nginx log_format string ($variables) or an "
                        "Apache LogFormat string (%%directives); default: combined + the request time")  # fmt: skip
    r.add_argument(
        "--engine",
        choices=("local", "spark"),
        default="local",
        help="local: this machine's queues and worker processes; spark: a PySpark job (default: %(default)s)",
    )
    _metrics_option(r)
    _store_option(r)
    r.add_argument(
        "--dead-letter", metavar="FILE", help="rejected records are appended here (default: <store>.rejected.jsonl)"
    )
    r.add_argument(
        "--checkpoint-s",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="local engine: seconds of work between two commits to the store (a commit that takes long "
        "spaces the next to ten times its duration, at most five of these); a killed run resumes from the last one "
        "(default: %(default)s)",
    )
    _spark_options(r)
    from .pipeline import add_remote_write_options

    add_remote_write_options(r)
    r.add_argument("-q", "--quiet", action="store_true", help="no progress display (and, for spark, no JVM logs)")
    r.set_defaults(fn=cmd_run)

    st = sub.add_parser(
        "stream",
        help="Structured Streaming over a directory of new files (spark engine)",
        description="Process new files as they arrive in a directory, with Spark Structured "
        "Streaming; progress is kept in the checkpoint directory.",
    )
    st.add_argument("--input", metavar="DIR", help="directory new event files arrive in")
    st.add_argument("--bootstrap-servers", metavar="HOST:PORT",
                    help="read Kafka topics instead (Spark's Kafka source; its offsets are kept in the checkpoint, not "
                         "in a consumer group)")  # fmt: skip
    st.add_argument("--topic", action="append", default=[], metavar="TOPIC", help="a topic to read (repeatable)")
    st.add_argument("--encoding", default="json", choices=("json", "otlp_proto", "otlp_json"),
                    help="Kafka message values: json (one event, or NDJSON lines), otlp_proto or otlp_json (an OTLP "
                         "trace export each) (default: %(default)s)")  # fmt: skip
    st.add_argument("--max-messages", type=int, metavar="N",
                    help="Kafka: messages a micro-batch reads at most (Spark's maxOffsetsPerTrigger; 0: no bound; "
                         "default: a million)")  # fmt: skip
    st.add_argument("--engine", choices=("spark",), default="spark", help="streaming runs on spark")
    st.add_argument("--checkpoint", required=True, metavar="DIR", help="Spark checkpoint location")
    _metrics_option(st)
    _store_option(st)
    st.add_argument("--dead-letter", metavar="FILE", help="rejected records go here")
    _spark_options(st)
    st.add_argument("--trigger-once", action="store_true", help="process what is there, then stop")
    st.add_argument("--stop-after", type=float, metavar="SECONDS", help="stop after this long")
    st.add_argument("-q", "--quiet", action="store_true", help="no per-micro-batch lines")
    st.set_defaults(fn=cmd_stream)

    q = sub.add_parser(
        "query",
        help="print stored metric rows (or top-N rows with --topn)",
        description="Print stored rows, ordered by metric, entity, granularity, time bucket and "
        "label. Time bounds are inclusive bucket starts, UTC.",
    )
    _store_option(q)
    q.add_argument("--metric", help="only this metric (its name, e.g. service_cpm)")
    q.add_argument("--entity", help="only this entity: service, service/instance or service/endpoint")
    q.add_argument("--granularity", choices=("minute", "hour", "day"), help="only this granularity")
    q.add_argument(
        "--from",
        dest="start",
        metavar="T",
        help="first bucket start, ISO-8601 (2026-11-21T10:05:00Z, 2026-11-21) or epoch milliseconds",
    )
    q.add_argument(
        "--to",
        dest="end",
        metavar="T",
        help="last bucket start, inclusive; a date alone (2026-11-21) means the whole day",
    )
    q.add_argument("--topn", metavar="NAME", help="print this top-N's rows instead of metric rows")
    q.add_argument(
        "--format", choices=("table", "csv", "json"), default="table", help="output format (default: %(default)s)"
    )
    q.add_argument("--limit", type=_count(0), default=0, metavar="N", help="print at most N rows (0: all)")
    q.set_defaults(fn=cmd_query)

    df = sub.add_parser(
        "definitions",
        help="print the built-in metric definitions as TOML, to edit",
        description="Print the built-in metric and top-N definitions as a metrics TOML file (to start a file of your "
        "own from), or with --metrics the definitions a file amounts to.",
    )
    _metrics_option(df)
    df.set_defaults(fn=cmd_definitions)

    c = sub.add_parser(
        "compact",
        help="delete what the retention no longer keeps, and make its space reusable",
        description="Purge the store as drainpipe serve does on its schedule: metric rows per granularity older "
        "than their retention, top-N rows, and progress rows (the books) older than the longest retention; then "
        "reclaim the space (DuckDB checkpoint, PostgreSQL VACUUM). For batch users of drainpipe run.",
    )
    _store_option(c)
    _metrics_option(c)
    _retention_option(c)
    c.add_argument("--now", metavar="T", help="purge as if it were this time (ISO-8601 or epoch ms; default: now)")
    c.set_defaults(fn=cmd_compact)

    add_consume_command(sub, _store_option, _metrics_option, _retention_option)
    add_commands(sub, _store_option, _metrics_option, _retention_option)
    return p


def _retention_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--retention",
        action="append",
        default=[],
        metavar="GRANULARITY=DURATION",
        help="keep minute, hour, day or topn rows this long (7d, 36h, 2w, forever); repeatable; overrides the "
        "metrics TOML's [retention] (defaults: minute 7d, hour 90d, day 800d, topn 7d)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``drainpipe`` command; returns the exit status. Without ``argv`` (the console script), the arguments
    are the process's and so is the process: ``run`` on the local engine may then tune it for itself
    (:func:`drainpipe.processes.tune_own_process`); with ``argv`` (called from a program), it does not."""
    args = build_parser().parse_args(argv)
    args.own_process = argv is None
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    try:
        status: int = args.fn(args)
        return status
    except DrainpipeError as exc:
        print(f"drainpipe: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_USER
    except KeyboardInterrupt:
        print("drainpipe: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception:  # a bug: say so, with the traceback
        traceback.print_exc()
        print(
            "drainpipe: internal error: this is a bug in drainpipe; please report it with the traceback above",
            file=sys.stderr,
        )
        return EXIT_BUG
    finally:
        if args.own_process:
            # the process exits next: its objects go to the collector's permanent generation, so that the
            # interpreter's collections at exit do not traverse everything the imports made (pyarrow, numpy, DuckDB):
            # 40-80 ms of every command, against ~12 ms. Module teardown, atexit handlers and flushes still run.
            gc.freeze()


def _one_line(exc: BaseException) -> str:
    return " ".join((str(exc) or type(exc).__name__).split())


if __name__ == "__main__":
    sys.exit(main())

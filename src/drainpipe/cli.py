"""The ``drainpipe`` command. Every user mistake is one line on stderr and a non-zero exit, never a traceback."""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any, Callable, Sequence

EXIT_USER = 2


class UserError(Exception):
    """A mistake the user can fix (bad file, bad URL, bad option): reported as one line."""


def _definitions(path: str | None):
    from .pipeline.definitions import default_definitions, load_definitions

    return load_definitions(path) if path else default_definitions()


def cmd_generate(args: argparse.Namespace) -> int:
    from .pipeline.generator import generate_events, write_events

    batches = generate_events(args.events, services=args.services, endpoints_per_service=args.endpoints,
                              skew=args.skew, seed=args.seed, duration_s=args.duration)
    n = write_events(batches, args.output)
    print(f"wrote {n:,} events to {args.output}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    definitions = _definitions(args.metrics)     # validated before any data is read
    if args.engine == "spark":
        from .spark import run_batch

        conf = dict(_kv(c) for c in args.spark_conf)
        result = run_batch(args.input, definitions=definitions, store_url=args.store, master=args.spark_master,
                           conf=conf, dead_letter=args.dead_letter)
        print(f"read {result['read']:,} = accepted {result['accepted']:,} + rejected {result['rejected']:,}"
              f"   dropped {result.get('dropped', 0)}")
        print(f"{result['events_per_s']:,.0f} events/s over {result['elapsed_s']:.2f} s into {args.store} (spark)")
        return 0
    from .pipeline.run import run_local
    from ._progress import file_progress

    with file_progress(quiet=args.quiet, inputs=args.input) as progress:
        summary = run_local(args.input, definitions=definitions, store_url=args.store,
                            dead_letter=args.dead_letter, progress=progress)
    for line in summary.lines():
        print(line)
    return 0


def cmd_stream(args: argparse.Namespace) -> int:
    definitions = _definitions(args.metrics)
    if args.engine != "spark":
        raise UserError("streaming runs on the spark engine: use --engine spark")
    from .spark import run_stream

    def on_batch(batch_id: int, info: dict) -> None:
        if not args.quiet:
            print(f"micro-batch {batch_id}: " + ", ".join(f"{k} {v}" for k, v in info.items()
                                                         if isinstance(v, (int, float))), flush=True)

    result = run_stream(args.input, definitions=definitions, store_url=args.store, checkpoint=args.checkpoint,
                        master=args.spark_master, conf=dict(_kv(c) for c in args.spark_conf),
                        trigger_once=args.trigger_once, stop_after_s=args.stop_after, dead_letter=args.dead_letter,
                        on_batch=on_batch)
    print(", ".join(f"{k} {v}" for k, v in result.items() if isinstance(v, (int, float))))
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    from .pipeline.render import render
    from .pipeline.store import open_store

    store = open_store(args.store)
    try:
        if args.topn:
            rows = store.query_topn(args.topn, entity=args.entity, start=args.start, end=args.end)
            columns = ("name", "entity", "time_bucket", "rank", "key", "latency_ms")
        else:
            rows = store.query(metric=args.metric, entity=args.entity, granularity=args.granularity,
                               start=args.start, end=args.end)
            columns = ("metric", "entity", "granularity", "time_bucket", "label", "value")
    finally:
        store.close()
    if args.limit:
        rows = rows[:args.limit]
    sys.stdout.write(render(rows, columns, args.format))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(events=args.events, out_dir=args.out, seed=args.seed)


def _kv(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise UserError(f"--spark-conf expects key=value, got {text!r}")
    k, v = text.split("=", 1)
    return k.strip(), v.strip()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="drainpipe", description="Partitioned, self-balancing batch processing and "
                                "the metrics pipeline that runs on it.")
    p.add_argument("-v", "--verbose", action="store_true", help="log what the queues do")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    d = sub.add_parser("demo", help="a skewed synthetic workload through the local engine into DuckDB")
    d.add_argument("--events", type=int, default=2_000_000)
    d.add_argument("--out", default="drainpipe-demo", help="directory for the files it writes")
    d.add_argument("--seed", type=int, default=42)
    d.set_defaults(fn=cmd_demo)

    g = sub.add_parser("generate", help="write a synthetic workload to a file (.jsonl[.gz], .csv, .parquet)")
    g.add_argument("--events", type=int, default=1_000_000)
    g.add_argument("--services", type=int, default=20)
    g.add_argument("--endpoints", type=int, default=10, help="endpoints per service")
    g.add_argument("--skew", type=float, default=1.1, help="Zipf exponent of service popularity")
    g.add_argument("--duration", type=int, default=3600, help="seconds of traffic the events span")
    g.add_argument("--seed", type=int, default=42)
    g.add_argument("-o", "--output", required=True)
    g.set_defaults(fn=cmd_generate)

    r = sub.add_parser("run", help="process event files into a store")
    r.add_argument("--input", nargs="+", required=True, metavar="PATH", help="files or globs")
    r.add_argument("--engine", choices=("local", "spark"), default="local")
    r.add_argument("--metrics", help="metric definitions (TOML); default: the built-in set")
    r.add_argument("--store", default="duckdb:///drainpipe.duckdb")
    r.add_argument("--dead-letter", help="rejected records go here (default: <store>.rejected.jsonl)")
    r.add_argument("--spark-master", default="local[*]")
    r.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE")
    r.add_argument("-q", "--quiet", action="store_true", help="no progress display")
    r.set_defaults(fn=cmd_run)

    st = sub.add_parser("stream", help="Structured Streaming over a directory of new files (spark engine)")
    st.add_argument("--input", required=True, metavar="DIR", help="directory new event files arrive in")
    st.add_argument("--engine", choices=("spark",), default="spark")
    st.add_argument("--checkpoint", required=True, metavar="DIR", help="Spark checkpoint location")
    st.add_argument("--metrics", help="metric definitions (TOML); default: the built-in set")
    st.add_argument("--store", default="duckdb:///drainpipe.duckdb")
    st.add_argument("--dead-letter", help="rejected records go here")
    st.add_argument("--spark-master", default="local[*]")
    st.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE")
    st.add_argument("--trigger-once", action="store_true", help="process what is there, then stop")
    st.add_argument("--stop-after", type=float, metavar="SECONDS", help="stop after this long")
    st.add_argument("-q", "--quiet", action="store_true")
    st.set_defaults(fn=cmd_stream)

    q = sub.add_parser("query", help="print stored metric rows (or top-N rows with --topn)")
    q.add_argument("--store", default="duckdb:///drainpipe.duckdb")
    q.add_argument("--metric")
    q.add_argument("--entity")
    q.add_argument("--granularity", choices=("minute", "hour", "day"))
    q.add_argument("--from", dest="start", metavar="T")
    q.add_argument("--to", dest="end", metavar="T")
    q.add_argument("--topn", metavar="NAME")
    q.add_argument("--format", choices=("table", "csv", "json"), default="table")
    q.add_argument("--limit", type=int, default=0)
    q.set_defaults(fn=cmd_query)

    for extra in _extra_commands:
        extra(sub)
    return p


_extra_commands: list[Callable[[Any], None]] = []


def _server_commands(sub: Any) -> None:
    """``drainpipe serve`` and ``drainpipe stats`` (drainpipe.server)."""
    from .server.commands import add_commands

    add_commands(sub)


_extra_commands.append(_server_commands)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        return args.fn(args)
    except (UserError, ValueError, FileNotFoundError, PermissionError, IsADirectoryError) as exc:
        print(f"drainpipe: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_USER
    except KeyboardInterrupt:
        print("drainpipe: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _one_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, FileNotFoundError) and exc.filename:
        text = f"no such file: {exc.filename}"
    return " ".join(text.split())


if __name__ == "__main__":
    sys.exit(main())

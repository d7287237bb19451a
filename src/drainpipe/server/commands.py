"""The ``serve`` and ``stats`` subcommands (registered by :mod:`drainpipe.cli`, which this module does not import).
Imports stay lazy: ``drainpipe --help`` must not load the engine."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Callable
from typing import Any

from ..errors import UsageError
from ..processes import tune_live_process
from .http_face import TOKEN_ENV, check_bind, token_of

#: the interpreter's switch interval in ``serve``'s own process (the default is 5 ms). The connection loop answers
#: requests, and each turn of it wants the GIL back after a read, a write or an fsync; while an engine thread runs
#: a C kernel or Python that keeps the GIL, the loop waited up to the whole interval each time. At 1 ms, with the
#: aggregation's string columns in a kernel that keeps the GIL (which had taken the p99 at 150k spans/s from 18 to
#: 35 ms at 5 ms), saturated 1.2x the spans per CPU second of the code before the kernel and the fixed rate within
#: the noise of it (docs/performance.md, "String columns that keep the GIL, and a shorter switch interval")
SWITCH_INTERVAL_S = 0.001


def cmd_serve(args: argparse.Namespace) -> int:
    """Check the options, then :func:`~.assembly.serve` the :class:`~.assembly.ServeConfig` they describe."""
    if args.own_process:
        # before pyarrow is imported: its default pool is chosen then, here and in the helpers
        tune_live_process(SWITCH_INTERVAL_S)
    from ..pipeline import definitions_from, remote_write_options
    from .assembly import ServeConfig, serve
    from .service import ServiceOptions

    token = token_of(args.token)
    check_bind(args.host, token, "serve")
    for name, value in (("--max-body-mb", args.max_body_mb), ("--wal-max-bytes", args.wal_max_bytes),
                        ("--checkpoint-s", args.checkpoint_s), ("--slow-handler-s", args.slow_handler_s),
                        ("--alert-every-s", args.alert_every_s)):  # fmt: skip
        if value <= 0:
            raise UsageError(f"{name} must be > 0")
    if args.parsers is not None and args.parsers < 0:
        raise UsageError("--parsers must be >= 0")
    if args.purge_every_s < 0:
        raise UsageError("--purge-every-s must be >= 0")
    if args.alert_webhook and not args.alert_webhook.startswith(("http://", "https://")):
        raise UsageError(f"--alert-webhook must be an http:// or https:// URL, not {args.alert_webhook!r}")
    if args.grpc_port is not None:
        # gRPC's C core logs its own errors to stderr (a taken port is two lines, one of them ours); the server says
        # what matters itself. GRPC_VERBOSITY=ERROR (or DEBUG) in the environment brings them back
        os.environ.setdefault("GRPC_VERBOSITY", "NONE")
        try:
            import grpc  # noqa: F401
            import grpc_status  # noqa: F401
        except ImportError:
            raise UsageError("--grpc-port needs grpcio and grpcio-status: pip install 'drainpipe[grpc]'") from None
    definitions = definitions_from(args.metrics)
    if args.max_entities is not None:
        if args.max_entities < 1:
            raise UsageError(f"--max-entities must be >= 1, got {args.max_entities}")
        definitions = dataclasses.replace(definitions, max_entities=args.max_entities)
    if args.retention:
        definitions = dataclasses.replace(definitions, retention=definitions.retention.with_flags(args.retention))
    options = ServiceOptions(
        remote_write=remote_write_options(args),
        max_body_bytes=int(args.max_body_mb * (1 << 20)),
        max_decoded_bytes=max(int(args.max_body_mb * (1 << 20)), 64 << 20),
        checkpoint_s=args.checkpoint_s,
        purge_every_s=args.purge_every_s,
        alert_webhook=args.alert_webhook or "",
        alert_every_s=args.alert_every_s,
        disk=disk_limits(args),
    )
    config = ServeConfig(store_url=args.store, definitions=definitions, host=args.host,
                         port=args.port, grpc_port=args.grpc_port, token=token, durable=args.durability != "none",
                         wal_dir=args.wal, wal_max_bytes=args.wal_max_bytes, parsers=args.parsers,
                         slow_handler_s=args.slow_handler_s, shutdown_grace_s=args.shutdown_grace_s,
                         options=options, release_memory=args.own_process)  # fmt: skip
    serve(config, announce=lambda line: print(line, flush=True))
    return 0


def _byte_size(text: str) -> int:
    """An argparse type: bytes, with an optional K, M, G or T suffix (powers of 1024)."""
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    number, unit = (t[:-1], t[-1]) if t and t[-1] in units else (t, "")
    try:
        return int(float(number) * units[unit])
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size such as 512M or 4G, got {text!r}") from None


def disk_options(parser: argparse.ArgumentParser, refuse_help: str) -> None:
    """``--disk-warn`` and ``--disk-refuse`` (the free space thresholds of :mod:`.disk`) on ``parser``."""
    parser.add_argument("--disk-warn", type=_byte_size, default=None, metavar="SIZE",
                        help="/healthz says degraded (and a retention purge runs early) while a volume written to has "
                        "less free than this (default: 10%% of it, at most 1G)")  # fmt: skip
    parser.add_argument(
        "--disk-refuse",
        type=_byte_size,
        default=None,
        metavar="SIZE",
        help=f"{refuse_help} than this; /healthz answers 503 (default: 2%% of it, at most 256M)",
    )


def disk_limits(args: argparse.Namespace) -> Any:
    """The :class:`~.disk.DiskLimits` of ``--disk-warn`` and ``--disk-refuse``."""
    from .disk import DiskLimits

    if args.disk_warn is not None and args.disk_refuse is not None and args.disk_refuse > args.disk_warn:
        raise UsageError("--disk-refuse must not be above --disk-warn")
    return DiskLimits(args.disk_warn, args.disk_refuse)


def _port(text: str) -> int:
    """An argparse type: a TCP port number."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0-65535, got {port}")
    return port


def cmd_stats(args: argparse.Namespace) -> int:
    from .client import run_stats

    return run_stats(args.url, token_of(args.token), once=args.once, interval=args.interval)


def add_commands(
    sub: Any,
    store_option: Callable[[argparse.ArgumentParser], None],
    metrics_option: Callable[[argparse.ArgumentParser], None],
    retention_option: Callable[[argparse.ArgumentParser], None],
) -> None:
    """Add ``serve`` and ``stats`` to the subparsers ``sub``, with the CLI's shared --store/--metrics/--retention
    options."""
    s = sub.add_parser(
        "serve",
        help="run the pipeline as a service: HTTP ingest, /metrics, /healthz, dashboard",
        description="A long-running local engine (live mode) behind an HTTP server. POST events to "
        "/v1/events (NDJSON or a JSON array, gzip accepted); the dashboard is at /. SIGTERM or "
        "Ctrl-C drains requests, flushes L1, L2 and the store, and exits.",
    )
    store_option(s)
    metrics_option(s)
    s.add_argument("--host", default="127.0.0.1", help="address to bind (non-loopback needs a token)")
    s.add_argument("--port", type=_port, default=8080, help="port, 0-65535 (0: any free port)")
    s.add_argument("--grpc-port", type=_port, default=None, metavar="PORT",
                   help="also serve OTLP/gRPC (TraceService/Export) on PORT of --host; 4317 is OTLP's (0: any free "
                   "port; default: off)")  # fmt: skip
    s.add_argument("--token", default=None, help=f"bearer token clients must send (default: ${TOKEN_ENV})")
    s.add_argument("--max-body-mb", type=float, default=16.0, help="largest request body accepted (413 above)")
    s.add_argument(
        "--shutdown-grace-s",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM, how long requests in flight may take before they are cut (default: %(default)s)",
    )
    s.add_argument("--checkpoint-s", type=float, default=2.0, metavar="SECONDS",
                   help="how often the states are committed to the store with the log position: how fresh the "
                   "store is, and about what a restart replays. Each commit costs a store merge of every touched "
                   "state; shorter periods cost ingest throughput. A commit that takes long spaces the next to ten "
                   "times its duration, at most five periods (default: %(default)s)")  # fmt: skip
    retention_option(s)
    s.add_argument("--purge-every-s", type=float, default=3600.0, metavar="S",
                   help="purge the store by the retention this often, first at start (0: never; default: "
                   "%(default)s)")  # fmt: skip
    s.add_argument("--alert-webhook", default=None, metavar="URL",
                   help="post the firing and resolved notifications of the metrics TOML's [[alert]] rules here as "
                   "JSON, retried with backoff (default: none, they are shown on the dashboard only)")  # fmt: skip
    s.add_argument("--alert-every-s", type=float, default=30.0, metavar="S",
                   help="evaluate the [[alert]] rules on the store this often (default: %(default)s)")  # fmt: skip
    from ..pipeline import add_remote_write_options

    add_remote_write_options(s)
    s.add_argument("--max-entities", type=int, default=None, metavar="N",
                   help="the cardinality guard: distinct entities kept per scope and minute, the rest fold into "
                   "__overflow__ (default: the metrics TOML's max_entities, else 10000)")  # fmt: skip
    s.add_argument("--slow-handler-s", type=float, default=10.0, metavar="SECONDS",
                   help="a stage call (an aggregation, a merge, a store write) running longer than this is logged and "
                   "shown in /metrics (drainpipe_queue_slow_handler_seconds) and on the dashboard "
                   "(default: %(default)s)")  # fmt: skip
    s.add_argument("--parsers", type=int, default=None, metavar="N",
                   help="processes that parse and validate JSON request bodies (default: one per core), started "
                   "with the first JSON body; 0: parse them in the server process (OTLP exports are decoded in the "
                   "server process either way)",
                   )  # fmt: skip
    s.add_argument(
        "--durability",
        choices=("fsync", "none"),
        default="fsync",
        help="fsync (default): a request is answered 200 only once its events are fsynced to the write-ahead log, "
        "and a restart after a crash, kill -9 or power cut stores each of them exactly once; store outages wait "
        "on disk. none: acknowledged events are held in memory until stored; a crash loses them, and an outage "
        "is refused (503) after 512 MB",
    )
    s.add_argument("--wal", metavar="DIR", default=None,
                   help="write-ahead log directory (default: next to a DuckDB store, <file>.drainpipe-wal; for "
                   "PostgreSQL, drainpipe-wal-<database> here). One server per directory")  # fmt: skip
    s.add_argument("--wal-max-bytes", type=_byte_size, default="4G", metavar="SIZE",
                   help="most bytes the log may hold that the store has not applied (e.g. during a store outage); "
                   "beyond, requests get 503 with Retry-After (default: 4G)")  # fmt: skip
    disk_options(s, "requests are refused (503 with Retry-After) while the log's or the store's file system has "
                 "less free")  # fmt: skip
    s.set_defaults(fn=cmd_serve)

    t = sub.add_parser("stats", help="the live view of a running server in the terminal")
    t.add_argument("--url", default="http://127.0.0.1:8080")
    t.add_argument("--token", default=None, help=f"bearer token (default: ${TOKEN_ENV})")
    t.add_argument("--once", action="store_true", help="print one snapshot and exit")
    t.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    t.set_defaults(fn=cmd_stats)


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use: drainpipe serve | drainpipe stats")

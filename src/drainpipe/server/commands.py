"""The ``serve`` and ``stats`` subcommands (registered by :mod:`drainpipe.cli`). Imports stay lazy: ``drainpipe
--help`` must not load the engine."""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any

TOKEN_ENV = "DRAINPIPE_TOKEN"


class UserError(ValueError):
    """A mistake reported as one line by ``drainpipe.cli.main`` (a ValueError, so it is caught the same way when
    the CLI runs as ``python -m drainpipe.cli``, where the cli module's own classes are ``__main__``'s)."""


def cmd_serve(args: argparse.Namespace) -> int:
    from ..cli import _definitions
    from ..pipeline.store import open_store
    from .http import run_server
    from .service import IngestService, ServiceOptions

    token = args.token if args.token is not None else os.environ.get(TOKEN_ENV) or None
    from .http import is_loopback

    if not token and not is_loopback(args.host):
        raise UserError(f"refusing to listen on {args.host!r} without a token: pass --token or set {TOKEN_ENV} "
                        "(or bind 127.0.0.1)")
    if args.max_body_mb <= 0:
        raise UserError("--max-body-mb must be > 0")
    definitions = _definitions(args.metrics)
    store = open_store(args.store)
    options = ServiceOptions(max_body_bytes=int(args.max_body_mb * (1 << 20)),
                             max_decoded_bytes=max(int(args.max_body_mb * (1 << 20)), 64 << 20))
    service = IngestService(definitions, store, store_url=_display_url(args.store), options=options)
    try:
        run_server(service, args.host, args.port, token, announce=lambda line: print(line, flush=True))
    except OSError as exc:
        service.close()
        raise UserError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    return 0


def _display_url(url: str) -> str:
    import re

    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


def cmd_stats(args: argparse.Namespace) -> int:
    from .client import StatsError, run_stats

    token = args.token if args.token is not None else os.environ.get(TOKEN_ENV) or None
    try:
        return run_stats(args.url, token, once=args.once, interval=args.interval)
    except StatsError as exc:
        raise UserError(str(exc)) from None


def add_commands(sub: Any) -> None:
    s = sub.add_parser("serve", help="run the pipeline as a service: HTTP ingest, /metrics, /healthz, dashboard",
                       description="A long-running local engine (live mode) behind an HTTP server. POST events to "
                       "/v1/events (NDJSON or a JSON array, gzip accepted); the dashboard is at /. SIGTERM or "
                       "Ctrl-C drains requests, flushes L1, L2 and the store, and exits.")
    s.add_argument("--store", default="duckdb:///drainpipe.duckdb", help="duckdb:///file.duckdb or "
                   "postgresql://user:pass@host:port/db")
    s.add_argument("--metrics", help="metric definitions (TOML); default: the built-in set")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (non-loopback needs a token)")
    s.add_argument("--port", type=int, default=8080, help="port (0: any free port)")
    s.add_argument("--token", default=None, help=f"bearer token clients must send (default: ${TOKEN_ENV})")
    s.add_argument("--max-body-mb", type=float, default=16.0, help="largest request body accepted (413 above)")
    s.set_defaults(fn=cmd_serve)

    t = sub.add_parser("stats", help="the live view of a running server in the terminal")
    t.add_argument("--url", default="http://127.0.0.1:8080")
    t.add_argument("--token", default=None, help=f"bearer token (default: ${TOKEN_ENV})")
    t.add_argument("--once", action="store_true", help="print one snapshot and exit")
    t.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    t.set_defaults(fn=cmd_stats)


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use: drainpipe serve | drainpipe stats")

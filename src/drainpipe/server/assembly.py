"""``drainpipe serve`` assembled in one place: :class:`ServeConfig` says everything a server is, and
:func:`build_service` builds the whole service from it; :func:`serve` runs it until a signal.

The order is kept here only: the parser pool (its processes start with the first JSON body), then the event log
and the store; then the service, which owns all of them from there on and closes them in
:meth:`~.service.IngestService.close`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import UsageError
from ..pipeline import DEFAULT_STORE_URL, Definitions, default_definitions, duckdb_path, live_store_url, open_store
from ..processes import HeapWatch, usable_cpus
from .bodies import BodyDecoder
from .service import IngestService, ServiceOptions, serve_engine_options
from .wal import EventLog, MemoryLog, WriteAheadLog

__all__ = ["ServeConfig", "build_service", "serve", "default_parsers", "default_wal_dir"]

#: a memory log (``--durability none``) holds at most this much, whatever ``wal_max_bytes`` says
MEMORY_LOG_MAX_BYTES = 512 << 20


@dataclass(frozen=True)
class ServeConfig:
    """What one ``drainpipe serve`` is: where it listens, what it stores where, how durable, and its limits."""

    store_url: str = DEFAULT_STORE_URL
    definitions: Definitions = field(default_factory=default_definitions)
    host: str = "127.0.0.1"
    port: int = 8080
    grpc_port: int | None = None  # OTLP/gRPC beside HTTP (None: off)
    token: str | None = None  # bearer token clients must send (None: none)
    durable: bool = True  # a write-ahead log on disk (False: in memory, lost with the process)
    wal_dir: str | None = None  # None: beside the store (default_wal_dir)
    wal_max_bytes: int = 4 << 30
    parsers: int | None = None  # JSON parser processes (0: parse in the server process; None: default_parsers())
    slow_handler_s: float = 5.0
    shutdown_grace_s: float = 30.0
    options: ServiceOptions = ServiceOptions()
    #: give the heap's freed memory back as the resident set grows (``drainpipe serve`` in a process of its own;
    #: never in a program that embeds a service: it acts on the whole process)
    release_memory: bool = False


#: with ``ServeConfig.release_memory``, the heap's freed memory is given back each time the resident set has grown
#: by HEAP_STEP_BYTES over the highest level a trim left, looked at every HEAP_EVERY_S seconds
#: (:class:`~drainpipe.processes.HeapWatch`). Under the Collector benchmark's saturating load glibc held up to 130 MB
#: free beside 34 MB in use at the peak; watched, the peak PSS was 242-273 MB against 273-302 (5 rounds in turns), at
#: the same spans per CPU second (docs/performance.md, "Fewer hand-offs and larger engine batches"). Every 0.1 s,
#: not 0.05: each look is a wake-up of its own (3.5 of an idle ``serve``'s 21 ms of CPU a second at 0.05)
HEAP_STEP_BYTES = 16 << 20
HEAP_EVERY_S = 0.1


def build_service(config: ServeConfig) -> IngestService:
    """The service ``config`` describes, running (its engine replays what the store lacks of the log). Raises
    :class:`~drainpipe.errors.StoreError` for an unusable store, :class:`UsageError` for a log that cannot be."""
    parsers = default_parsers() if config.parsers is None else config.parsers
    decoder = BodyDecoder(parsers)
    try:
        event_log = _open_log(config)
        store = open_store(live_store_url(config.store_url))
    except BaseException:
        decoder.close()
        raise
    engine = serve_engine_options(slow_handler_ms=max(1, round(config.slow_handler_s * 1000)))
    return IngestService(config.definitions, store, log=event_log, store_url=_display_url(config.store_url),
                         options=config.options, engine_options=engine, decoder=decoder)  # fmt: skip


def serve(config: ServeConfig, announce: Callable[[str], Any] = print) -> dict[str, Any]:
    """Build the service and serve it over HTTP (and OTLP/gRPC) until SIGTERM or SIGINT; the shutdown summary.
    A port that cannot be bound is a :class:`UsageError`."""
    from .http import run_server

    service = build_service(config)
    heap = HeapWatch(HEAP_STEP_BYTES) if config.release_memory else None
    try:
        if heap is not None:
            heap.start(HEAP_EVERY_S)
        return run_server(service, config.host, config.port, config.token, announce=announce,
                          shutdown_grace_s=config.shutdown_grace_s, grpc_port=config.grpc_port)  # fmt: skip
    except OSError as exc:
        service.close()
        # a bind error of the HTTP port has a strerror; OTLP/gRPC's says its address itself
        why = f"cannot listen on {config.host}:{config.port}: {exc.strerror}" if exc.strerror else str(exc)
        raise UsageError(why) from None
    finally:
        if heap is not None:
            heap.stop()


def default_wal_dir(store_url: str | None) -> str | None:
    """Where the write-ahead log lives unless ``--wal`` says: next to a DuckDB file (``<file>.drainpipe-wal``; DuckDB
    has its own ``<file>.wal``); for a server store, ``drainpipe-wal-<database>`` in the working directory; None for
    an in-memory store."""
    from urllib.parse import urlsplit

    store_url = store_url or DEFAULT_STORE_URL
    if store_url.startswith("duckdb:"):
        path = duckdb_path(store_url)
        return None if path == ":memory:" else path + ".drainpipe-wal"
    database = urlsplit(store_url).path.strip("/") or "store"
    return f"drainpipe-wal-{database}"


def default_parsers() -> int:
    """Parser processes by default: one per usable CPU (affinity, cgroup quota). A parser serves one request at a
    time and is idle while the body and its batch travel. Measured on 2 cores, saturated by 8 connections (wrk),
    2 rounds: OTLP protobuf exports of 512 spans (the C pass) at 299k-325k spans/s with 2 parsers against
    297k-326k with 3, at the same spans per CPU second, 55 MB less PSS for the tree; NDJSON bodies of 1,000 events
    at 169k-171k events/s against 168k-169k. (When bodies and batches went over pipes, 24 clients of NDJSON: 1 parser
    gave 242k events/s, 2 gave 288k, 3 gave 306k; the third paid then.)"""
    return usable_cpus()


def _open_log(config: ServeConfig) -> EventLog:
    if not config.durable:
        return MemoryLog(max_bytes=min(config.wal_max_bytes, MEMORY_LOG_MAX_BYTES))
    directory = config.wal_dir or default_wal_dir(config.store_url)
    if directory is None:
        raise UsageError("an in-memory store has nothing to be durable with: pass --wal DIR or --durability none")
    return WriteAheadLog(directory, max_bytes=config.wal_max_bytes)


def _display_url(url: str) -> str:
    """A store URL with its password masked, for the announcement and ``/v1/stats``."""
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)

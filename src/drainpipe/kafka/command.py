"""``drainpipe consume``: the command, and the assembly of one group member (store, engine, dead letter, member)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import threading
from typing import TYPE_CHECKING, Any

from ..errors import StoreError, UsageError
from ..processes import tune_live_process
from ..server.commands import disk_limits, disk_options
from ..server.http_face import TOKEN_ENV, check_bind, token_of

if TYPE_CHECKING:
    from ..pipeline import Definitions, RemoteWriter
    from ..server.disk import DiskLimits
    from .config import ConsumeConfig
    from .member import GroupMember

__all__ = ["add_consume_command", "consume"]


def consume(
    config: ConsumeConfig,
    *,
    store_url: str,
    definitions: Definitions,
    dead_letter: str | None,
    announce: Any = print,
    stop: threading.Event | None = None,
    host: str = "127.0.0.1",
    port: int | None = None,
    token: str | None = None,
    disk: DiskLimits | None = None,
    purge_every_s: float = 0.0,
) -> dict[str, Any]:
    """Run one member of ``config.group`` into the store at ``store_url`` until ``stop`` is set (or SIGTERM/SIGINT
    when called on the main thread), with the dashboard, ``/metrics`` and ``/healthz`` on ``host:port`` if ``port``
    is given (the routes ``serve`` has, with its token rule: ``token`` is needed for all but ``/`` and ``/healthz``,
    and for a non-loopback ``host``); the store's and the dead letter's volumes are watched (``disk``: the
    thresholds; the partitions pause while one is under the refusal threshold); the store is purged by the
    definitions' retention at start and every ``purge_every_s`` (0, the default: never), early when a volume runs
    low;
    returns what it did. Errors (one line each): :class:`~drainpipe.errors.UsageError` for a store another process
    holds (a DuckDB file has one writer: several members need PostgreSQL), a setting librdkafka refuses or a broker
    it cannot reach; :class:`~drainpipe.errors.StoreError` when a store commit failed for good and
    :class:`~drainpipe.errors.InputError` when a partition could not be rewound (the member stopped: the others
    read its partitions from the store's offsets)."""
    from ..inputs import DeadLetter, default_dead_letter
    from ..pipeline import LocalEngine, live_store_url, open_store
    from ..server import serve_engine_options
    from ..server.disk import DiskWatch, store_directory
    from ..server.instrumented import InstrumentedStore
    from ..server.purger import Purger
    from .config import kafka_consumer
    from .member import GroupMember

    try:
        store = open_store(live_store_url(store_url))  # DuckDB's allocator returning freed memory
    except StoreError as exc:
        if store_url.startswith("duckdb:") and "lock" in str(exc).lower():
            raise UsageError(f"{exc} (a DuckDB file has one writer: several members of a group need a PostgreSQL "
                             "store, postgresql://...)") from None  # fmt: skip
        raise
    try:
        store.register(definitions.all)  # a conflicting definition is refused before anything is read
        # (instrumented: the live view's store write latencies and availability)
        # L1 aggregation on the engine's ingest threads, which overlap with the member's reading, as for serve
        # (docs/architecture.md, "One live path")
        options = serve_engine_options(l2_flush_s=config.checkpoint_s)
        engine = LocalEngine(definitions, InstrumentedStore(store), options)
        try:
            path = dead_letter or default_dead_letter(store_url)
            with DeadLetter(path) as dl:
                volumes = {
                    "store": store_directory(store_url) or "",
                    "dead_letter": os.path.dirname(os.path.abspath(path)),
                }
                watch = DiskWatch(volumes, disk)
                member = GroupMember(config, engine, definitions, kafka_consumer(config), dl, watch)
                writer = _remote_writer(config, engine, definitions)
                purger = Purger(engine.store, definitions.retention, purge_every_s, disk=watch)
                if purge_every_s > 0:
                    purger.purge()  # at start, as serve does
                    purger.start()
                try:
                    _run_member(member, config, store_url, path, announce, stop, (host, port, token), writer)
                finally:
                    purger.stop()
                    member.close()
                    if writer is not None:  # after the member's last commit: its minutes may be final now
                        writer.close()
        finally:
            engine.close()  # (also when the member could not start: the engine's threads end)
    finally:
        store.close()
    stats = member.stats
    if member.failed:
        raise member.failure(member.failed)
    return {"read": stats.read, "accepted": stats.accepted, "rejected": stats.rejected,
            "reasons": dict(stats.reasons), "warnings": dict(stats.warnings),
            "assignments": member.assignments, "revocations": member.revocations,
            "losses": member.losses, "rewinds": member.rewinds, "dead_letter": path}  # fmt: skip


def _remote_writer(config: ConsumeConfig, engine: Any, definitions: Definitions) -> RemoteWriter | None:
    """The member's remote writer (started), if ``config`` asks for one: a round sends once the engine has stored
    every event the member had handed it when the round began."""
    from ..pipeline import RemoteWriter

    if config.remote_write is None:
        return None
    counters = engine.counters

    def stored() -> Any:
        taken = counters.events
        return lambda: counters.events_stored + counters.events_not_stored >= taken

    return RemoteWriter(engine.store, definitions, config.remote_write, barrier=stored).start()


def _run_member(
    member: GroupMember,
    config: ConsumeConfig,
    store_url: str,
    path: str,
    announce: Any,
    stop: threading.Event | None,
    listen: tuple[str, int | None, str | None],
    writer: RemoteWriter | None,
) -> None:
    """Serve ``member``'s endpoints (``listen``: host, port or None, token) and run it until ``stop`` (or a
    signal)."""
    host, port, token = listen
    endpoints = None
    if writer is not None:
        member.observe = writer.observe
    if port is not None:
        from .member_http import MemberEndpoints, MemberView

        view = MemberView(member, store_url, writer)
        member.observe = view.observe
        member.engine.observe = view.red.observe  # (the RED series read the columns the aggregation made)
        try:
            endpoints = MemberEndpoints(view, host, port, token=token).start()
        except OSError as exc:
            raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        announce(f"drainpipe consume: the dashboard, /metrics and /healthz on {endpoints.url}")
    done = stop or threading.Event()

    def watch() -> None:
        done.wait()
        member.stop()

    threading.Thread(target=watch, daemon=True).start()
    restore = _on_signals(done.set) if stop is None else None
    announce(f"drainpipe consume: group {config.group!r}, topics {', '.join(config.topics)} at "
             f"{config.bootstrap_servers} into {store_url} (rejects to {path})")  # fmt: skip
    try:
        member.run()
    finally:
        done.set()
        if restore is not None:
            restore()
        if endpoints is not None:
            endpoints.stop()


def _on_signals(handler: Any) -> Any:
    """SIGTERM and SIGINT call ``handler`` (main thread only); returns what puts the old handlers back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    old = {s: signal.signal(s, lambda *_: handler()) for s in (signal.SIGTERM, signal.SIGINT)}
    return lambda: [signal.signal(s, h) for s, h in old.items()]


def cmd_consume(args: argparse.Namespace) -> int:
    if args.own_process:
        tune_live_process()  # before pyarrow is imported: its default pool is chosen then
    from ..pipeline import definitions_from, remote_write_options
    from .config import ConsumeConfig

    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        raise UsageError("drainpipe consume needs confluent-kafka: pip install 'drainpipe[kafka]'") from None
    for name, value in (("--session-timeout-s", args.session_timeout_s), ("--checkpoint-s", args.checkpoint_s),
                        ("--max-poll-interval-s", args.max_poll_interval_s)):  # fmt: skip
        if value <= 0:
            raise UsageError(f"{name} must be > 0")
    token = token_of(args.token)
    if args.port is not None:
        check_bind(args.host, token, "consume")  # before anything connects
    if args.purge_every_s < 0:
        raise UsageError("--purge-every-s must be >= 0")
    definitions = definitions_from(args.metrics)
    if args.retention:
        definitions = dataclasses.replace(definitions, retention=definitions.retention.with_flags(args.retention))
    client = {}
    for item in args.kafka_config:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--kafka-config takes KEY=VALUE, not {item!r}")
        client[key.strip()] = value
    config = ConsumeConfig(bootstrap_servers=args.bootstrap_servers, topics=args.topic, group=args.group,
                           encoding=args.encoding, session_timeout_s=args.session_timeout_s,
                           max_poll_interval_s=args.max_poll_interval_s, checkpoint_s=args.checkpoint_s,
                           exit_at_end=args.exit_at_end, client=client, spans=definitions.spans,
                           endpoints=definitions.endpoints, remote_write=remote_write_options(args),
                           release_memory=args.own_process)  # fmt: skip
    config.consumer_settings()  # refuses a bad encoding before anything starts
    result = consume(config, store_url=args.store, definitions=definitions, dead_letter=args.dead_letter,
                     announce=lambda line: print(line, flush=True), host=args.host, port=args.port,
                     token=token, disk=disk_limits(args), purge_every_s=args.purge_every_s)  # fmt: skip
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(result["reasons"].items()))
    print(f"read {result['read']:,} = accepted {result['accepted']:,} + rejected {result['rejected']:,}"
          + (f" ({reasons})" if reasons else "") + f"; partitions assigned {result['assignments']} times, "
          f"revoked {result['revocations']}, lost {result['losses']}; rewound {result['rewinds']} times"
          + "".join(f"; accepted with a warning: {k} {v}" for k, v in sorted(result["warnings"].items())),
          flush=True)  # fmt: skip
    return 0


def add_consume_command(sub: Any, store_option: Any, metrics_option: Any, retention_option: Any) -> None:
    from ..pipeline import add_remote_write_options

    c = sub.add_parser(
        "consume",
        help="read Kafka topics as a member of a consumer group, exactly once into a store",
        description="Join a Kafka consumer group and aggregate the events of the partitions it gives this member "
        "into a store. Each partition's offset is committed in the store with the states it brought: members "
        "can come and go, be killed and restarted, and every event is counted once. Runs until SIGTERM/SIGINT.",
    )
    c.add_argument("--bootstrap-servers", required=True, metavar="HOST:PORT", help="the Kafka brokers to start from")
    c.add_argument("--topic", action="append", required=True, metavar="TOPIC", help="a topic to read (repeatable)")
    c.add_argument(
        "--group",
        required=True,
        metavar="GROUP",
        help="the consumer group (its members share the partitions; several members need a PostgreSQL store)",
    )
    c.add_argument(
        "--encoding",
        default="json",
        choices=("json", "otlp_proto", "otlp_json"),
        help="message values: json (one event, or NDJSON lines), otlp_proto or otlp_json (an OTLP trace "
        "export, as the OpenTelemetry Collector's Kafka exporter writes) (default: %(default)s)",
    )
    c.add_argument(
        "--session-timeout-s",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="the group's session timeout: a member silent this long loses its partitions (default: %(default)s)",
    )
    c.add_argument(
        "--max-poll-interval-s",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="a member that does not poll for this long leaves the group (default: %(default)s)",
    )
    c.add_argument(
        "--checkpoint-s",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="seconds between two commits to the store (a commit that takes long spaces the next to ten times "
        "its duration, at most five of these; default: %(default)s)",
    )
    c.add_argument(
        "--kafka-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a librdkafka consumer setting (repeatable), e.g. security.protocol=SASL_SSL, sasl.mechanism=PLAIN, "
        "sasl.username=..., ssl.ca.location=...",
    )
    c.add_argument("--port", type=int, metavar="PORT",
                   help="serve the dashboard, /metrics (the traffic's RED series and per-partition lag) and /healthz "
                        "on this port (0: a free one)")  # fmt: skip
    c.add_argument("--host", default="127.0.0.1",
                   help="the address of --port (default: %(default)s; a non-loopback one needs a token)")  # fmt: skip
    c.add_argument(
        "--token",
        default=None,
        help=f"bearer token for the routes of --port but / and /healthz (default: ${TOKEN_ENV})",
    )
    c.add_argument(
        "--exit-at-end",
        action="store_true",
        help="leave the group and exit once every partition this member holds is read to its end",
    )
    add_remote_write_options(c)
    retention_option(c)
    c.add_argument("--purge-every-s", type=float, default=0.0, metavar="S",
                   help="purge the store by the retention this often, first at start, and early while a volume is "
                   "low on space (default: 0, never: a topic replayed from long ago keeps what it brings; serve "
                   "purges hourly)")  # fmt: skip
    disk_options(c, "the member pauses its partitions (keeping them) while the store's or the dead letter's file "
                 "system has less free")  # fmt: skip
    metrics_option(c)
    store_option(c)
    c.add_argument(
        "--dead-letter",
        metavar="FILE",
        help="rejected messages and records are appended here (default: <store>.rejected.jsonl)",
    )
    c.set_defaults(fn=cmd_consume)

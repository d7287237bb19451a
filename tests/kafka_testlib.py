"""Helpers of the tests against the real Kafka broker `make test` starts (scripts/kafka.sh): the warmed broker,
topics, producing events with poison messages among them, ``drainpipe consume`` members (killed after a test that
left them running), what a store and a dead letter hold."""

from __future__ import annotations

import fcntl
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testlib import TRACE_STATES, adjusted_count, wait_until

DRAINPIPE = str(Path(sys.executable).with_name("drainpipe"))
KAFKA_SH = Path(__file__).resolve().parents[1] / "scripts" / "kafka.sh"
BASE_MS = 1_790_000_000_000


def warm_broker() -> str:
    """The broker (``host:port``), warmed: a fresh broker creates its offsets topic at the first group's first join, which made
    that join take seconds."""
    from confluent_kafka import Consumer

    servers = os.environ["DRAINPIPE_TEST_KAFKA"].removeprefix("kafka://")
    topic = new_topic(servers, 1)
    consumer = Consumer({"bootstrap.servers": servers, "group.id": f"warm-{topic}"})
    assigned: list[Any] = []
    consumer.subscribe([topic], on_assign=lambda _c, partitions: assigned.extend(partitions))
    deadline = time.monotonic() + 60
    while not assigned and time.monotonic() < deadline:
        consumer.poll(0.1)
    consumer.close()
    return servers


def revive_broker() -> None:
    """Start the run's broker (scripts/kafka.sh) again if it has died, with a warning that quotes the end of its log; a
    broker the script did not start (another ``DRAINPIPE_TEST_KAFKA``) is left alone."""

    def kafka_sh(command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(KAFKA_SH), command], capture_output=True, text=True, timeout=120)

    base = Path(os.environ.get("KAFKA_BASE", KAFKA_SH.parents[1] / ".kafka"))
    base.mkdir(exist_ok=True)
    # one reviver at a time: the tests run on two workers, and two starts of one broker would share its directory
    with (base / "revive.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if kafka_sh("url").stdout.strip() == os.environ["DRAINPIPE_TEST_KAFKA"] and kafka_sh("status").returncode:
            _start_again(kafka_sh, base / "kafka.log")


def _start_again(kafka_sh: Callable[[str], subprocess.CompletedProcess[str]], log: Path) -> None:
    tail = ["(no log)"]
    if log.exists():  # (the log grows across runs: its end only)
        with log.open("rb") as f:
            f.seek(max(0, log.stat().st_size - 65536))
            tail = f.read().decode(errors="replace").splitlines()[-40:]
    started = kafka_sh("start")
    if started.returncode:
        again = f"could not start it again: {started.stderr.strip()}"
    elif kafka_sh("url").stdout.strip() != os.environ["DRAINPIPE_TEST_KAFKA"]:  # (its port was taken meanwhile)
        again = f"started again, but elsewhere ({started.stderr.strip()}): the tests after this one cannot reach it"
    else:
        again = "started again"
    warnings.warn("the Kafka broker had died before this test; " + again + ". The end of its log:\n" + "\n".join(tail),
                  stacklevel=1)  # fmt: skip


def new_topic(servers: str, partitions: int) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"t-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": servers})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(30)
    return topic


#: messages that are not events: (value, reason the dead letter gives)
POISON = [(b"not json", "invalid JSON"), (b'{"ts": "yesterday", "service": "x", "latency_ms": 1}', "bad timestamp: ts"),
          (None, "no value (a tombstone)"), (b"\xff\xfe\x00", "not UTF-8")]  # fmt: skip


def producer(servers: str) -> Any:
    """A producer whose retries across a broker restart do not write a message twice (idempotent)."""
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": servers, "linger.ms": 5, "enable.idempotence": True,
                     "reconnect.backoff.max.ms": 500, "retry.backoff.max.ms": 500})  # fmt: skip


def produce(servers: str, topic: str, events: int, seed: int, poison: bool = True, to: Any = None) -> Counter[str]:
    """``events`` valid events in messages of 1 to 120 (NDJSON), keyed over the partitions, with the poison
    messages among them, by ``to`` (a new producer if None); the calls per service they make."""
    rng = random.Random(seed)
    to = to or producer(servers)
    calls: Counter[str] = Counter()
    sent = 0
    poisons = list(POISON) if poison else []
    while sent < events:
        n = min(events - sent, rng.choice([1, 5, 40, 120]))
        lines = []
        for i in range(sent, sent + n):
            service = f"svc{rng.randrange(6)}"
            calls[service] += 1
            lines.append(json.dumps({"ts": BASE_MS + rng.randrange(600_000), "service": service,
                                     "endpoint": f"/e{i % 7}", "latency_ms": rng.randrange(1, 500),
                                     "status": rng.random() > 0.1}))  # fmt: skip
        to.produce(topic, "\n".join(lines).encode(), key=str(rng.randrange(1 << 30)).encode())
        sent += n
        if poisons and rng.random() < 0.01:
            value, _ = poisons.pop()
            to.produce(topic, value, key=str(rng.randrange(1 << 30)).encode())
    for value, _ in poisons:
        to.produce(topic, value)
    to.flush(30)
    return calls


def produce_otlp(servers: str, topic: str) -> Counter[str]:
    """30 ``ExportTraceServiceRequest`` messages of 20 spans (SERVER spans are requests, CLIENT ones, with statements,
    are not; sampled as :data:`~testlib.TRACE_STATES` say) over 3 services, as the Collector's Kafka exporter writes them
    (``otlp_proto``), then one message that is not an export; the calls per service they make (adjusted counts)."""
    from confluent_kafka import Producer
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    to = Producer({"bootstrap.servers": servers})
    calls: Counter[str] = Counter()
    for e in range(30):
        request = ExportTraceServiceRequest()
        rs = request.resource_spans.add()
        service = f"svc{e % 3}"
        rs.resource.attributes.add(key="service.name").value.string_value = service
        spans = rs.scope_spans.add().spans
        for i in range(20):
            end = (BASE_MS + e * 1000 + i) * 1_000_000
            span = spans.add(trace_id=(e * 100 + i + 1).to_bytes(16, "big"), span_id=(i + 1).to_bytes(8, "big"),
                             name="GET /users/{id}", kind=2 if i % 4 else 3, start_time_unix_nano=end - 5_000_000,
                             end_time_unix_nano=end, trace_state=TRACE_STATES[(e + i) % len(TRACE_STATES)])  # fmt: skip
            calls[service] += adjusted_count(span.trace_state, span.span_id) if i % 4 else 0
            if not i % 4:  # a CLIENT span with a statement: it feeds the statements top-N, not the calls
                span.attributes.add(key="db.query.text").value.string_value = f"SELECT {i} FROM t"
        to.produce(topic, request.SerializeToString())
    to.produce(topic, b"\x0a\xff\xff")  # not an export
    to.flush(30)
    return calls


class LiveTraffic(threading.Thread):
    """Waves of ``events`` events (the poison messages in wave ``poison_wave``), ``pause_s`` apart, from a thread;
    ``calls`` once joined. ``waves`` of them, or fewer once ``until`` is set (a test that needs the topic to grow
    until it has reached some state, however long that takes under load).

    A daemon, ended by :func:`end_traffic` after its test: the traffic of a test that failed before setting ``until``
    must not outlive it. (It once did, with the broker gone: 300 waves of 30 s flushes kept a CI run from exiting.)"""

    def __init__(self, servers: str, topic: str, waves: int, poison_wave: int, pause_s: float = 0.3,
                 events: int = 15_000, until: threading.Event | None = None) -> None:  # fmt: skip
        super().__init__(daemon=True)
        self.servers, self.topic, self.waves, self.poison_wave = servers, topic, waves, poison_wave
        self.pause_s, self.events = pause_s, events
        self.until = until if until is not None else threading.Event()
        self.calls: Counter[str] = Counter()
        TRAFFIC.append(self)
        self.start()

    def run(self) -> None:
        to = producer(self.servers)
        for wave in range(self.waves):
            if self.until.is_set():
                break
            self.calls.update(
                produce(self.servers, self.topic, self.events, seed=wave, poison=wave == self.poison_wave, to=to)
            )
            self.until.wait(self.pause_s)


def endpoint_of(member: subprocess.Popen[str]) -> str:
    """The URL of a member started with ``--port 0`` (its first lines say it)."""
    assert member.stdout is not None
    while True:
        line = member.stdout.readline()
        assert line, "consume exited"
        if "/metrics and /healthz on " in line:
            return line.split(" on ", 1)[1].strip()


def scraped(url: str, name: str, token: str | None = None, **labels: str) -> list[float]:
    """The values of the series ``name`` (with these label values) on the member's ``/metrics``."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    text = urllib.request.urlopen(urllib.request.Request(url + "/metrics", headers=headers), timeout=5).read().decode()
    wanted = [f'{k}="{v}"' for k, v in labels.items()]
    return [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith(name + "{") and all(w in line.split("}", 1)[0] for w in wanted)]  # fmt: skip


def holds_uncommitted(url: str) -> bool:
    """Whether the member at ``url`` has fed events that its store does not have yet."""
    return sum(scraped(url, "drainpipe_kafka_partition_offset")) > sum(
        scraped(url, "drainpipe_kafka_partition_committed_offset")
    )


def group_members(servers: str, group: str) -> tuple[str, list[frozenset[int]]]:
    """The group's state and each member's partitions, as the broker's admin API reports them."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": servers})
    description = admin.describe_consumer_groups([group])[group].result(30)
    members = [frozenset(tp.partition for tp in m.assignment.topic_partitions) for m in description.members]
    return description.state.name, members


def group_clients(servers: str, group: str) -> list[str]:
    """The client ids of the group's members, as the broker's admin API reports them."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": servers})
    return [m.client_id for m in admin.describe_consumer_groups([group])[group].result(30).members]


def wait_for_group(servers: str, group: str, members: int, partitions: int, timeout: float = 60) -> None:
    """Until the broker reports the group stable with ``members`` members that share all ``partitions`` partitions
    of its topic (a rebalance done: a member joined, left or missed its session)."""

    seen: list[Any] = []

    def settled() -> bool:
        state, held = group_members(servers, group)
        seen[:] = [state, [sorted(m) for m in held]]
        together = [p for m in held for p in m]
        return state == "STABLE" and len(held) == members and sorted(together) == list(range(partitions))

    try:
        wait_until(settled, timeout=timeout, interval=0.1)
    except AssertionError:
        raise AssertionError(f"the group is not {members} members sharing {partitions} partitions: {seen}") from None


def wait_for_member(member: subprocess.Popen[str], url: str, what: str, pred: Any, timeout: float = 30) -> Any:
    """Until ``pred(url)`` holds for the member (started with ``--port 0``, at ``url``), which must keep running."""

    def held() -> Any:
        assert member.poll() is None, f"the member exited waiting for {what}"
        return pred(url)

    return wait_until(held, timeout=timeout, interval=0.05)


def wait_for_commit(member: subprocess.Popen[str], url: str) -> None:
    """Until the member (started with ``--port 0``, at ``url``) has committed something to the store."""
    wait_for_member(member, url, "a commit", lambda u: sum(scraped(u, "drainpipe_kafka_partition_committed_offset")))


def stored_calls(url: str) -> Counter[str]:
    """Calls per service in the store (the minute buckets of service_cpm add up to the calls)."""
    from drainpipe.pipeline import open_store

    store = open_store(url)
    try:
        out: Counter[str] = Counter()
        for row in store.query(metric="service_cpm", granularity="minute"):
            out[row[1]] += round(row[5])
        return out
    finally:
        store.close()


def consume(servers: str, topic: str, group: str, store: str, dead: Path, *extra: str,
            checkpoint_s: float = 0.2) -> subprocess.Popen[str]:  # fmt: skip
    cmd = [DRAINPIPE, "consume", "--bootstrap-servers", servers, "--topic", topic, "--group", group, "--store",
           store, "--dead-letter", str(dead), "--checkpoint-s", str(checkpoint_s), "--session-timeout-s", "1",
           "--max-poll-interval-s", "5", *extra]  # fmt: skip
    member = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    STARTED.append(member)
    return member


#: every member a test started (killed after the test if still running: a failed test leaves none behind)
STARTED: list[subprocess.Popen[str]] = []

#: every traffic thread a test started (ended after the test)
TRAFFIC: list[LiveTraffic] = []


def end_traffic() -> None:
    """End every traffic thread a test started: no wave after the one it is producing."""
    while TRAFFIC:
        traffic = TRAFFIC.pop()
        traffic.until.set()
        traffic.join(60)


def kill_members() -> None:
    """Kill every member a test started that still runs, and print the end of what each said (a failed test's
    report shows it)."""
    while STARTED:
        member = STARTED.pop()
        if member.poll() is None:
            member.send_signal(signal.SIGCONT)  # (a member paused by the test)
            member.kill()
        try:
            out = member.communicate(timeout=30)[0] or ""
        except ValueError:  # (its output was read already)
            continue
        print(f"member {member.pid} ({member.returncode}):", *out.splitlines()[-25:], sep="\n  ")


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out
    return out


def rejected(dead: Path) -> set[tuple[str, int, str]]:
    rows = [json.loads(line) for line in dead.read_text().splitlines()] if dead.exists() else []
    return {(r["source"], r["line"], r["reason"]) for r in rows}

"""``drainpipe consume`` against the real broker `make test` starts (scripts/kafka.sh): every valid event of a topic
in the store exactly once while it grows, across kill -9 of a member at random moments; three members joining
(partitions revoked from one and assigned to another), one paused past its session (SIGSTOP) and woken, one killed;
a member whose loop stalls past max.poll.interval and resumes with a checkpoint the store refuses (fencing tokens);
a store outage past max.poll.interval; a broker restart; partitions added to a topic; poison messages to the dead
letter with topic, partition and offset; OTLP protobuf messages, and the member's dashboard; a DuckDB store refused
to a second member with the hint. Each protection was removed once to see its test fail (docs/pipeline.md,
"Kafka", "How this is tested")."""

from __future__ import annotations

import json
import random
import re
import signal
import subprocess
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from kafka_testlib import (
    KAFKA_SH,
    POISON,
    LiveTraffic,
    consume,
    endpoint_of,
    finish,
    group_clients,
    holds_uncommitted,
    new_topic,
    produce,
    produce_otlp,
    rejected,
    scraped,
    stored_calls,
    wait_for_commit,
    wait_for_group,
    wait_for_member,
)
from testlib import TRACE_STATES, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.usefixtures("no_member_left")]


def test_a_member_killed_at_random_moments_then_restarted_stores_every_event_once(servers: str, tmp_path: Path) -> None:
    topic = new_topic(servers, 4)
    store, dead, group = f"duckdb:///{tmp_path / 'k.duckdb'}", tmp_path / "dead.jsonl", f"g-{topic}"
    # the topic grows while members die (for about 8 s: past the last kill)
    traffic = LiveTraffic(servers, topic, waves=24, poison_wave=5, pause_s=0.3, events=5_000)
    rng = random.Random(7)
    partial = []
    for cycle in range(3):
        member = consume(servers, topic, group, store, dead, "--port", "0")
        url = endpoint_of(member)
        if cycle == 0:  # a second member on the same DuckDB file is refused, with the way out
            second = consume(servers, topic, group, store, tmp_path / "d2.jsonl")
            out, _ = second.communicate(timeout=60)
            assert second.returncode == 2 and "need a PostgreSQL store" in out, out
        # killed at a random moment after its first commit (a new member joins once the killed one's session has
        # expired: waiting on the clock alone, a kill could come before it ever commits)
        wait_for_commit(member, url)
        time.sleep(rng.uniform(0.0, 0.6))
        member.send_signal(signal.SIGKILL)
        member.wait(30)
        partial.append(sum(stored_calls(store).values()))
    traffic.join()
    out = finish(consume(servers, topic, group, store, dead, "--exit-at-end"))
    assert stored_calls(store) == traffic.calls, out
    assert any(0 < p < sum(traffic.calls.values()) for p in partial), partial  # a kill landed mid-stream
    assert partial == sorted(partial)  # what was committed stays committed
    reasons = Counter(reason for _, _, reason in rejected(dead))
    assert reasons == Counter(reason for _, reason in POISON), reasons  # each poison message once (by offset)
    assert all(source.startswith(f"kafka:{topic}/") for source, _, _ in rejected(dead))


@pytest.mark.postgres
def test_four_members_with_joins_a_sigstop_and_a_kill_store_every_event_once(
    servers: str, pg_url: str, tmp_path: Path
) -> None:
    """Members come and go while the topic grows: b, c and d join (partitions revoked from those that held them,
    assigned to the newcomer: four members on one PostgreSQL store), b is paused past its session (SIGSTOP) and its
    partitions move on, a is killed and its partitions move on, b wakes (SIGCONT) holding events of partitions it
    lost. Every event is stored once.
    (Without the commit on revoke, the events a read before the first rebalance are counted twice: a commits only
    every 3 s.)"""
    topic = new_topic(servers, 6)
    group, dead = f"g-{topic}", tmp_path / "dead.jsonl"
    paused = threading.Event()  # the topic grows until b is paused holding events (at most 300 waves)
    traffic = LiveTraffic(servers, topic, waves=300, poison_wave=-1, pause_s=0.2, events=5_000, until=paused)

    # each step waits for the group as the broker reports it (its members named by client id), or for the member's
    # own account on /metrics
    def join(name: str, *extra: str, checkpoint_s: float = 0.2) -> subprocess.Popen[str]:
        return consume(servers, topic, group, pg_url, dead, "--kafka-config", f"client.id={name}", *extra,
                       checkpoint_s=checkpoint_s)  # fmt: skip

    a = join("a", "--port", "0", checkpoint_s=3.0)
    wait_for_member(a, endpoint_of(a), "events read", holds_uncommitted)  # a holds events as b joins
    b = join("b", "--port", "0", checkpoint_s=3.0)
    url_b = endpoint_of(b)
    wait_for_group(servers, group, members=2, partitions=6)  # a gave b half of its partitions
    c = join("c")
    wait_for_group(servers, group, members=3, partitions=6)  # a third of them each
    d = join("d")
    wait_for_group(servers, group, members=4, partitions=6)
    wait_for_member(b, url_b, "events read and not committed", holds_uncommitted)
    b.send_signal(signal.SIGSTOP)  # b holds events not committed (it commits every 3 s)
    paused.set()
    # b's session (1 s) expires and the broker drops it; its partitions go to a and c. (Not waiting for a and c to
    # settle: b may be paused inside a store commit, holding the store's merge lock, and their commits wait for it.)
    wait_until(lambda: "b" not in group_clients(servers, group), timeout=60, interval=0.1)
    a.send_signal(signal.SIGKILL)
    a.wait(30)
    wait_until(lambda: "a" not in group_clients(servers, group), timeout=60, interval=0.1)  # c, d take a's share
    b.send_signal(signal.SIGCONT)  # b wakes with its checkpoint overdue, for partitions others own now
    wait_for_member(b, url_b, "the loss noticed",
                    lambda u: sum(scraped(u, "drainpipe_kafka_rebalances_total", kind="rewound")))  # fmt: skip
    for member in (b, c, d):
        member.send_signal(signal.SIGTERM)
    out_b, out_c, out_d = finish(b), finish(c), finish(d)
    assert "rewound 0 times" not in out_b, out_b  # (the summary says it too)
    traffic.join()
    out = finish(consume(servers, topic, group, pg_url, dead, "--exit-at-end"))
    assert stored_calls(pg_url) == traffic.calls, (out_b, out_c, out_d, out)


@pytest.mark.postgres
def test_a_member_stalled_past_max_poll_interval_commits_nothing_when_it_resumes(
    servers: str, pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The zombie the fencing tokens exist for: its loop stalls with events read and not committed, the group
    gives its partitions to another member, and when the loop resumes its overdue checkpoint reaches the store
    before librdkafka has told it anything. The store refuses it (stale tokens); the member drops its work and
    reads its partitions again from the store's offsets. (Without the store's check, the events of those seconds
    are counted by both members.)"""
    from drainpipe.kafka import ConsumeConfig, GroupMember, kafka_consumer
    from drainpipe.pipeline import LocalEngine, default_definitions, open_store
    from drainpipe.pipeline import driver as driver_module
    from drainpipe.server.service import serve_engine_options

    # checkpoints every 3 s, not paced by their cost: on a busy machine a commit of 0.4 s spaced the next to 4 s or
    # more, so after the stall none was due, the member polled first, heard of its loss and dropped its work (nothing
    # to fence: the test waited for a fenced commit that never came)
    monkeypatch.setattr(driver_module, "PACE", 0)
    topic = new_topic(servers, 4)
    group, dead = f"g-{topic}", tmp_path / "dead.jsonl"
    traffic = LiveTraffic(servers, topic, waves=24, poison_wave=-1, pause_s=0.2)  # flowing through the stall
    definitions = default_definitions()
    store = open_store(pg_url)
    store.register(definitions.all)
    engine = LocalEngine(definitions, store, serve_engine_options())
    config = ConsumeConfig(servers, [topic], group, checkpoint_s=3.0, max_poll_interval_s=1, session_timeout_s=1)
    member = GroupMember(config, engine, definitions, kafka_consumer(config))
    stall = threading.Event()
    feed = member._feed

    def stalling_feed(messages: list[Any]) -> None:
        feed(messages)
        # right after feeding messages, so that the stall holds events read and not committed (a stall after an
        # empty poll could follow a checkpoint that committed everything: then there is nothing to fence, and the
        # member only learns of its loss at the next poll)
        if stall.is_set() and member.partitions and any(m.error() is None for m in messages):
            stall.clear()
            time.sleep(4.0)  # past max.poll.interval (1 s): librdkafka leaves the group meanwhile

    monkeypatch.setattr(member, "_feed", stalling_feed)
    a = threading.Thread(target=member.run)
    a.start()
    wait_for_group(servers, group, members=1, partitions=4)
    # b commits rarely, so the zombie's commit lands before b has committed past it (a commit all of whose
    # offsets are behind the store's is skipped as a retry anyway)
    b = consume(servers, topic, group, pg_url, dead, checkpoint_s=10.0)
    wait_for_group(servers, group, members=2, partitions=4)  # the two share the partitions
    stall.set()  # a stalls holding events it read, then resumes with its 3 s checkpoint overdue
    wait_until(lambda: member.fenced_commits, timeout=60, interval=0.05)  # the store refused the overdue commit
    member.stop()
    a.join(30)
    engine.close()
    store.close()
    b.send_signal(signal.SIGTERM)
    out_b = finish(b)
    traffic.join()
    out = finish(consume(servers, topic, group, pg_url, dead, "--exit-at-end"))
    assert stored_calls(pg_url) == traffic.calls, (out_b, out)
    assert member.fenced_commits >= 1, (member.fenced_commits, member.losses)  # the path this test is for


def test_a_store_outage_longer_than_max_poll_interval_pauses_the_partitions_and_keeps_them(
    servers: str, tmp_path: Path
) -> None:
    """The store is down for 3.5 s, past max.poll.interval (1.5 s), while traffic flows: the member's checkpoints
    queue up, it pauses its partitions and keeps polling, so the group never takes them; when the store is back it
    resumes, and every event is stored once. (A member that waited for the store instead, not polling, lost its
    partitions to a rebalance: the sabotage in docs/pipeline.md.)"""
    from drainpipe.kafka import ConsumeConfig, GroupMember, kafka_consumer
    from drainpipe.pipeline import LocalEngine, default_definitions, open_store
    from drainpipe.server.service import serve_engine_options
    from testlib import Outage

    topic = new_topic(servers, 3)
    group, url = f"g-{topic}", f"duckdb:///{tmp_path / 'outage.duckdb'}"
    traffic = LiveTraffic(servers, topic, waves=16, poison_wave=-1, pause_s=0.25, events=20_000)
    definitions = default_definitions()
    store = Outage(open_store(url))
    store.register(definitions.all)
    engine = LocalEngine(definitions, store, serve_engine_options(store_retry_s=(0.05, 0.2)))
    config = ConsumeConfig(servers, [topic], group, checkpoint_s=0.2, max_poll_interval_s=1.5, session_timeout_s=1)
    member = GroupMember(config, engine, definitions, kafka_consumer(config))
    a = threading.Thread(target=member.run)
    a.start()
    wait_until(lambda: any(stored for _, _, stored in member.positions.values()), timeout=30, interval=0.05)
    store.down.set()
    time.sleep(3.5)  # the outage itself: longer than max.poll.interval
    store.down.clear()
    traffic.join()
    wait_until(lambda: stored_calls(url) == traffic.calls, timeout=60, interval=0.1)  # the member caught up
    held = (member.assignments, member.revocations, member.losses)  # (leaving revokes)
    member.stop()
    a.join(30)
    engine.close()
    store.close()
    assert held == (1, 0, 0), "the group took the partitions"
    assert member.pauses >= 1
    out = finish(consume(servers, topic, group, url, tmp_path / "dead.jsonl", "--exit-at-end"))
    assert stored_calls(url) == traffic.calls, out


@pytest.mark.postgres
@pytest.mark.exclusive  # restarts the broker every Kafka test shares
def test_a_broker_restart_under_four_members_loses_and_doubles_nothing(
    servers: str, pg_url: str, tmp_path: Path
) -> None:
    """The broker (the group's coordinator, every partition's leader) restarts while four members on one PostgreSQL
    store read a topic, each holding events not committed: their sessions expire meanwhile (the
    partitions are lost: the group may give them to another member), so each drops what it had not committed and
    reads on from the store's offsets once the broker is back; every event is stored once. (Without that rewind,
    the events held at the restart are counted twice.)"""
    topic = new_topic(servers, 4)
    dead, group = tmp_path / "dead.jsonl", f"g-{topic}"
    # the topic grows until every member holds events: with a fixed number of waves, the traffic could end before the
    # group had settled, and a member given a partition already read and committed (at a revoke) had nothing to hold.
    # It ends before the restart: a producer cut off by it for longer than its flush would count events it never
    # delivered
    holding = threading.Event()
    traffic = LiveTraffic(servers, topic, waves=300, poison_wave=3, pause_s=0.2, events=5_000, until=holding)
    # no checkpoint before they leave: each member holds everything it read when the broker goes away
    members = [consume(servers, topic, group, pg_url, dead, "--port", "0", "--kafka-config", f"client.id=m{i}",
                       checkpoint_s=60.0) for i in range(4)]  # fmt: skip
    urls = [endpoint_of(m) for m in members]
    wait_for_group(servers, group, members=4, partitions=4)
    for member, url in zip(members, urls):
        wait_for_member(member, url, "events read", holds_uncommitted)  # assigned, reading, holding
    holding.set()
    traffic.join()
    restart = subprocess.run(["bash", str(KAFKA_SH), "restart"], capture_output=True, text=True, timeout=120)
    assert restart.returncode == 0, restart.stderr

    def lost(_: str) -> float:
        return sum(sum(scraped(u, "drainpipe_kafka_rebalances_total", kind="lost")) for u in urls)

    def read_to_end(_: str) -> bool:
        lags = [lag for u in urls for lag in scraped(u, "drainpipe_kafka_partition_lag")]
        return len(lags) == 4 and not any(lags)

    wait_for_member(members[0], urls[0], "the loss noticed", lost, timeout=60)
    wait_for_member(members[0], urls[0], "every partition read to its end", read_to_end, timeout=60)
    for member in members:
        member.send_signal(signal.SIGTERM)  # each commits what it holds as it leaves
    out = "".join(finish(member) for member in members)
    assert re.search(r"lost [1-9]", out), out  # the path this test is for
    out += finish(consume(servers, topic, group, pg_url, dead, "--exit-at-end"))
    assert stored_calls(pg_url) == traffic.calls, out
    assert Counter(reason for _, _, reason in rejected(dead)) == Counter(reason for _, reason in POISON)


def test_partitions_added_to_a_topic_are_read_from_their_start(servers: str, tmp_path: Path) -> None:
    """Partitions added to a topic while a member reads it are assigned to it at the next metadata refresh (1 s
    here) and read from their first offset (no stored position): the events written to them before that are not
    skipped. The member is paused (SIGSTOP) while they are added and written, so that it cannot see them earlier.
    (Starting new partitions at their end, Kafka's default, loses those events.)"""
    from confluent_kafka.admin import AdminClient, NewPartitions

    topic = new_topic(servers, 2)
    store, dead, group = f"duckdb:///{tmp_path / 'p.duckdb'}", tmp_path / "dead.jsonl", f"g-{topic}"
    calls = produce(servers, topic, 5_000, seed=1, poison=False)
    member = consume(servers, topic, group, store, dead, "--port", "0", "--kafka-config",
                     "topic.metadata.refresh.interval.ms=1000")  # fmt: skip
    url = endpoint_of(member)
    wait_for_commit(member, url)
    admin = AdminClient({"bootstrap.servers": servers})
    member.send_signal(signal.SIGSTOP)
    try:
        admin.create_partitions([NewPartitions(topic, 5)])[topic].result(30)
        calls += produce(servers, topic, 20_000, seed=2, poison=False)  # a new producer: it writes to all 5
    finally:
        member.send_signal(signal.SIGCONT)

    def all_five_read() -> bool:
        assert member.poll() is None, "the member ended"
        lags = scraped(url, "drainpipe_kafka_partition_lag")
        return len(lags) >= 5 and not any(lags)

    wait_until(all_five_read, timeout=30, interval=0.2, what="every partition, the new ones too, read to its end")
    member.send_signal(signal.SIGTERM)
    out = finish(member)
    assert stored_calls(store) == calls, out


def test_otlp_protobuf_messages_as_the_collectors_kafka_exporter_writes_them(servers: str, tmp_path: Path) -> None:
    topic = new_topic(servers, 2)
    calls = produce_otlp(servers, topic)  # adjusted counts: sampled spans count as the requests they stand for
    spans = 30 * 20  # the request spans and the CLIENT spans with statements (accepted events)
    malformed = sum(1 for e in range(30) for i in range(20) if i % 4 and TRACE_STATES[(e + i) % 5] == "ot=th:zz")
    store, dead = f"duckdb:///{tmp_path / 'o.duckdb'}", tmp_path / "dead.jsonl"
    member = consume(servers, topic, f"g-{topic}", store, dead, "--encoding", "otlp_proto", "--port", "0")
    url = endpoint_of(member)
    # /metrics: the RED series count every request, and no partition lags once all is read and committed

    def read_and_committed() -> tuple[int, list[float]] | None:
        requests, lags = sum(scraped(url, "drainpipe_calls_total")), scraped(url, "drainpipe_kafka_partition_lag")
        return (requests, lags) if requests == sum(calls.values()) and len(lags) == 2 and not any(lags) else None

    wait_until(read_and_committed, timeout=30, interval=0.3, what="every request counted, no partition lagging")
    health = urllib.request.urlopen(url + "/healthz", timeout=5)
    assert health.status == 200 and json.load(health)["status"] == "ok"
    # the dashboard's view: the partitions held with their lag, the busiest services from the store
    page = urllib.request.urlopen(url + "/", timeout=5).read().decode()
    assert 'id="kafka-partitions"' in page

    def the_view() -> dict | None:
        stats = json.load(urllib.request.urlopen(url + "/v1/stats", timeout=5))
        top = {row[0] for row in stats["top_services"]["rows"]}
        done = len(stats["kafka"]["partitions"]) == 2 and top == set(calls) and stats["ingest"]["accepted"] == spans
        return stats if done else None

    stats = wait_until(the_view, timeout=30, interval=0.3, what="the partitions and the services in /v1/stats")
    kafka = stats["kafka"]
    assert kafka["group"] == f"g-{topic}" and all(p["lag"] == 0 for p in kafka["partitions"])
    assert stats["ingest"]["rejected"] == 1 and "alerts" not in stats and "log" not in stats
    assert stats["ingest"]["warnings"] == {"malformed sampling threshold": malformed}
    drill = json.load(urllib.request.urlopen(url + "/v1/service?service=svc0&range=minute", timeout=5))
    assert sum(r["calls"] for r in drill["endpoints"]) == calls["svc0"]
    member.send_signal(signal.SIGTERM)
    out = finish(member)
    assert stored_calls(store) == +calls, out
    assert "rejected 1" in out and f"accepted with a warning: malformed sampling threshold {malformed}" in out
    [(source, _, reason)] = rejected(dead)  # the one message that is not an export, once
    assert source.startswith(f"kafka:{topic}/") and reason.startswith("invalid OTLP protobuf"), reason


def test_exit_at_end_on_a_topic_that_does_not_exist_is_one_clear_error(servers: str, tmp_path: Path) -> None:
    """Draining a topic that is not there would wait for ever (a long-running member waits for it, warned)."""
    member = consume(servers, "no-such-topic-here", "g-none", f"duckdb:///{tmp_path / 'n.duckdb'}",
                     tmp_path / "dead.jsonl", "--exit-at-end")  # fmt: skip
    out = member.communicate(timeout=60)[0]
    assert member.returncode != 0 and "Kafka topic 'no-such-topic-here' does not exist" in out, out
    assert "Traceback" not in out


def test_a_member_with_a_token_shows_its_routes_only_with_it(servers: str, tmp_path: Path) -> None:
    """``consume --token``: the member's /v1/stats, /v1/service and /metrics want the bearer token (as Prometheus
    sends it), / and /healthz do not; the rule is serve's (http_face)."""
    import urllib.error

    topic = new_topic(servers, 1)
    calls = produce(servers, topic, 300, seed=3, poison=False)
    store = f"duckdb:///{tmp_path / 't.duckdb'}"
    member = consume(servers, topic, f"g-{topic}", store, tmp_path / "dead.jsonl", "--port", "0", "--token", "s3cret")
    url = endpoint_of(member)

    def get(path: str, token: str | None = None) -> int:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            return urllib.request.urlopen(urllib.request.Request(url + path, headers=headers), timeout=5).status
        except urllib.error.HTTPError as exc:
            return exc.code

    for path in ("/v1/stats", "/v1/service?service=svc0&range=minute", "/metrics"):
        assert (get(path), get(path, "wrong"), get(path, "s3cret")) == (401, 401, 200), path
    assert get("/healthz") == 200 and get("/") == 200

    def committed_to_the_end(u: str) -> bool:
        lag = scraped(u, "drainpipe_kafka_partition_lag", "s3cret")
        offsets = [scraped(u, f"drainpipe_kafka_partition_{k}offset", "s3cret") for k in ("", "committed_")]
        return lag == [0.0] and offsets[0] == offsets[1] and offsets[0][0] > 0

    wait_for_member(member, url, "everything committed", committed_to_the_end)
    member.send_signal(signal.SIGTERM)
    out = finish(member)
    assert stored_calls(store) == calls, out

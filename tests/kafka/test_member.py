"""The group member's own logic without a broker: its consumer is handed in (tests/kafka/fake_consumer.py), so the
rebalances, fencing and rewinds are scripted at exact moments, and every event is counted in the store. The same
paths run against a real broker in test_consume.py; here each runs in well under a second.

Each protection was removed once to see its test fail: the checkpoint in ``_revoked`` (the next owner read the
revoked partition again: events counted twice), the rollback in ``_rewind`` (after a loss, the uncommitted events
were stored with the next commit and read again: twice), the token check in ``_rewind`` (the fenced member read on a
partition another member owned: twice), and the stop on a failed seek (the member read on past what it dropped:
lost)."""

from __future__ import annotations

import json
import random
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException
from fake_consumer import FakeConsumer

from drainpipe.errors import InputError
from drainpipe.inputs import DeadLetter
from drainpipe.inputs.messages import KAFKA_SOURCE, partition_part
from drainpipe.kafka import ConsumeConfig, GroupMember
from drainpipe.kafka import member as member_module
from drainpipe.pipeline import LocalEngine, default_definitions, open_store
from drainpipe.pipeline import driver as driver_module
from drainpipe.server import serve_engine_options
from drainpipe.server.disk import DiskLimits, DiskWatch
from kafka_testlib import BASE_MS, stored_calls
from testlib import fill_to, small_volume

pytest.importorskip("confluent_kafka")

P0, P1 = ("t", 0), ("t", 1)


def topic_log(
    partitions: int, per_partition: int, seed: int
) -> tuple[dict[str, list[list[bytes | None]]], Counter[str]]:
    """A topic ``t`` of one-event JSON messages, and the calls per service in it."""
    rng = random.Random(seed)
    calls: Counter[str] = Counter()
    log: list[list[bytes | None]] = []
    for _ in range(partitions):
        values: list[bytes | None] = []
        for i in range(per_partition):
            service = f"svc{rng.randrange(4)}"
            calls[service] += 1
            values.append(json.dumps({"ts": BASE_MS + rng.randrange(600_000), "service": service,
                                      "endpoint": f"/e{i % 5}", "latency_ms": rng.randrange(1, 300),
                                      "status": True}).encode())  # fmt: skip
        log.append(values)
    return {"t": log}, calls


def run_member(url: str, consumer: FakeConsumer, checkpoint_s: float = 60.0,
               script_member: list[GroupMember] | None = None, max_commits: int = 2,
               disk: DiskWatch | None = None, dead_letter: DeadLetter | None = None,
               release_memory: bool = False) -> GroupMember:  # fmt: skip
    """Run one member on ``consumer`` into the store at ``url`` until it holds only partitions read to their end
    (``exit_at_end``); the store and engine closed after. ``script_member`` receives the member first (for a script
    that looks at it)."""
    definitions = default_definitions()
    store = open_store(url)
    store.register(definitions.all)
    engine = LocalEngine(definitions, store, serve_engine_options(l2_flush_s=checkpoint_s))
    config = ConsumeConfig("fake:9092", ["t"], "g", checkpoint_s=checkpoint_s, max_commits=max_commits,
                           exit_at_end=True, release_memory=release_memory)  # fmt: skip
    member = GroupMember(config, engine, definitions, consumer, dead_letter, disk)
    if script_member is not None:
        script_member.append(member)
    running = threading.Thread(target=member.run)
    running.start()
    running.join(60)
    stuck = running.is_alive()  # e.g. a member that reads on a partition another owns: fenced again and again
    if stuck:
        member.stop()
        running.join(30)
    engine.close()
    store.close()
    assert not stuck, f"the member did not finish: {member.rewinds} rewinds, {member.fenced_commits} fenced commits"
    # it left the group before closing the consumer, its partitions revoked in a poll: a rebalance served inside
    # librdkafka's close can hang it for good
    assert consumer.closed and consumer.closed_with == [], consumer.closed_with
    return member


def once(script: Callable[[FakeConsumer], None]) -> Callable[[FakeConsumer], None]:
    """``script`` at the first consume() only."""
    return lambda c: script(c) if c.calls == 1 else None


def stored_offset(url: str, key: tuple[str, int]) -> int:
    store = open_store(url)
    try:
        rows = store.progress(KAFKA_SOURCE, part=partition_part("fake-cluster", *key))
        ends = {r.end for r in rows if r.name in default_definitions().names}  # (not the fencing token's row)
    finally:
        store.close()
    assert len(ends) <= 1, ends  # every definition alike
    return ends.pop() if ends else 0


def test_a_revoked_partition_is_committed_before_it_goes_and_the_next_owner_reads_on_from_there(tmp_path: Path) -> None:
    log, calls = topic_log(2, 600, seed=1)
    url = f"duckdb:///{tmp_path / 'r.duckdb'}"
    seen: dict[str, int] = {}

    def script(c: FakeConsumer) -> None:
        if c.calls == 1:
            c.assign(P0, P1)
        elif c.fetched.get(P1, 0) >= 200 and "revoked at" not in seen:
            seen["revoked at"] = c.fetched[P1]  # everything fetched is fed: consume() is called between batches
            c.revoke(P1)  # no periodic checkpoint has run (60 s): the revoke's own commit must store it
            seen["stored at revoke"] = stored_offset(url, P1)

    first = run_member(url, FakeConsumer(log, script))
    assert seen["stored at revoke"] == seen["revoked at"] == 200
    assert (first.assignments, first.revocations) == (1, 2)  # (P1's, then P0's as it leaves the group)
    second = FakeConsumer(log, once(lambda c: c.assign(P1)))
    run_member(url, second)
    assert second.fetched == {P1: 400}  # from the stored offset on
    assert stored_calls(url) == calls


def test_a_lost_partition_drops_what_was_not_committed_and_reads_it_again_from_the_store(tmp_path: Path) -> None:
    log, calls = topic_log(1, 800, seed=2)
    url = f"duckdb:///{tmp_path / 'l.duckdb'}"

    def script(c: FakeConsumer) -> None:
        if c.calls == 1:
            c.assign(P0)
        elif c.calls == 4:  # 300 messages fed, none committed (60 s)
            c.lose(P0)  # the session expired: another member may own it now
            c.assign(P0)  # ... and the group gives it back

    consumer = FakeConsumer(log, script)
    member = run_member(url, consumer)
    assert (member.losses, member.rewinds, member.assignments) == (1, 1, 2)
    assert consumer.fetched == {P0: 300 + 800}  # the 300 dropped were read again, from the store's offset 0
    assert stored_calls(url) == calls


def test_poison_messages_read_again_after_a_rewind_are_in_the_dead_letter_once(tmp_path: Path) -> None:
    """Issue 58: the dead letter was at least once. Two poison messages among the 300 a loss drops are read again
    after the rewind and rejected again; the dead letter holds each once (without its check: twice)."""
    log, calls = topic_log(1, 800, seed=2)
    for i in (50, 150):
        calls[json.loads(log["t"][0][i])["service"]] -= 1  # type: ignore[arg-type]
        log["t"][0][i] = b"not json"
    url = f"duckdb:///{tmp_path / 'p.duckdb'}"

    def script(c: FakeConsumer) -> None:
        if c.calls == 1:
            c.assign(P0)
        elif c.calls == 4:  # 300 messages fed (the poison among them), none committed
            c.lose(P0)
            c.assign(P0)

    with DeadLetter(tmp_path / "dead.jsonl") as dead:
        member = run_member(url, FakeConsumer(log, script), dead_letter=dead)
    assert member.rewinds == 1 and member.stats.rejected == 4  # each rejected by both reads
    records = [json.loads(line) for line in (tmp_path / "dead.jsonl").read_text().splitlines()]
    assert [(r["line"], r["raw"]["value"]) for r in records] == [(50, "not json"), (150, "not json")]
    assert stored_calls(url) == calls


def test_a_fenced_commit_gives_up_the_partition_another_member_took_and_rereads_the_rest(tmp_path: Path) -> None:
    log, calls = topic_log(2, 500, seed=3)
    url = f"duckdb:///{tmp_path / 'f.duckdb'}"
    members: list[GroupMember] = []
    taken: dict[str, int] = {}

    def script(c: FakeConsumer) -> None:
        if c.calls == 1:
            c.assign(P0, P1)
        elif c.calls == 3 and not taken:  # another member is given P0 (its assignment issues a new token)
            store = members[0].engine.store
            taken["token"] = store.fence(KAFKA_SOURCE, partition_part("fake-cluster", *P0))

    first = run_member(url, FakeConsumer(log, script), checkpoint_s=0.0, script_member=members)
    assert first.fenced_commits >= 1 and first.rewinds >= 1
    assert P0 not in first.partitions  # given up: its token moved on
    assert stored_offset(url, P1) == 500  # the rest was read again from the store and to its end
    second = FakeConsumer(log, once(lambda c: c.assign(P0)))
    run_member(url, second)
    assert stored_calls(url) == calls


def test_a_partition_assigned_while_the_store_restarts_waits_for_it_and_every_event_is_stored_once(
    tmp_path: Path,
) -> None:
    """A rebalance gives this member P1 while the store is down for a moment: its fence and its offsets are asked
    again with the engine's backoff (the member ended with StoreUnavailable, its partitions left to the others
    while the store was still down); then every event of both partitions is stored once."""
    from drainpipe.errors import StoreUnavailable

    log, calls = topic_log(2, 400, seed=8)
    url = f"duckdb:///{tmp_path / 'o.duckdb'}"
    members: list[GroupMember] = []
    refused: list[str] = []

    def script(c: FakeConsumer) -> None:
        if c.calls == 1:
            c.assign(P0)
        elif c.calls == 3:
            store = members[0].engine.store
            fence, books = store.fence, store.progress

            def down(name: str, real: Callable[..., object]) -> Callable[..., object]:
                def refuse(*args: object, **kwargs: object) -> object:
                    if refused.count(name) < 2:  # each refused twice: the fence, then the offsets' read
                        refused.append(name)
                        raise StoreUnavailable("connection refused (the server restarts)")
                    return real(*args, **kwargs)

                return refuse

            store.fence = down("fence", fence)  # type: ignore[method-assign]
            store.progress = down("progress", books)  # type: ignore[method-assign]
            c.assign(P1)

    member = run_member(url, FakeConsumer(log, script), script_member=members)
    assert refused == ["fence", "fence", "progress", "progress"]
    assert member.failed == ""
    assert stored_offset(url, P0) == stored_offset(url, P1) == 400
    assert stored_calls(url) == calls


def test_a_poll_whose_events_together_do_not_fit_one_batch_is_decoded_half_by_half(monkeypatch, tmp_path: Path) -> None:
    """Values that each fit but together pass 2 GiB of text in a column (a poll of large OTLP exports) made the
    decoder raise OverflowError, which ended the member (and the next one, at the same poll). The poll is decoded
    half by half: every event stored once. (Simulated: more than 7 values at once overflow.)"""
    from drainpipe.kafka import member as member_module

    real = member_module.decode_values
    overflowed = []

    def decode(values, *args, **kwargs):
        if len(values) > 7:
            overflowed.append(len(values))
            raise OverflowError("more than 2 GiB of text in one column")
        return real(values, *args, **kwargs)

    monkeypatch.setattr(member_module, "decode_values", decode)
    log, calls = topic_log(2, 300, seed=11)
    url = f"duckdb:///{tmp_path / 'h.duckdb'}"
    run_member(url, FakeConsumer(log, once(lambda c: c.assign(P0, P1))))
    assert overflowed and stored_calls(url) == calls
    assert stored_offset(url, P0) == stored_offset(url, P1) == 300


def test_a_rewind_whose_seek_fails_stops_the_member_and_the_next_one_stores_every_event_once(tmp_path: Path) -> None:
    """Reading on from where the consumer stands after a failed seek would skip what the rewind dropped: the member
    stops instead (InputError), and the next member reads the partitions from the store's offsets."""
    log, calls = topic_log(2, 400, seed=4)
    url = f"duckdb:///{tmp_path / 's.duckdb'}"

    class SeekFails(FakeConsumer):
        def seek(self, tp: object) -> None:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "injected: seek failed"))

    def script(c: FakeConsumer) -> None:
        if c.calls == 1:
            c.assign(P0, P1)
        elif c.calls == 3:
            c.lose(P1)  # P0 is kept, and rewound to the store's offset: the seek fails

    member = run_member(url, SeekFails(log, script))
    assert member.failure is InputError and "cannot rewind" in member.failed, member.failed
    assert stored_calls(url) != calls  # it stopped before the end, its dropped events not stored
    run_member(url, FakeConsumer(log, once(lambda c: c.assign(P0, P1))))
    assert stored_calls(url) == calls


def test_a_store_behind_pauses_the_partitions_and_resumes_them(tmp_path: Path) -> None:
    """``max_commits`` checkpoints queued: the member pauses its partitions (what waits for the store waits in
    Kafka), keeps calling consume() (its membership), and resumes once the store has caught up."""
    log, calls = topic_log(2, 300, seed=5)
    url = f"duckdb:///{tmp_path / 'p.duckdb'}"
    paused_calls = []

    def script(c: FakeConsumer) -> None:
        if c.calls == 1:
            c.assign(P0, P1)
        if c.paused:
            paused_calls.append(c.calls)

    # a checkpoint every round and one commit allowed in flight: the throttle looks right after each checkpoint,
    # while its commit is still queued (a store write takes milliseconds), whatever the machine's speed
    member = run_member(url, FakeConsumer(log, script, fetch=10), checkpoint_s=0.0, max_commits=1)
    assert member.pauses >= 1 and paused_calls
    assert stored_calls(url) == calls


def test_the_member_gives_freed_memory_back_before_its_checkpoints_only_in_a_process_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``release_memory`` (``drainpipe consume``), the member watches its heap from the start of its run to
    its close (a thread that trims as the resident set grows while a commit is in flight and nothing is read) and
    trims before every checkpoint that commits events; without it (a program that embeds a member), neither."""
    watches: list[FakeHeap] = []
    members: list[GroupMember] = []

    class FakeHeap:
        def __init__(self, step: int, when: Callable[[], bool]) -> None:
            self.step, self.when, self.every_s, self.stopped, self.released = step, when, 0.0, False, []
            self.would_trim: list[bool] = []  # at each checkpoint's release: what the watcher's when() said
            watches.append(self)

        def start(self, every_s: float) -> None:
            self.every_s = every_s

        def stop(self) -> None:
            self.stopped = True

        def release(self) -> bool:
            assert self.every_s and not self.stopped  # (watched while it reads)
            self.released.append(members[-1].driver.uncommitted)
            self.would_trim.append(self.when())
            return True

    monkeypatch.setattr(member_module, "HeapWatch", FakeHeap)
    # checkpoints unpaced: each round commits, or its last commit is still in flight (not reaped), so the final
    # checkpoint, after the reading, finds a commit in flight
    monkeypatch.setattr(driver_module, "PACE", 0)
    log, calls = topic_log(2, 300, seed=11)

    looks: list[tuple[bool, int, int]] = []  # at each fetch: the watch would trim, commits in flight, last poll's

    def script(c: FakeConsumer) -> None:
        if c.calls == 1:
            c.assign(P0, P1)
        if watches and members and c.returned:
            looks.append((watches[-1].when(), members[-1].driver.queued, c.returned[-1][0]))

    owned = f"duckdb:///{tmp_path / 'owned.duckdb'}"
    run_member(owned, FakeConsumer(log, script, fetch=50), checkpoint_s=0.0, script_member=members,
               release_memory=True)  # fmt: skip
    assert stored_calls(owned) == calls
    [heap] = watches
    assert heap.step == member_module.HEAP_STEP_BYTES and heap.every_s == member_module.HEAP_EVERY_S
    assert heap.stopped  # (its thread ends with the member)
    assert len(heap.released) >= 2 and all(n > 0 for n in heap.released)  # a checkpoint every round of 50 a fetch
    # the watcher trims only while a commit is in flight and nothing is read: never while polls bring messages
    assert any(queued and polled for _, queued, polled in looks), looks  # (commits in flight while reading)
    assert not any(when for when, queued, polled in looks if polled or not queued), looks
    assert not heap.when()  # (nothing in flight at the end)
    assert heap.would_trim[-1]  # the last checkpoint, after the reading: the watcher trims the commit in flight
    watches.clear()
    embedded = f"duckdb:///{tmp_path / 'embedded.duckdb'}"
    run_member(embedded, FakeConsumer(log, script, fetch=50), checkpoint_s=0.0, script_member=members)
    assert stored_calls(embedded) == calls and watches == []


def test_the_heap_watch_stops_with_the_member_even_when_the_consumers_close_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watcher's thread holds the member and trims the whole process: a close whose consumer fails to close still
    stops it (the error is the caller's; a second close does nothing)."""
    stopped: list[bool] = []

    class FakeHeap:
        def __init__(self, step: int, when: Callable[[], bool]) -> None:
            pass

        def stop(self) -> None:
            stopped.append(True)

    class FailingClose(FakeConsumer):
        def close(self) -> None:
            raise RuntimeError("close failed")

    monkeypatch.setattr(member_module, "HeapWatch", FakeHeap)
    definitions = default_definitions()
    store = open_store(f"duckdb:///{tmp_path / 'd.duckdb'}")
    engine = LocalEngine(definitions, store, serve_engine_options())
    try:
        config = ConsumeConfig("fake:9092", ["t"], "g", release_memory=True)
        member = GroupMember(config, engine, definitions, FailingClose(topic_log(1, 1, seed=1)[0], lambda c: None))
        with pytest.raises(RuntimeError, match="close failed"):
            member.close()
        assert stopped == [True]
        member.close()  # (closed once)
        assert stopped == [True]
    finally:
        engine.close()
        store.close()


def test_a_disk_under_the_refusal_threshold_pauses_the_partitions_until_space_is_freed(tmp_path: Path) -> None:
    """consume cannot answer 503: it pauses its partitions (keeping them and its membership) while the store's
    volume is under the refusal threshold, and reads on once space is freed; every event once."""
    log, calls = topic_log(2, 600, seed=9)
    seen: dict[str, int] = {}
    with small_volume(tmp_path / "vol", 32) as vol:
        url = f"duckdb:///{vol / 'd.duckdb'}"
        filler = vol / "filler"
        watch = DiskWatch({"store": str(vol)}, DiskLimits(12 << 20, 6 << 20), every_s=0.02)

        def script(c: FakeConsumer) -> None:
            if c.calls == 1:
                c.assign(P0, P1)
            elif c.fetched.get(P0, 0) >= 200 and "filled at" not in seen:
                seen["filled at"] = sum(c.fetched.values())
                fill_to(filler, 3 << 20)
            elif c.paused and "paused at" not in seen:
                seen["paused at"] = sum(c.fetched.values())
                seen["paused calls"] = c.calls
            elif "paused at" in seen and c.calls >= seen["paused calls"] + 5 and filler.exists():
                seen["still paused at"] = sum(c.fetched.values())  # nothing read while paused
                filler.unlink()

        member = run_member(url, FakeConsumer(log, script), disk=watch)
        assert member.disk_pauses == 1 and seen["still paused at"] == seen["paused at"], seen
        assert stored_calls(url) == calls


def test_a_definition_the_store_has_not_applied_reads_a_partition_from_its_start_while_the_others_read_on(
    tmp_path: Path,
) -> None:
    """The driver's policy per message: on P0 every definition but ``service_cpm`` is applied up to offset 241 (the
    books say so), so the messages before it are aggregated for ``service_cpm`` alone and those after for all; P1,
    with no books, for all. A poll's runs of one partition look the policy up once: the run of offsets 200-299 (100
    messages a partition a poll) crosses 241 and must change its definitions there."""
    from drainpipe.inputs.messages import KAFKA_SOURCE, partition_part
    from drainpipe.pipeline import SourceProgress

    log, calls = topic_log(2, 600, seed=5)
    url = f"duckdb:///{tmp_path / 'n.duckdb'}"
    names = default_definitions().names
    store = open_store(url)
    store.register(default_definitions().all)
    part = partition_part("fake-cluster", *P0)
    store.merge([], progress=[SourceProgress(KAFKA_SOURCE, part, n, 241) for n in names if n != "service_cpm"])
    store.close()
    run_member(url, FakeConsumer(log, once(lambda c: c.assign(P0, P1)), fetch=100))
    assert stored_calls(url) == calls  # service_cpm: every message
    store = open_store(url)
    try:
        endpoint_calls = sum(round(r[5]) for r in store.query(metric="endpoint_cpm", granularity="minute"))
    finally:
        store.close()
    assert endpoint_calls == 600 + 600 - 241  # the others: P1 whole, P0 from offset 241


def test_a_poll_takes_about_poll_bytes_of_values_whatever_the_size_of_a_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Messages leave librdkafka's bounded queue as a poll collects them, so only the poll's own size bounds what a
    batch holds: the member asks for as many messages as the last poll's mean value size fits in POLL_BYTES (50,000
    messages of 100 events each once held 500 MB). Sabotage: asking for CONSUME_MESSAGES each time fails it."""
    from drainpipe.kafka import member as member_module

    monkeypatch.setattr(member_module, "POLL_BYTES", 16 << 10)
    small, calls = topic_log(1, 400, seed=7)  # one event a message (~95 bytes)
    big = [b"\n".join(small["t"][0][i : i + 50]) for i in range(0, 400, 10)]  # up to 50 events a message
    consumer = FakeConsumer({"t": [small["t"][0], big]}, once(lambda c: c.assign(P0, P1)), fetch=20)
    url = f"duckdb:///{tmp_path / 'p.duckdb'}"
    run_member(url, consumer)
    assert consumer.asked[0] == member_module.CONSUME_MESSAGES  # nothing seen yet
    asks = 0
    for (n, size), asked in zip(consumer.returned, consumer.asked[1:]):
        if size:  # (a poll that brought no values leaves the ask as it was)
            assert asked == min(member_module.CONSUME_MESSAGES, (16 << 10) * n // size), consumer.asked
            asks += 1
    assert asks >= 10 and min(consumer.asked) < 20 < max(consumer.asked[1:]), consumer.asked  # both ways
    in_big = Counter(json.loads(line)["service"] for m in big for line in m.split(b"\n"))
    assert stored_calls(url) == calls + in_big


def test_consume_opens_its_store_through_live_store_url(monkeypatch, tmp_path: Path) -> None:
    """``consume`` opens its DuckDB store as ``serve`` does, with LIVE_DUCKDB_OPTIONS (a peak PSS of 362-383 MB against
    379-397 on 5M one-event messages). No broker: the store is opened first, and the open is refused here once the
    URL is seen. What ``live_store_url`` adds and keeps is its own test's (tests/pipeline/test_store.py)."""
    import drainpipe.pipeline
    from drainpipe.errors import StoreError
    from drainpipe.kafka import consume
    from drainpipe.pipeline import LIVE_DUCKDB_OPTIONS, duckdb_config

    opened: list[str] = []

    def recording_open(url: str, **kw: object) -> None:
        opened.append(url)
        raise StoreError("not opened")

    monkeypatch.setattr(drainpipe.pipeline, "open_store", recording_open)
    config = ConsumeConfig("127.0.0.1:1", ["t"], "g")
    with pytest.raises(StoreError, match="not opened"):
        consume(config, store_url=f"duckdb:///{tmp_path / 'k.duckdb'}", definitions=default_definitions(),
                dead_letter=None)  # fmt: skip
    assert [duckdb_config(u) for u in opened] == [LIVE_DUCKDB_OPTIONS]

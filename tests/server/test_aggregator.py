"""The aggregation process of `drainpipe serve`: its partials are the ones this process would compute (exit rows
kept apart), and an aggregation process killed under load is replaced without losing or doubling an event."""

from __future__ import annotations

import dataclasses
import os
import signal
import time

import pytest
from server_testlib import events, post_events, running_server, stored_event_count

from drainpipe.inputs import EventBatch, validate_records
from drainpipe.pipeline.aggregate import aggregate_batch
from drainpipe.pipeline.definitions import Definitions, default_definitions
from drainpipe.server.aggregator import Aggregator
from testlib import wait_until


def _statements(n: int) -> list[dict]:
    # exit rows as the OTLP mapping makes them: a CLIENT span's statement under the calling service
    return [{**e, "db_statement": f"SELECT {i % 7} FROM t"} for i, e in enumerate(events(n, seed=9))]


def test_the_process_aggregates_like_this_one() -> None:
    definitions = default_definitions()
    plain, _ = validate_records(events(3000, seed=3))
    exits, _ = validate_records(_statements(800))
    requests, marked = EventBatch.of(plain), EventBatch.with_exits(plain, exits)
    subset = definitions.select([definitions.names[0], "top_slow_statements"])
    aggregator = Aggregator()
    try:
        for batch, defs in ((requests, definitions), (marked, definitions), (marked, subset)):
            here = aggregate_batch(batch, defs)
            there = aggregator.aggregate(batch, defs)
            assert [type(p) for p in there] == [type(p) for p in here]
            assert all(a.table.equals(b.table) for a, b in zip(there, here))
        # the exit rows crossed as exit rows: they feed the statement top-N and no metric
        with_rows = aggregator.aggregate(marked, definitions)
        without = aggregator.aggregate(requests, definitions)
        assert with_rows[0].table.equals(without[0].table)
        assert not with_rows[-1].table.equals(without[-1].table)
        assert aggregator.restarts == 0
    finally:
        aggregator.close()


def _die() -> None:
    os._exit(9)


def _hang() -> None:
    time.sleep(3600)


class _Deadly(Definitions):
    """Real definitions here; unpickling them (in the aggregation process) kills that process mid-job."""

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return _die, ()


class _Stuck(Definitions):
    """Real definitions here; unpickling them (in the aggregation process) hangs that process."""

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return _hang, ()


@pytest.mark.parametrize("fault", [_Deadly, _Stuck], ids=["dies mid-batch", "stuck"])
def test_a_failed_aggregator_is_replaced_and_the_batch_aggregated_here(fault: type[Definitions]) -> None:
    definitions = default_definitions()
    poisoned = fault(**{f.name: getattr(definitions, f.name) for f in dataclasses.fields(definitions)})
    batch = EventBatch.of(validate_records(events(2000, seed=4))[0])
    aggregator = Aggregator(timeout_s=1.0)
    try:
        first = aggregator.pid
        t0 = time.monotonic()
        partials = aggregator.aggregate(batch, poisoned)
        # a stuck one is killed once the second is over, not asked to stop and waited for (5 s)
        assert time.monotonic() - t0 < 4
        assert all(a.table.equals(b.table) for a, b in zip(partials, aggregate_batch(batch, definitions)))
        assert aggregator.restarts == 1 and not os.path.exists(f"/proc/{first}")  # gone and reaped
        assert len(aggregator.aggregate(batch, definitions)) == len(partials)  # the new process serves
        assert aggregator.restarts == 1
    finally:
        aggregator.close()


def test_a_killed_aggregator_is_replaced_and_no_event_is_lost_or_doubled(tmp_path) -> None:
    url = f"duckdb:///{tmp_path / 'a.duckdb'}"
    aggregator = Aggregator()
    with running_server(store_url=url, aggregator=aggregator) as srv:
        total = kills = 0
        for i in range(12):
            if i in (3, 8):
                pid = aggregator.pid
                assert pid is not None
                os.kill(pid, signal.SIGKILL)
                kills += 1
            status, _, body = post_events(srv.url, events(500, seed=i), kind="ndjson")
            assert status == 200, body
            total += body["accepted"]
            # the feeder finds the process dead when it next aggregates: this request's batch
            wait_until(lambda k=kills: aggregator.restarts == k, 30, what="the aggregator's replacement", interval=0.1)
        wait_until(
            lambda: srv.service.feeder.committed >= srv.service.log.end, 30, what="the store to catch up", interval=0.1
        )
        assert aggregator.restarts == 2
    assert stored_event_count(url) == total == 12 * 500

"""BatchQueueConfig: defaults, readable frozen fields, validate() naming the bad field (docs/api.md Config)."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from drainpipe import (
    BatchQueue,
    BatchQueueConfig,
    BatchQueueManager,
    BufferStrategy,
    DrainBalancer,
    PartitionPolicy,
    PartitionSelector,
    ThreadPolicy,
)

T1 = ThreadPolicy.fixed(1)


def test_defaults_are_readable_attributes():
    cfg = BatchQueueConfig(threads=T1)
    assert cfg.threads == T1
    assert cfg.shared_scheduler is None
    assert cfg.partitions == PartitionPolicy.fixed(1)
    assert callable(cfg.partition_selector)
    assert cfg.buffer_size == 10_000
    assert cfg.strategy is BufferStrategy.BLOCKING
    assert cfg.consumer is None
    assert cfg.error_handler is None
    assert cfg.min_idle_ms == 1
    assert cfg.max_idle_ms == 50
    assert cfg.balancer is None
    assert cfg.rebalance_interval_ms == 0
    assert cfg.shutdown_timeout_ms == 500
    cfg.validate()


def test_config_is_frozen():
    cfg = BatchQueueConfig(threads=T1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.buffer_size = 5
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.threads = ThreadPolicy.fixed(2)
    assert cfg.buffer_size == 10_000


def test_valid_edge_values_pass():
    class OnlyConsume:
        def consume(self, batch):
            pass

    BatchQueueConfig(
        threads=T1, buffer_size=1, min_idle_ms=7, max_idle_ms=7, shutdown_timeout_ms=0, rebalance_interval_ms=0
    ).validate()
    BatchQueueConfig(threads=T1, consumer=OnlyConsume()).validate()
    BatchQueueConfig(threads=T1, consumer=lambda batch: None, error_handler=lambda b, e: None).validate()
    BatchQueueConfig(threads=T1, balancer=DrainBalancer.throughput_weighted(), rebalance_interval_ms=10).validate()
    BatchQueueConfig(threads=T1, partition_selector=PartitionSelector.key_hash(str)).validate()
    BatchQueueConfig(threads=T1, partition_selector=lambda item, n: 0).validate()
    BatchQueueConfig(shared_scheduler=("pool", ThreadPolicy.fixed(2))).validate()


BAD_FIELDS = [
    ("buffer_size", dict(buffer_size=0)),
    ("buffer_size", dict(buffer_size=-5)),
    ("min_idle_ms", dict(min_idle_ms=0)),
    ("min_idle_ms", dict(min_idle_ms=-1)),
    ("max_idle_ms", dict(min_idle_ms=10, max_idle_ms=5)),
    ("max_idle_ms", dict(max_idle_ms=0)),
    ("shutdown_timeout_ms", dict(shutdown_timeout_ms=-1)),
    ("rebalance_interval_ms", dict(rebalance_interval_ms=-1)),
    ("partitions", dict(partitions="fixed(2)")),
    ("partitions", dict(partitions=ThreadPolicy.fixed(2))),
    ("strategy", dict(strategy="blocking")),
    ("partition_selector", dict(partition_selector=42)),
    ("consumer", dict(consumer=42)),
    ("error_handler", dict(error_handler="nope")),
    ("balancer", dict(balancer=object())),
    ("threads", dict(threads=4)),
]


@pytest.mark.parametrize("field, kwargs", BAD_FIELDS, ids=[f"{f}-{i}" for i, (f, _) in enumerate(BAD_FIELDS)])
def test_validate_names_the_bad_field(field, kwargs):
    base = {} if "threads" in kwargs else {"threads": T1}
    cfg = BatchQueueConfig(**base, **kwargs)
    with pytest.raises(ValueError, match=field):
        cfg.validate()


@pytest.mark.parametrize(
    "shared",
    [
        ("", ThreadPolicy.fixed(1)),
        (None, ThreadPolicy.fixed(1)),
        ("pool", None),
        ("pool", 2),
        ("pool",),
        "pool",
        ("pool", ThreadPolicy.fixed(1), "extra"),
    ],
    ids=["empty-name", "no-name", "no-policy", "int-policy", "1-tuple", "str", "3-tuple"],
)
def test_shared_scheduler_needs_name_and_policy(shared):
    with pytest.raises(ValueError, match="shared_scheduler"):
        BatchQueueConfig(shared_scheduler=shared).validate()


def test_threads_and_shared_scheduler_both_or_neither():
    both = BatchQueueConfig(threads=T1, shared_scheduler=("pool", T1))
    neither = BatchQueueConfig()
    for cfg in (both, neither):
        with pytest.raises(ValueError) as info:
            cfg.validate()
        assert "threads" in str(info.value) and "shared_scheduler" in str(info.value)


def _drainpipe_threads():
    return {t for t in threading.enumerate() if t.name.startswith("drainpipe-")}


@pytest.mark.parametrize("kwargs", [dict(buffer_size=0), dict(), dict(min_idle_ms=0)])
def test_queue_and_manager_validate_and_start_nothing(qname, kwargs):
    if kwargs:
        kwargs = {"threads": T1, **kwargs}
    cfg = BatchQueueConfig(**kwargs)
    before = _drainpipe_threads()
    with pytest.raises(ValueError):
        BatchQueue(qname, cfg)
    with pytest.raises(ValueError):
        BatchQueueManager.create(qname, cfg)
    with pytest.raises(ValueError):
        BatchQueueManager.get_or_create(qname, cfg)
    assert BatchQueueManager.get(qname) is None
    assert _drainpipe_threads() <= before


def test_the_interval_alone_turns_rebalancing_on_with_the_default_balancer():
    """An interval without a balancer left rebalancing off, silently: it now rebalances with the default balancer
    (throughput-weighted). The load: two busy types on partitions of one task, which the balancer splits."""
    from queue_testlib import in_background, make_types, new_queue

    from testlib import wait_until

    q = new_queue("interval-alone", threads=ThreadPolicy.fixed(2), partitions=PartitionPolicy.fixed(4),
                  rebalance_interval_ms=20)  # fmt: skip
    try:
        assert q.rebalancing_enabled
        types = make_types(40, "IA")
        for t in types:
            q.add_handler(t, lambda batch: None)
        first = set(q.assigned_partitions[0])
        by_partition = {q.partitions_of(t)[0]: t for t in types if q.partitions_of(t)[0] in first}
        busy = list(by_partition.values())[:2]
        assert len(busy) == 2

        def produce(stop: threading.Event) -> None:
            while not stop.is_set():
                for t in busy:
                    q.produce(t(0))

        with in_background(produce):
            wait_until(lambda: q.stats().rebalances > 0, timeout=30, what="a rebalance")
        assert {q.partition_owners()[p] for p in by_partition if by_partition[p] in busy} == {0, 1}
    finally:
        q.shutdown()

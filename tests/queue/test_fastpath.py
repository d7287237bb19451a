"""drainpipe._fastpath, the C hot paths, against plain-Python models of what they must do."""

from __future__ import annotations

import gc
import sys
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drainpipe._fastpath import Buffers, Producer, group_by_type

TYPES = [type(f"F{i}", (), {"__slots__": ("n",)}) for i in range(12)]


def obj(t: int, n: int):
    x = TYPES[t]()
    x.n = n
    return x


def producer(parts: int = 4, cap: int = 100, routes: dict | None = None, slow=None, full=None, closing=None):
    closing = closing if closing is not None else [False]
    buffers = Buffers(parts, cap, closing)
    prod = Producer(buffers, {}, None, [parts], slow or (lambda item: None), full or (lambda item, p: False))
    for t, p in (routes or {}).items():
        prod.set_route(t, p)
    return buffers, prod, closing


# ------------------------------------------------------------------------------------------------------ Buffers


def test_put_respects_the_bound_and_counts_exactly():
    b = Buffers(2, 3, [False])
    assert b.put(0, [1, 2, 3, 4, 5]) == 3
    assert b.put(0, [6]) == 0
    assert b.put(1, [7, 8, 9], 1) == 2  # items[start:]
    assert b.sizes() == (3, 2) and b.produced_all() == (3, 2)
    assert b.take(0) == [1, 2, 3] and b.take(0) is None
    assert b.put(0, [10]) == 1
    assert b.produced(0) == 4 and b.size(0) == 1  # produced is monotonic, size is what is buffered


def test_take_hands_out_a_tracked_list_and_keeps_no_reference():
    b = Buffers(1, 10, [False])
    marker = object()
    b.put(0, [marker])
    before = sys.getrefcount(marker)
    taken = b.take(0)
    assert gc.is_tracked(taken)  # an ordinary list again in user hands
    assert taken == [marker]
    del taken
    assert sys.getrefcount(marker) == before - 1  # the buffer no longer holds it


def test_nothing_is_appended_once_closing():
    closing = [False]
    b, prod, _ = producer(parts=1, routes={TYPES[0]: 0}, closing=closing)
    assert prod(obj(0, 1)) is True
    closing[0] = True
    assert prod(obj(0, 2)) is False
    assert b.put(0, [obj(0, 3)]) == 0
    assert prod.many([obj(0, 4)]) == (0, None)
    assert b.sizes() == (1,) and b.produced(0) == 1


def test_grow_adds_an_empty_counted_partition():
    b = Buffers(1, 5, [False])
    assert b.grow() == 2 and len(b) == 2
    assert b.put(1, [1]) == 1 and b.produced_all() == (0, 1)
    with pytest.raises(IndexError):
        b.put(2, [1])


def test_bad_arguments_are_errors_not_crashes():
    with pytest.raises(ValueError):
        Buffers(0, 1, [False])
    with pytest.raises(TypeError):
        Buffers(1, 1, (False,))
    b = Buffers(1, 1, [False])
    with pytest.raises(TypeError):
        b.put(0, (1, 2))
    with pytest.raises(IndexError):
        b.take(-1)
    with pytest.raises(TypeError):
        Producer(b, {}, lambda item, n: 0, [1], print, print)  # routes and a selector: exactly one
    with pytest.raises(TypeError):
        group_by_type((1, 2))


# ----------------------------------------------------------------------------------------------------- Producer


def test_routes_and_route_changes_take_effect_at_once():
    seen = []
    b, prod, _ = producer(routes={TYPES[0]: 1}, slow=lambda item: seen.append(item) or 3)
    a = obj(0, 1)
    assert prod(a) is True and b.sizes() == (0, 1, 0, 0)
    prod.set_route(TYPES[0], 2)  # the cached route is forgotten
    assert prod(obj(0, 2)) is True and b.sizes() == (0, 1, 1, 0)
    assert prod.drop_route(TYPES[0]) is True and prod.drop_route(TYPES[0]) is False
    c = obj(0, 3)
    assert prod(c) is True and seen == [c] and b.sizes() == (0, 1, 1, 1)  # unrouted: asks route_slow


def test_no_handler_is_accepted_without_buffering():
    b, prod, _ = producer(slow=lambda item: None)
    assert prod(obj(5, 1)) is True
    assert prod.many([obj(5, 2), obj(5, 3)]) == (2, None)
    assert b.sizes() == (0, 0, 0, 0) and b.produced_all() == (0, 0, 0, 0)


def test_full_partition_calls_full_with_the_item_and_partition():
    calls = []
    b, prod, _ = producer(parts=2, cap=1, routes={TYPES[0]: 1}, full=lambda item, p: calls.append((item, p)) or False)
    assert prod(obj(0, 1)) is True
    x = obj(0, 2)
    assert prod(x) is False and calls == [(x, 1)]


def test_selector_routing_and_bad_selector():
    closing = [False]
    b = Buffers(3, 10, closing)
    prod = Producer(b, None, lambda item, n: item % n, [3], print, print)
    assert prod.many(list(range(7))) == (7, None)
    assert [b.take(p) for p in range(3)] == [[0, 3, 6], [1, 4], [2, 5]]
    bad = Producer(b, None, lambda item, n: n, [3], print, print)
    with pytest.raises(ValueError, match="partition selector returned 3 for 3 partitions"):
        bad(1)


def test_many_survives_a_selector_that_mutates_the_list():
    b = Buffers(2, 100, [False])
    items = list(range(10))

    def select(item, n):
        if item == 3:
            items.clear()  # a user bug: must not crash or misroute the routed item
        return item % n

    prod = Producer(b, None, select, [2], print, print)
    accepted, overflow = prod.many(items)
    assert accepted == 4 and overflow is None
    assert sorted(b.take(0) + b.take(1)) == [0, 1, 2, 3]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.integers()), max_size=60),
    st.integers(1, 8),
    st.dictionaries(st.integers(0, 5), st.integers(0, 2)),
)
def test_many_equals_produce_one_by_one(spec, cap, route_of):
    """many() = produce item by item, except that after a partition overflowed, later items of that partition go
    to overflow too (order); a partition's buffer plus its overflow keep the produced order."""
    items = [obj(t, n) for t, n in spec]
    routes = {TYPES[t]: p for t, p in route_of.items()}
    b, prod, _ = producer(parts=3, cap=cap, routes=routes)
    accepted, overflow = prod.many(items)
    overflow = overflow or {}
    expect_buf: dict[int, list] = {0: [], 1: [], 2: []}
    expect_over: dict[int, list] = {}
    dropped = 0
    for x in items:
        p = routes.get(type(x))
        if p is None:
            dropped += 1
        elif p not in expect_over and len(expect_buf[p]) < cap:
            expect_buf[p].append(x)
        else:
            expect_over.setdefault(p, []).append(x)
    assert accepted == dropped + sum(map(len, expect_buf.values()))
    assert {p: b.take(p) or [] for p in range(3)} == expect_buf
    assert overflow == expect_over
    assert b.produced_all() == tuple(len(expect_buf[p]) for p in range(3))


def test_concurrent_producers_never_overshoot_and_count_exactly():
    closing = [False]
    b, prod, _ = producer(parts=2, cap=500, routes={TYPES[0]: 0, TYPES[1]: 1}, closing=closing)
    results = []

    def work(k: int) -> None:
        ok = 0
        batch = [obj(k % 2, i) for i in range(50)]
        for i in range(40):
            ok += sum(1 for x in batch if prod(x)) if i % 2 else prod.many(batch)[0]
        results.append(ok)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert b.sizes() == (500, 500)  # full, never above the bound
    assert sum(results) == sum(b.produced_all()) == 1000


# ----------------------------------------------------------------------------------------------- group_by_type


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 11), st.integers()), max_size=80))
def test_group_by_type_equals_a_dict_of_lists(spec):
    items = [obj(t, n) for t, n in spec]
    model: dict[type, list] = {}
    for x in items:
        model.setdefault(type(x), []).append(x)
    got = group_by_type(items)
    assert [t for t, _ in got] == list(model)  # first-seen order, more than the 8 scanned types too
    assert {t: run for t, run in got} == model


def test_group_by_type_returns_a_homogeneous_batch_without_copying():
    items = [obj(0, i) for i in range(5)]
    [(t, run)] = group_by_type(items)
    assert t is TYPES[0] and run is items
    assert group_by_type([]) == []


def test_no_reference_leaks():
    items = [obj(i % 10, i) for i in range(1000)]
    b, prod, _ = producer(parts=4, cap=10_000, routes={TYPES[i]: i % 4 for i in range(10)})

    def rounds(n: int) -> None:
        for _ in range(n):
            prod.many(items)
            for x in items:
                prod(x)
            for p in range(4):
                group_by_type(b.take(p))

    rounds(3)  # warm caches and free lists
    gc.collect()
    before = [sys.getrefcount(x) for x in items[:10]]
    rounds(5)
    gc.collect()
    assert [sys.getrefcount(x) for x in items[:10]] == before

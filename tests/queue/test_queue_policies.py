"""ThreadPolicy and PartitionPolicy: resolution rules, validation, string forms, value semantics (docs/api.md Policies)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from drainpipe import PartitionPolicy, ThreadPolicy, processes

# ---------------------------------------------------------------- ThreadPolicy: resolution


@pytest.mark.parametrize("n", [1, 2, 4, 64])
def test_fixed_and_io_bound_resolve_to_n(n):
    assert ThreadPolicy.fixed(n).resolve() == n
    assert ThreadPolicy.io_bound(n).resolve() == n


@pytest.mark.parametrize(
    "policy, cores, expected",
    [
        (ThreadPolicy.cpu_cores(1.0), 8, 8),
        (ThreadPolicy.cpu_cores(0.5), 5, 3),  # 2.5 rounds half UP (banker's rounding would give 2)
        (ThreadPolicy.cpu_cores(0.5), 3, 2),  # 1.5 -> 2
        (ThreadPolicy.cpu_cores(1.5), 3, 5),  # 4.5 -> 5 (banker's: 4)
        (ThreadPolicy.cpu_cores(0.125), 4, 1),  # 0.5 -> 1
        (ThreadPolicy.cpu_cores(0.1), 4, 1),  # 0.4 -> 0 -> max(1, 0)
        (ThreadPolicy.cpu_cores(0.3), 4, 1),  # 1.2 -> 1
        (ThreadPolicy.cpu_cores(2), 4, 8),
        (ThreadPolicy.cpu_cores_with_base(2, 0.25), 10, 5),  # 2 + round_half_up(2.5)
        (ThreadPolicy.cpu_cores_with_base(0, 0.1), 4, 1),  # 0 + 0 -> max(1, 0)
        (ThreadPolicy.cpu_cores_with_base(3, 0.1), 4, 3),  # base added, 0.4 rounds down
        (ThreadPolicy.cpu_cores_with_base(1, 0.5), 1, 2),  # 1 + round_half_up(0.5)
        (ThreadPolicy.cpu_cores_with_base(4, 1.0), 6, 10),
    ],
    ids=str,
)
def test_cpu_policies_resolve_with_round_half_up_and_base(monkeypatch, policy, cores, expected):
    monkeypatch.setattr(processes, "usable_cpus", lambda: cores)
    assert policy.resolve() == expected


def test_cpu_policy_resolves_at_call_time(monkeypatch):
    policy = ThreadPolicy.cpu_cores(1.0)
    monkeypatch.setattr(processes, "usable_cpus", lambda: 3)
    assert policy.resolve() == 3
    monkeypatch.setattr(processes, "usable_cpus", lambda: 12)
    assert policy.resolve() == 12


# ---------------------------------------------------------------- ThreadPolicy: validation


@pytest.mark.parametrize("n", [0, -1, -100])
def test_fixed_and_io_bound_reject_counts_below_one(n):
    with pytest.raises(ValueError):
        ThreadPolicy.fixed(n)
    with pytest.raises(ValueError):
        ThreadPolicy.io_bound(n)


@pytest.mark.parametrize("mult", [0, 0.0, -0.5, -3, math.nan])
def test_cpu_cores_rejects_non_positive_multiplier(mult):
    with pytest.raises(ValueError):
        ThreadPolicy.cpu_cores(mult)


@pytest.mark.parametrize("base, mult", [(-1, 1.0), (-5, 0.5), (0, 0), (2, -0.25), (1, 0.0)])
def test_cpu_cores_with_base_rejects_bad_arguments(base, mult):
    with pytest.raises(ValueError):
        ThreadPolicy.cpu_cores_with_base(base, mult)


def test_cpu_cores_with_base_accepts_zero_base():
    assert ThreadPolicy.cpu_cores_with_base(0, 0.5).base == 0


# ---------------------------------------------------------------- ThreadPolicy: strings and value semantics


@pytest.mark.parametrize(
    "policy, text",
    [
        (ThreadPolicy.fixed(4), "fixed(4)"),
        (ThreadPolicy.cpu_cores(0.5), "cpu_cores(0.5)"),
        (ThreadPolicy.cpu_cores_with_base(2, 0.25), "cpu_cores_with_base(2, 0.25)"),
        (ThreadPolicy.io_bound(4), "io_bound(4)"),
    ],
)
def test_thread_policy_string_forms(policy, text):
    assert str(policy) == text


def test_thread_policy_equality_and_hash():
    assert ThreadPolicy.fixed(4) == ThreadPolicy.fixed(4)
    assert hash(ThreadPolicy.fixed(4)) == hash(ThreadPolicy.fixed(4))
    assert ThreadPolicy.fixed(4) != ThreadPolicy.fixed(5)
    assert ThreadPolicy.cpu_cores(0.5) == ThreadPolicy.cpu_cores(0.5)
    assert hash(ThreadPolicy.cpu_cores(0.5)) == hash(ThreadPolicy.cpu_cores(0.5))
    assert ThreadPolicy.cpu_cores(0.5) != ThreadPolicy.cpu_cores(0.25)
    assert ThreadPolicy.cpu_cores_with_base(2, 0.25) == ThreadPolicy.cpu_cores_with_base(2, 0.25)
    assert ThreadPolicy.cpu_cores_with_base(2, 0.25) != ThreadPolicy.cpu_cores_with_base(1, 0.25)
    # kind is part of the value
    assert ThreadPolicy.cpu_cores(0.5) != ThreadPolicy.cpu_cores_with_base(0, 0.5)
    # usable as dict keys / set members
    assert len({ThreadPolicy.fixed(2), ThreadPolicy.fixed(2), ThreadPolicy.io_bound(2)}) == 2


def test_io_bound_is_same_count_as_fixed_but_not_equal():
    io, fx = ThreadPolicy.io_bound(4), ThreadPolicy.fixed(4)
    assert io.resolve() == fx.resolve() == 4
    assert io != fx
    assert io.is_io_bound is True
    assert fx.is_io_bound is False
    assert ThreadPolicy.cpu_cores(1.0).is_io_bound is False
    assert ThreadPolicy.cpu_cores_with_base(1, 1.0).is_io_bound is False


@pytest.mark.parametrize("policy", [ThreadPolicy.fixed(2), ThreadPolicy.cpu_cores(0.5), ThreadPolicy.io_bound(3)])
def test_thread_policies_are_immutable(policy):
    field = dataclasses.fields(policy)[0].name
    with pytest.raises(AttributeError):
        setattr(policy, field, "changed")
    with pytest.raises(AttributeError):
        policy.some_new_attribute = 1


# ---------------------------------------------------------------- PartitionPolicy


@pytest.mark.parametrize(
    "threads, handlers, expected",
    [
        (8, 0, 8),  # no handlers -> max(1, threads)
        (8, 100, 100),  # below threshold 25*8 = 200 -> count
        (8, 200, 200),  # at threshold -> count
        (8, 500, 350),  # 200 + (500 - 200) // 2
        (8, 201, 200),  # 200 + 1 // 2
        (8, 202, 201),
        (0, 0, 1),  # max(1, 0)
        (1, 0, 1),
        (2, 3.2, 4),  # ceil(3.2) = 4 <= 50
        (2, 0.5, 1),  # ceil -> 1
    ],
)
def test_adaptive_default_multiplier_examples(threads, handlers, expected):
    assert PartitionPolicy.adaptive().resolve(threads, handlers) == expected


def test_adaptive_custom_multiplier_and_default_handler_count():
    p = PartitionPolicy.adaptive(multiplier=1)
    assert p.resolve(2) == 2
    assert p.resolve(2, 2) == 2
    assert p.resolve(2, 5) == 3  # threshold 2: 2 + 3 // 2
    assert p.resolve(2, 24) == 13  # 2 + 22 // 2
    assert p.resolve(0, 5) == 3  # threshold max(1, 0) = 1: 1 + 4 // 2
    assert PartitionPolicy.adaptive(4).resolve(3, 20) == 16  # threshold 12: 12 + 8 // 2


def test_fixed_and_thread_multiply_resolution():
    assert PartitionPolicy.fixed(3).resolve(8) == 3
    assert PartitionPolicy.fixed(3).resolve(8, 1000) == 3
    assert PartitionPolicy.thread_multiply(2).resolve(4) == 8
    assert PartitionPolicy.thread_multiply(1).resolve(5, 100) == 5
    assert PartitionPolicy.thread_multiply(3).resolve(0) == 1  # max(1, m * threads)


@pytest.mark.parametrize("factory", [PartitionPolicy.fixed, PartitionPolicy.thread_multiply, PartitionPolicy.adaptive])
@pytest.mark.parametrize("bad", [0, -1])
def test_partition_policies_reject_values_below_one(factory, bad):
    with pytest.raises(ValueError):
        factory(bad)


@pytest.mark.parametrize(
    "policy, text",
    [
        (PartitionPolicy.fixed(4), "fixed(4)"),
        (PartitionPolicy.thread_multiply(2), "thread_multiply(2)"),
        (PartitionPolicy.adaptive(), "adaptive(multiplier=25)"),
        (PartitionPolicy.adaptive(multiplier=3), "adaptive(multiplier=3)"),
    ],
)
def test_partition_policy_string_forms(policy, text):
    assert str(policy) == text


def test_partition_policy_equality_and_hash():
    assert PartitionPolicy.fixed(4) == PartitionPolicy.fixed(4)
    assert hash(PartitionPolicy.fixed(4)) == hash(PartitionPolicy.fixed(4))
    assert PartitionPolicy.fixed(4) != PartitionPolicy.thread_multiply(4)
    assert PartitionPolicy.thread_multiply(4) != PartitionPolicy.adaptive(4)
    assert PartitionPolicy.adaptive() == PartitionPolicy.adaptive(multiplier=25)
    assert hash(PartitionPolicy.adaptive()) == hash(PartitionPolicy.adaptive(25))
    assert PartitionPolicy.fixed(4) != ThreadPolicy.fixed(4)
    policy = PartitionPolicy.fixed(2)
    with pytest.raises(AttributeError):
        setattr(policy, dataclasses.fields(policy)[0].name, "x")

"""Thread and partition policies: callers declare intent, the queue resolves concrete counts.

Policies are immutable values (``==`` and ``hash`` by kind and parameters) with the string forms of ``docs/api.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import processes
from .errors import ConfigError


def _round_half_up(x: float) -> int:
    return math.floor(x + 0.5)


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def _check_limit(value: int | None) -> int | None:
    return None if value is None else _check_int("at_most", value, 1)


def _check_float(name: str, value: object, minimum: float, strict: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number, got {value!r}")
    if value < minimum or (strict and value == minimum):
        raise ConfigError(f"{name} must be {'>' if strict else '>='} {minimum}, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class ThreadPolicy:
    """How many drain threads a queue gets. Build with the class methods, not the constructor."""

    kind: str
    count: int = 0
    base: int = 0
    multiplier: float = 0.0
    at_most: int | None = None  # the CPU policies: never more threads than this, however many CPUs

    @classmethod
    def fixed(cls, n: int) -> ThreadPolicy:
        return cls("fixed", count=_check_int("threads", n, 1))

    @classmethod
    def io_bound(cls, n: int) -> ThreadPolicy:
        """Same count as ``fixed(n)``, but marks the threads as waiting on I/O (``is_io_bound``)."""
        return cls("io_bound", count=_check_int("threads", n, 1))

    @classmethod
    def cpu_cores(cls, multiplier: float, *, at_most: int | None = None) -> ThreadPolicy:
        """``multiplier`` threads per usable CPU (rounded half up, at least 1, at most ``at_most``)."""
        return cls("cpu_cores", multiplier=_check_float("multiplier", multiplier, 0.0, strict=True),
                   at_most=_check_limit(at_most))  # fmt: skip

    @classmethod
    def cpu_cores_with_base(cls, base: int, multiplier: float, *, at_most: int | None = None) -> ThreadPolicy:
        """``base`` plus ``multiplier`` threads per usable CPU (at least 1, at most ``at_most``)."""
        return cls(
            "cpu_cores_with_base",
            base=_check_int("base", base, 0),
            multiplier=_check_float("multiplier", multiplier, 0.0, strict=True),
            at_most=_check_limit(at_most),
        )

    @property
    def is_io_bound(self) -> bool:
        return self.kind == "io_bound"

    def resolve(self) -> int:
        """The concrete thread count here (always >= 1): the CPU policies count the CPUs this process may use
        (:func:`drainpipe.processes.usable_cpus`: its affinity and its cgroup's CPU quota), not the machine's."""
        if self.kind in ("fixed", "io_bound"):
            return self.count
        threads = max(1, self.base + _round_half_up(self.multiplier * processes.usable_cpus()))
        return threads if self.at_most is None else min(threads, self.at_most)

    def __str__(self) -> str:
        if self.kind in ("fixed", "io_bound"):
            return f"{self.kind}({self.count})"
        limit = "" if self.at_most is None else f", at_most={self.at_most}"
        if self.kind == "cpu_cores":
            return f"cpu_cores({self.multiplier}{limit})"
        return f"cpu_cores_with_base({self.base}, {self.multiplier}{limit})"


@dataclass(frozen=True)
class PartitionPolicy:
    """How many partitions a queue gets, from its thread count and (adaptive) its weighted handler count."""

    kind: str
    value: int

    @classmethod
    def fixed(cls, n: int) -> PartitionPolicy:
        return cls("fixed", _check_int("partitions", n, 1))

    @classmethod
    def thread_multiply(cls, multiplier: int) -> PartitionPolicy:
        return cls("thread_multiply", _check_int("multiplier", multiplier, 1))

    @classmethod
    def adaptive(cls, multiplier: int = 25) -> PartitionPolicy:
        return cls("adaptive", _check_int("multiplier", multiplier, 1))

    @property
    def is_adaptive(self) -> bool:
        return self.kind == "adaptive"

    def resolve(self, thread_count: int, handler_count: float = 0) -> int:
        """Partition count for ``thread_count`` threads and ``handler_count`` (weighted) handlers."""
        if self.kind == "fixed":
            return self.value
        if self.kind == "thread_multiply":
            return max(1, self.value * thread_count)
        count = math.ceil(handler_count)
        if count <= 0:
            return max(1, thread_count)
        threshold = max(1, self.value * thread_count)
        if count <= threshold:
            return count
        return threshold + (count - threshold) // 2

    def __str__(self) -> str:
        if self.kind == "adaptive":
            return f"adaptive(multiplier={self.value})"
        return f"{self.kind}({self.value})"

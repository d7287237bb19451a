"""The free space of the file systems a live process writes to (``serve``: the write-ahead log and the store file;
``consume``: the store file and the dead letter), watched so that a disk running full is seen, and answered, before
a write fails on it.

::

    DiskWatch.check() ── statvfs per volume, at most every ``every_s`` ─► DiskState (free, total, low, full)
        ├─ /metrics      drainpipe_disk_free_bytes{volume}, drainpipe_disk_total_bytes{volume},
        │                drainpipe_disk_low{volume} (1 under the warning threshold)
        ├─ /healthz      "degraded" (200) under the warning threshold, "disk full" (503) under the refusal one
        ├─ serve's admit 503 with Retry-After under the refusal threshold: refused while the log can still be written
        └─ the purger    a retention purge at once when a volume turns low (then at most once a minute while it
                         stays low), not only every --purge-every-s

Thresholds (:class:`DiskLimits`): by default a volume is *low* under min(1 GiB, 10% of it) free, and *full* under
min(256 MiB, 2% of it) free; ``--disk-warn`` and ``--disk-refuse`` set them in bytes. Volumes on one file system are
reported under each name.

Thread rule: :meth:`DiskWatch.check` from any thread (a snapshot replaced whole; two threads may both refresh it, the
cost of one more ``statvfs``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

__all__ = ["DiskLimits", "DiskState", "DiskWatch", "Volume", "store_directory"]

_GIB = 1 << 30


@dataclass(frozen=True)
class DiskLimits:
    """Free bytes under which a volume is low (warn) and full (refuse); None: the defaults (module docstring)."""

    warn_bytes: int | None = None
    refuse_bytes: int | None = None

    def warn(self, total: int) -> int:
        """Never under the refusal threshold: a volume refused on is low too (and gets the early purge)."""
        default = min(_GIB, total // 10)
        return max(self.warn_bytes if self.warn_bytes is not None else default, self.refuse(total))

    def refuse(self, total: int) -> int:
        """A default never above an explicit warning threshold (``--disk-warn 100M`` alone refuses under 100M at
        most, not under the default 256M while saying the disk is fine)."""
        if self.refuse_bytes is not None:
            return self.refuse_bytes
        default = min(256 << 20, total // 50)
        return default if self.warn_bytes is None else min(default, self.warn_bytes)


@dataclass(frozen=True)
class Volume:
    """One watched volume as last measured."""

    name: str  # "log", "store", "dead_letter"
    path: str
    free: int
    total: int
    warn: int
    refuse: int

    @property
    def low(self) -> bool:
        return self.free < self.warn

    @property
    def full(self) -> bool:
        return self.free < self.refuse

    def describe(self) -> str:
        return f"{self.free:,} bytes free on the {self.name}'s file system ({self.path})"


@dataclass(frozen=True)
class DiskState:
    at: float
    volumes: tuple[Volume, ...]

    @property
    def low(self) -> tuple[Volume, ...]:
        return tuple(v for v in self.volumes if v.low)

    @property
    def full(self) -> tuple[Volume, ...]:
        return tuple(v for v in self.volumes if v.full)


class DiskWatch:
    """Watches ``volumes`` (name -> a directory on the file system); see the module docstring."""

    def __init__(
        self,
        volumes: dict[str, str],
        limits: DiskLimits | None = None,
        *,
        every_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.paths = {name: path for name, path in volumes.items() if path}
        self.limits = limits or DiskLimits()
        self.every_s = every_s
        self._clock = clock
        self._state = DiskState(float("-inf"), ())

    def check(self) -> DiskState:
        """The volumes' free space, measured at most ``every_s`` ago. A volume that cannot be measured (removed) is
        left out."""
        state = self._state
        now = self._clock()
        if now - state.at < self.every_s:
            return state
        volumes = []
        for name, path in self.paths.items():
            try:
                st = os.statvfs(path)
            except OSError:
                continue
            total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
            volumes.append(Volume(name, path, free, total, self.limits.warn(total), self.limits.refuse(total)))
        self._state = state = DiskState(now, tuple(volumes))
        return state

    def health(self) -> tuple[str, str] | None:
        """("disk full" | "degraded", why) while a volume is under a threshold; None otherwise."""
        state = self.check()
        if state.full:
            return "disk full", "; ".join(f"{v.describe()}, refusing under {v.refuse:,}" for v in state.full)
        if state.low:
            return "degraded", "; ".join(f"{v.describe()}, warning under {v.warn:,}" for v in state.low)
        return None

    def collect(self) -> Iterator[Metric]:
        """The volumes' gauges (for a Prometheus collector)."""
        state = self.check()
        free = GaugeMetricFamily("drainpipe_disk_free_bytes", "Bytes free to this process on a volume it writes to",
                                 labels=["volume", "path"])  # fmt: skip
        total = GaugeMetricFamily("drainpipe_disk_total_bytes", "Size of a volume it writes to",
                                  labels=["volume", "path"])  # fmt: skip
        low = GaugeMetricFamily("drainpipe_disk_low", "1 while a volume has less free than the warning threshold",
                                labels=["volume", "path"])  # fmt: skip
        for v in state.volumes:
            labels = [v.name, v.path]
            free.add_metric(labels, v.free)
            total.add_metric(labels, v.total)
            low.add_metric(labels, int(v.low))
        yield from (free, total, low)

    def describe(self) -> dict[str, Any]:
        """The live view's section: each volume's free and total bytes and thresholds."""
        return {
            v.name: {"path": v.path, "free": v.free, "total": v.total, "warn": v.warn, "refuse": v.refuse}
            for v in self.check().volumes
        }


def store_directory(store_url: str) -> str | None:
    """The directory of a DuckDB store file (None for a server store or an in-memory one)."""
    if store_url.startswith("duckdb:///") and ":memory:" not in store_url:
        path = store_url[len("duckdb:///") :].partition("?")[0]
        return os.path.dirname(os.path.abspath(path)) or "."
    return None

"""Prometheus-native RED metrics of the traffic ``drainpipe serve`` ingests: rate, errors, duration per service and
endpoint, exposed on ``/metrics`` beside the runtime's own metrics.

* ``drainpipe_calls_total{service, endpoint, status}``: a counter of requests, ``status`` ``ok`` or ``error`` (a
  status series appears once it has a request);
* ``drainpipe_call_duration_seconds{service, endpoint}``: a histogram of their latency, with the buckets of
  ``[prometheus] latency_buckets_ms`` in the metrics TOML (``le`` in seconds, as Prometheus names base units).

They count what the engine aggregates of what the feeder hands it (every request event of ``/v1/events``,
``/v1/traces`` and a replay of the write-ahead log after a restart; statement rows of CLIENT spans are not requests;
a sampled span counts as its adjusted count, its ``weight``), since the process started:
``rate()`` and ``increase()`` over them agree with the stored cpm of the same minutes, ``histogram_quantile`` with
the stored percentiles to within a bucket.

Bounded like the stored metrics: at most ``max_entities`` (service, endpoint) series. Requests of any further pair are
counted under ``service="__overflow__", endpoint="__overflow__"``, in ``drainpipe_calls_overflow_total``, and logged
once. Nothing is dropped from the totals.

Exemplars: where the events carry trace ids (spans), each histogram bucket of a series keeps one, the slowest
request of that bucket in the latest batch that had one (``trace_id`` label, the latency in seconds, the event's
time). They are exposed in the OpenMetrics format only (the classic text format cannot carry them): ``/metrics``
answers in it when the scraper asks (``Accept: application/openmetrics-text``, as Prometheus does), so a latency
spike in Grafana links to traces behind it.

Thread-safe: :meth:`RedMetrics.observe` (the engine's ingest thread, reading the string columns' codes its
aggregation made) does its per-event work in numpy outside the lock and takes it once per batch to add;
:meth:`RedMetrics.collect` (a scrape) copies the arrays under it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence

import numpy as np
from prometheus_client.core import CounterMetricFamily, Exemplar, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from ..inputs import EventBatch
from ..pipeline import OVERFLOW, RequestColumns, request_columns, upper_classes

__all__ = ["RedMetrics"]

log = logging.getLogger("drainpipe.server")


class RedMetrics(Collector):
    """Calls and latency histograms per (service, endpoint); see the module docstring.

    ``buckets_ms``: the histogram's upper bounds in milliseconds, increasing (``+Inf`` is added). ``max_series``: the
    most (service, endpoint) pairs kept apart."""

    def __init__(self, buckets_ms: Sequence[float], max_series: int, prefix: str = "drainpipe") -> None:
        self.bounds_ms = np.asarray(buckets_ms, dtype=np.float64)
        if self.bounds_ms.ndim != 1 or not len(self.bounds_ms) or np.any(np.diff(self.bounds_ms) <= 0):
            raise ValueError("buckets_ms must be increasing numbers")
        self.max_series = max_series
        self.prefix = prefix
        self._lock = threading.Lock()
        self._index: dict[tuple[str, str], int] = {}
        self._keys: list[tuple[str, str]] = []
        width = len(self.bounds_ms) + 1
        self._ok = np.zeros(0, np.int64)
        self._error = np.zeros(0, np.int64)
        self._hist = np.zeros((0, width), np.int64)  # per series: requests per bucket (not cumulative), last +Inf
        self._sum_ms = np.zeros(0, np.float64)
        # per series and bucket, the latest exemplar: trace id, latency (s), time (s), whether there is one; numpy
        # arrays beside the histogram (no Python object per exemplar until a scrape asks for them)
        self._ex_id = np.zeros((0, width, 16), np.uint8)
        self._ex_value = np.zeros((0, width), np.float64)
        self._ex_ts = np.zeros((0, width), np.float64)
        self._ex_set = np.zeros((0, width), bool)
        self.overflow_calls = 0

    # ------------------------------------------------------------------ observing

    def observe(self, events: EventBatch, columns: RequestColumns | None = None) -> None:
        """Count the requests of an event batch; ``columns``: its request rows' columns as an aggregation read them
        (the engine's observer, :class:`~drainpipe.pipeline.LocalEngine`), else they are read here. Thread-safe."""
        if events.requests == 0:
            return
        if columns is None:
            columns = request_columns(events)
        services, s_values, _ = columns.encoded("service")
        endpoints, e_values, _ = columns.encoded("endpoint")
        s_names, e_names = s_values.to_pylist(), e_values.to_pylist()
        pair = services.astype(np.int64) * len(e_names) + endpoints
        pairs, first, local = distinct_codes(pair, len(s_names) * len(e_names))
        ok = columns.numpy("status")
        latency = columns.numpy("latency_ms")
        weights = events.weights()
        w = None if weights is None else weights[: events.requests].astype(np.float64)
        width = len(self.bounds_ms) + 1
        k = len(pairs)
        # per pair of this batch; le semantics: a latency equal to a bound falls in that bound's bucket
        oks = np.bincount(local, weights=ok if w is None else ok * w, minlength=k).astype(np.int64)
        calls = np.bincount(local, weights=w, minlength=k).astype(np.int64)
        bucket = upper_classes(self.bounds_ms, latency)
        hist = np.bincount(local * width + bucket, weights=w, minlength=k * width).astype(np.int64).reshape(k, width)
        sums = np.bincount(local, weights=latency if w is None else latency * w, minlength=k)
        exemplars = _slowest_traced(events, local * width + bucket, latency, k * width)
        keys = [(s_names[p // len(e_names)], e_names[p % len(e_names)]) for p in pairs.tolist()]
        with self._lock:  # new pairs are admitted in the order of their first request: first come, first kept
            rows = np.empty(k, np.int64)
            for i in np.argsort(first, kind="stable").tolist():
                rows[i] = self._row(keys[i])
            overflow = self._index.get((OVERFLOW, OVERFLOW))
            if overflow is not None:
                self.overflow_calls += int(calls[rows == overflow].sum())
            # several pairs may share the overflow row: unbuffered adds
            np.add.at(self._ok, rows, oks)
            np.add.at(self._error, rows, calls - oks)
            np.add.at(self._hist, rows, hist)
            np.add.at(self._sum_ms, rows, sums)
            if exemplars is not None:
                cells, ids, values, times = exemplars
                r, b = rows[cells // width], cells % width
                self._ex_id[r, b] = ids
                self._ex_value[r, b] = values
                self._ex_ts[r, b] = times
                self._ex_set[r, b] = True

    def _row(self, key: tuple[str, str]) -> int:
        """The series row of ``key`` (under the lock), created while there is room, else the overflow row."""
        row = self._index.get(key)
        if row is not None:
            return row
        if len(self._keys) >= self.max_series + (1 if (OVERFLOW, OVERFLOW) in self._index else 0):
            if (OVERFLOW, OVERFLOW) not in self._index:
                log.warning(
                    "RED metrics: more than %d (service, endpoint) series; further ones are counted as %s",
                    self.max_series,
                    OVERFLOW,
                )
            key = (OVERFLOW, OVERFLOW)
            row = self._index.get(key)
            if row is not None:
                return row
        row = len(self._keys)
        self._index[key] = row
        self._keys.append(key)
        if row >= len(self._ok):  # grow by doubling: appends stay amortized O(1)
            size = max(64, 2 * len(self._ok))
            self._ok = np.resize(self._ok, size)
            self._ok[row:] = 0
            self._error = np.resize(self._error, size)
            self._error[row:] = 0
            self._sum_ms = np.resize(self._sum_ms, size)
            self._sum_ms[row:] = 0
            hist = np.zeros((size, self._hist.shape[1]), np.int64)
            hist[: len(self._hist)] = self._hist
            self._hist = hist
            for name in ("_ex_id", "_ex_value", "_ex_ts", "_ex_set"):
                old = getattr(self, name)
                grown = np.zeros((size, *old.shape[1:]), old.dtype)
                grown[: len(old)] = old
                setattr(self, name, grown)
        return row

    @property
    def series(self) -> int:
        """(service, endpoint) series held, the overflow series included."""
        return len(self._keys)

    # ------------------------------------------------------------------ scraping

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            keys = list(self._keys)
            n = len(keys)
            ok, error, sum_ms = self._ok[:n].copy(), self._error[:n].copy(), self._sum_ms[:n].copy()
            cumulative = np.cumsum(self._hist[:n], axis=1)
            overflow_calls = self.overflow_calls
            ex_set, ex_id = self._ex_set[:n].copy(), self._ex_id[:n].copy()
            ex_value, ex_ts = self._ex_value[:n].copy(), self._ex_ts[:n].copy()
        calls = CounterMetricFamily(
            f"{self.prefix}_calls",
            "Requests ingested, per service, endpoint and status",
            labels=["service", "endpoint", "status"],
        )
        duration = HistogramMetricFamily(
            f"{self.prefix}_call_duration_seconds", "Latency of the requests ingested", labels=["service", "endpoint"]
        )
        les = [_le(b / 1000.0) for b in self.bounds_ms] + ["+Inf"]
        for i, (service, endpoint) in enumerate(keys):
            if ok[i]:
                calls.add_metric([service, endpoint, "ok"], int(ok[i]))
            if error[i]:
                calls.add_metric([service, endpoint, "error"], int(error[i]))
            buckets: list = []
            for b, (le, count) in enumerate(zip(les, (int(c) for c in cumulative[i]))):
                if ex_set[i, b]:
                    exemplar = Exemplar({"trace_id": ex_id[i, b].tobytes().hex()}, float(ex_value[i, b]),
                                        float(ex_ts[i, b]))  # fmt: skip
                    buckets.append([le, count, exemplar])
                else:
                    buckets.append([le, count])
            duration.add_metric([service, endpoint], buckets=buckets, sum_value=float(sum_ms[i]) / 1000.0)
        yield calls
        yield duration
        yield CounterMetricFamily(
            f"{self.prefix}_calls_overflow",
            "Requests counted under the __overflow__ series: their (service, endpoint) came after max_entities others",
            value=overflow_calls,
        )


def distinct_codes(codes: np.ndarray, space: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``np.unique(codes, return_index=True, return_inverse=True)`` for codes in ``[0, space)``: the distinct codes
    (increasing), the index of each one's first row, each row's index into them. Counted into a table of ``space``
    entries where that is small beside the rows (a pass over them, not a sort: a batch of 0.2 s of traffic is 100k+
    requests over a few hundred series), else sorted."""
    n = len(codes)
    if space > max(1 << 16, 4 * n):
        return np.unique(codes, return_index=True, return_inverse=True)
    distinct = np.flatnonzero(np.bincount(codes, minlength=space))
    slot = np.zeros(space, np.intp)
    slot[distinct] = np.arange(len(distinct))
    local = slot[codes]
    first = np.full(len(distinct), n, np.intp)
    np.minimum.at(first, local, np.arange(n))
    return distinct, first, local


def _slowest_traced(
    events: EventBatch, cell: np.ndarray, latency: np.ndarray, cells: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """Per cell (a series of this batch and a bucket; ``cells`` of them) that has requests with a trace id: the
    slowest of them, as (cells, trace ids as rows of 16 bytes, latencies in seconds, times in seconds); None when no
    request has one. O(requests), no Python object per request or cell."""
    traces = events.trace_ids()
    if traces is None:
        return None
    n = events.requests
    offsets = np.frombuffer(traces.buffers()[1], np.int32, n + 1, traces.offset * 4)
    traced = np.flatnonzero(np.diff(offsets) == 16)  # (a null or malformed id has another length)
    if not len(traced):
        return None
    slowest = np.full(cells, -1.0)
    np.maximum.at(slowest, cell[traced], latency[traced])
    winner = np.full(cells, -1, np.int64)
    hits = traced[latency[traced] == slowest[cell[traced]]]
    winner[cell[hits]] = hits  # (ties: any one of them)
    chosen = np.flatnonzero(winner >= 0)
    picked = winner[chosen]
    data = np.frombuffer(traces.buffers()[2], np.uint8)
    ids = data[offsets[picked][:, None] + np.arange(16)]
    ts = events.rows.column("ts").to_numpy()[picked]
    return chosen, ids, latency[picked] / 1000.0, ts / 1000.0


def _le(seconds: float) -> str:
    """A bucket bound as Prometheus writes it (``0.005``, ``1.0``, ``2.5``)."""
    return repr(float(seconds))

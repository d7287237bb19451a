"""``GET /v1/service``: one service over a range of buckets, read from the store, for the dashboard's drill-down view
(``/#service=NAME&range=minute|hour|day``) and anyone else.

Query parameters: ``service`` (required), ``range`` = the granularity, ``minute`` (default: the latest 60 minutes),
``hour`` (48 hours) or ``day`` (30 days); ``end`` (ISO-8601 or epoch ms) = the last bucket shown, by default the
service's latest stored one. The answer::

    {"service": "checkout", "range": "minute", "start": "...", "end": "...", "buckets": ["...", ...],
     "series": [{"metric": "service_cpm", "function": "cpm", "role": "cpm", "label": "", "format": {...},
                 "values": [12.0, null, ...]}, ...],          # one per service metric and label, per bucket
     "endpoints": [{"entity": "checkout/GET /cart", "name": "GET /cart", "calls": 5120, "avg_ms": 41.2,
                    "sla": 99.9, "max_p99_ms": 310.0, "errors": 3}, ...],   # ranked by calls in the range
     "instances": [...],
     "statements": [{"key": "SELECT ...", "latency_ms": 912.0, "time_bucket": "..."}, ...],  # the slowest
     "traces": [{"endpoint": "GET /cart", "trace_id": "4bf9...", "latency_ms": 1840.0, "time_bucket": "...",
                 "url": "https://tempo.example/trace/4bf9..." | null}, ...]}  # with exemplars: the slowest traced

Ranking columns over the range come from the stored per-bucket values: ``calls`` = sum of cpm x minutes per bucket,
``avg_ms`` and ``sla`` weighted by each bucket's calls (exact), ``max_p99_ms`` the highest bucket p99 (a
percentile of the whole range cannot be had from per-bucket percentiles, so it is named for what it is), ``errors``
from a count metric filtered on ``status`` when one is defined, else from the SLA (exact: sla = 100 x ok / calls).
A series' ``role`` is its function, or ``errors`` for that filtered count (the first metric of each role has it).
Columns whose metric is not defined are left out. ``traces`` (with ``[prometheus] exemplars = true``): the slowest
traced requests of the range's last hour, from the stored exemplars, each linked through ``[prometheus]
trace_url`` when it is set. Errors: :class:`ValueError` with a one-line message (the HTTP
layer answers 400).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ..pipeline import EXEMPLARS, GRANULARITY_MS, Definitions, MetricDef, parse_time, parse_time_ms
from .live import display_format

__all__ = ["RANGES", "service_view", "service_view_of_query"]

#: buckets shown per range
RANGES = {"minute": 60, "hour": 48, "day": 30}
RANKED = 20  # endpoints and instances listed
STATEMENTS = 10
TRACES = 10  # the slowest traced requests listed (from the stored exemplars)
TRACES_WINDOW_MS = 3_600_000  # ... of the last hour of the range


def _by_function(metrics: list[MetricDef]) -> dict[str, MetricDef]:
    """The first metric of each function (errors: a count filtered on failed requests)."""
    out: dict[str, MetricDef] = {}
    for m in metrics:
        key = "errors" if m.function == "count" and m.where and "status" in m.where else m.function
        out.setdefault(key, m)
    return out


def service_view_of_query(store: Any, definitions: Definitions, query: str) -> dict[str, Any]:
    """:func:`service_view` of a request's query string (``service=NAME&range=minute|hour|day&end=T``), as
    ``GET /v1/service`` takes it (``serve``'s and a Kafka member's); the same errors."""
    import urllib.parse

    args = urllib.parse.parse_qs(query)
    arg = lambda name, default=None: args.get(name, [default])[-1]
    return service_view(store, definitions, arg("service", ""), arg("range", "minute"), arg("end"))


def service_view(store: Any, definitions: Definitions, service: str, granularity: str = "minute",
                 end: Any = None) -> dict[str, Any]:  # fmt: skip
    """See the module docstring. Reads the store (thread-safe as the store is); blocks for its queries."""
    if not service:
        raise ValueError("service is required: /v1/service?service=NAME&range=minute")
    if granularity not in RANGES:
        raise ValueError(f"range must be minute, hour or day, not {granularity!r}")
    period = GRANULARITY_MS[granularity]
    metrics = [m for m in definitions.metrics if isinstance(m, MetricDef)]
    own = [m for m in metrics if m.scope == "service"]
    rate = next((m for m in own if m.function in ("cpm", "count") and not m.where), own[0] if own else None)
    out: dict[str, Any] = {"service": service, "range": granularity, "start": None, "end": None, "buckets": [],
                           "series": [], "endpoints": [], "instances": [], "statements": []}  # fmt: skip
    if rate is None:
        return out
    if end is None:
        rows = store.query(rate.name, entity=service, granularity=granularity)
        if not rows:
            return out
        last = parse_time_ms(rows[-1][3])
    else:
        last = parse_time_ms(end)
        last -= last % period
    first = last - (RANGES[granularity] - 1) * period
    start_iso, end_iso = parse_time(first), parse_time(last)
    buckets = [parse_time(first + i * period) for i in range(RANGES[granularity])]
    index = {b: i for i, b in enumerate(buckets)}
    out.update(start=start_iso, end=end_iso, buckets=buckets)

    roles = {id(m): role for role, m in _by_function(own).items()}
    for m in own:
        values: dict[str, list[float | None]] = {}
        for _m, _e, _g, bucket, label, value in store.query(m.name, entity=service, granularity=granularity,
                                                             start=start_iso, end=end_iso):  # fmt: skip
            values.setdefault(label, [None] * len(buckets))[index[bucket]] = value
        for label in sorted(values):
            out["series"].append({"metric": m.name, "function": m.function, "role": roles.get(id(m), ""),
                                  "label": label, "format": display_format(m), "values": values[label]})  # fmt: skip

    minutes = period // 60_000
    for scope, key in (("endpoint", "endpoints"), ("instance", "instances")):
        chosen = _by_function([m for m in metrics if m.scope == scope])
        if "cpm" not in chosen and "count" not in chosen:
            continue
        per: dict[str, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))  # entity, bucket, col
        calls_metric = chosen.get("cpm") or chosen["count"]
        columns = [(calls_metric, "calls", "")] + [
            (chosen[function], column, label)
            for function, column, label in (("avg", "avg_ms", ""), ("sla", "sla", ""), ("percentile", "p99", "p99"),
                                            ("errors", "errors", ""))
            if function in chosen
        ]  # fmt: skip
        for metric, column, label in columns:
            for _m, entity, _g, bucket, lab, value in store.query(
                metric.name, granularity=granularity, start=start_iso, end=end_iso, entity_prefix=service + "/"
            ):
                if lab == label:
                    per[entity][bucket][column] = value
        ranked = []
        for entity, by_bucket in per.items():
            row: dict[str, Any] = {"entity": entity, "name": entity[len(service) + 1 :]}
            calls = {b: v["calls"] * (minutes if calls_metric.function == "cpm" else 1)
                     for b, v in by_bucket.items() if "calls" in v}  # fmt: skip
            total = sum(calls.values())
            row["calls"] = round(total)
            for column in ("avg_ms", "sla"):
                if any(column in v for v in by_bucket.values()) and total:
                    row[column] = sum(v[column] * calls.get(b, 0) for b, v in by_bucket.items() if column in v) / total
            p99 = [v["p99"] for v in by_bucket.values() if "p99" in v]
            if p99:
                row["max_p99_ms"] = max(p99)
            if "errors" in chosen:
                row["errors"] = round(sum(v.get("errors", 0.0) for v in by_bucket.values()))
            elif "sla" in chosen:  # sla = 100 * ok / calls per bucket, so the failures are exact too
                row["errors"] = round(sum(calls.get(b, 0) * (100 - v["sla"]) / 100 for b, v in by_bucket.items()
                                          if "sla" in v))  # fmt: skip
            ranked.append(row)
        ranked.sort(key=lambda r: (-r["calls"], r["entity"]))
        out[key] = ranked[:RANKED]

    for topn in definitions.topns:
        if topn.scope != "service":
            continue
        best: dict[str, tuple[float, str]] = {}
        for _n, _e, bucket, _rank, statement, latency in store.query_topn(topn.name, entity=service,
                                                                           start=start_iso, end=end_iso):  # fmt: skip
            if statement not in best or latency > best[statement][0]:
                best[statement] = (latency, bucket)
        top = sorted(best.items(), key=lambda kv: (-kv[1][0], kv[0]))[:STATEMENTS]
        out["statements"] = [{"key": k, "latency_ms": lat, "time_bucket": b} for k, (lat, b) in top]
        break
    out["traces"] = _slowest_traces(store, definitions, service, last + period)
    return out


def _slowest_traces(store: Any, definitions: Definitions, service: str, until_ms: int) -> list[dict[str, Any]]:
    """The slowest traced requests of ``service`` in the hour before ``until_ms`` (from the stored exemplars, per
    endpoint and minute; an hour keeps the read small whatever the range), with a link where ``trace_url`` is set."""
    topn = next((t for t in definitions.topns if t.name == EXEMPLARS), None)
    if topn is None:
        return []
    rows = store.query_topn(topn.name, start=parse_time(until_ms - TRACES_WINDOW_MS),
                            end=parse_time(until_ms - 60_000), entity_prefix=service + "/")  # fmt: skip
    slowest = sorted(rows, key=lambda r: (-r[5], r[4]))[:TRACES]
    url = definitions.trace_url
    return [{"endpoint": entity[len(service) + 1 :], "trace_id": trace, "latency_ms": latency, "time_bucket": bucket,
             "url": url.replace("{trace_id}", trace) if url else None}
            for _n, entity, bucket, _rank, trace, latency in slowest]  # fmt: skip

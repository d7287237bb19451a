"""The RED metrics as a real Prometheus sees them (Debian's ``prometheus``, which ``make test`` installs): it scrapes
``drainpipe serve`` on loopback with the bearer token every second; PromQL over what it scraped must agree with the
metrics drainpipe stored for the same minute.

* the calls counter: its exact increase over the traffic (raw samples) equals the stored cpm of that minute, errors
  equal what the stored SLA implies, and ``rate()`` agrees within Prometheus' extrapolation (a window of W seconds
  sampled each second is stretched by at most about 2.2 s / (W - 2));
* ``histogram_quantile(0.99, ...)`` lands in the stored p99's bucket or the one beside it;
* without the token the scrape fails (``up == 0``).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from server_testlib import PROMETHEUS, post_events, prometheus, promql, running_server

from drainpipe.pipeline.definitions import DEFAULT_LATENCY_BUCKETS_MS
from drainpipe.pipeline.store import open_store
from testlib import wait_until

TOKEN = "scrape-secret"

pytestmark = [
    pytest.mark.skipif(
        not Path(PROMETHEUS).exists(), reason="needs Debian's prometheus package (make test installs it)"
    ),
    pytest.mark.wall_clock("a real Prometheus takes samples by its own clock"),
]


@contextmanager
def scraping(target: str, workdir: Path) -> Iterator[str]:
    """A Prometheus scraping ``target`` each second, with the token (job ``drainpipe``) and without (``no-token``)."""
    config = (
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: drainpipe\n    authorization: {{type: Bearer, credentials: {TOKEN}}}\n"
        f"    static_configs: [{{targets: ['{target}']}}]\n"
        f"  - job_name: no-token\n    static_configs: [{{targets: ['{target}']}}]\n"
    )
    with prometheus(workdir, config) as base:
        yield base


def scalar(base: str, query: str, at: float) -> float:
    result = promql(base, query, at)
    assert len(result) == 1, (query, result)
    return float(result[0]["value"][1])


def bucket_of(ms: float) -> int:
    """The index of the histogram bucket (``le`` bounds in ms) that ``ms`` falls in."""
    return next((i for i, b in enumerate(DEFAULT_LATENCY_BUCKETS_MS) if ms <= b), len(DEFAULT_LATENCY_BUCKETS_MS))


def test_promql_over_the_scraped_red_metrics_agrees_with_the_stored_minute(tmp_path) -> None:
    rng = random.Random(7)
    url = f"duckdb:///{tmp_path / 'red.duckdb'}"
    with running_server(store_url=url, token=TOKEN) as srv:
        target = srv.url.removeprefix("http://")
        with scraping(target, tmp_path) as prom:
            up = lambda job: promql(prom, f'up{{job="{job}"}}', time.time())
            wait_until(lambda: up("drainpipe") and up("no-token"), 30, what="the first scrapes", interval=0.1)
            wait_until(lambda: up("drainpipe")[0]["value"][1] == "1", 10, what="a scrape with the token", interval=0.1)
            assert up("no-token")[0]["value"][1] == "0"  # /metrics wants the token

            def traffic(n: int, ts: int) -> list[dict]:
                return [
                    {"ts": ts, "service": "shop", "endpoint": rng.choice(["/cart", "/pay"]),
                     "latency_ms": round(rng.lognormvariate(3.7, 0.9), 3), "status": rng.random() > 0.03}
                    for _ in range(n)
                ]  # fmt: skip

            # the series exist before the measured traffic: requests of an hour ago, of both statuses
            warm = traffic(40, int(time.time() * 1000) - 3_600_000)
            warm[0]["status"], warm[1]["status"] = True, False
            assert post_events(srv.url, warm, token=TOKEN)[0] == 200
            # scraped before the window below starts (it starts 2 s before the traffic)
            wait_until(lambda: promql(prom, 'drainpipe_calls_total{job="drainpipe",service="shop"}', time.time()), 15,
                     what="the warm-up's series in Prometheus", interval=0.1)  # fmt: skip
            time.sleep(2.2)
            # the traffic's events all carry one minute (the counters count calls whatever their time)
            minute = int(time.time() // 60 * 60_000)
            t0, sent, errors = time.time(), 0, 0
            while time.time() - t0 < 6:
                batch = traffic(150, minute + 30_000)
                assert post_events(srv.url, batch, token=TOKEN)[0] == 200
                sent += len(batch)
                errors += sum(not e["status"] for e in batch)
                time.sleep(0.2)
            iso = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(minute / 1000))

            def stored(metric: str) -> list[tuple]:
                with open_store(url) as store:
                    return store.query(metric, entity="shop", granularity="minute", start=iso, end=iso)

            wait_until(
                lambda: [r[5] for r in stored("service_cpm")] == [sent],
                30,
                what="the minute in the store",
                interval=0.1,
            )
            time.sleep(2)  # the last requests are scraped (every second)
            at = time.time()
            window = int(at - t0) + 2  # starts 1-2 s before the traffic, after the warm-up was scraped

            # exact: the raw samples' increase is the stored count of the minute, and its errors
            cpm = stored("service_cpm")[0][5]
            sla = stored("service_sla")[0][5]
            for status, expected in (("ok", sent - errors), ("error", errors)):
                raw = promql(
                    prom, f'sum(drainpipe_calls_total{{job="drainpipe",service="shop",status="{status}"}})', at
                )
                before = promql(
                    prom,
                    f'sum(drainpipe_calls_total{{job="drainpipe",service="shop",status="{status}"}} offset {window}s)',
                    at,
                )
                assert float(raw[0]["value"][1]) - float(before[0]["value"][1]) == expected
            assert errors == round(cpm * (1 - sla / 100))
            # the PromQL rate over the window, as a per-minute figure over the traffic, against the stored cpm
            rate = scalar(prom, f'sum(rate(drainpipe_calls_total{{job="drainpipe",service="shop"}}[{window}s]))', at)
            tolerance = 2.2 / (window - 2)
            assert abs(rate * window - cpm) <= cpm * tolerance, (rate * window, cpm, tolerance)

            # the p99 from the scraped histogram, within one bucket of the stored p99
            p99_prom = 1000 * scalar(
                prom,
                "histogram_quantile(0.99, sum by (le) (increase("
                f'drainpipe_call_duration_seconds_bucket{{job="drainpipe",service="shop"}}[{window}s])))',
                at,
            )
            p99_stored = {r[4]: r[5] for r in stored("service_percentile")}["p99"]
            assert abs(bucket_of(p99_prom) - bucket_of(p99_stored)) <= 1, (p99_prom, p99_stored)
            print(f"cpm {cpm:.0f}, rate x {window} s {rate * window:.1f} (tolerance {tolerance:.1%}); "
                  f"p99 stored {p99_stored:.0f} ms, histogram_quantile {p99_prom:.0f} ms")  # fmt: skip

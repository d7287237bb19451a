"""The dashboard end to end in headless Chromium (Debian's chromium + chromedriver), driven through the W3C
WebDriver HTTP API with urllib (no Python browser packages): load the page while events flow, check that the
figures update, keep a screenshot in docs/dashboard.png."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from server_testlib import events, free_port, post_events, running_server

from drainpipe.pipeline.alerts import AlertRule
from drainpipe.pipeline.definitions import default_definitions
from drainpipe.server.service import ServiceOptions
from testlib import wait_until

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"

pytestmark = pytest.mark.skipif(
    not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()),
    reason="needs Debian's chromium and chromium-driver (make test installs them)",
)


class WebDriver:
    """The few W3C WebDriver commands the test needs."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.session = ""

    def call(self, method: str, path: str, body: Any = None, timeout: float = 60) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.base + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.loads(r.read())["value"]
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"webdriver {method} {path}: {exc.code} {exc.read()[:500]!r}") from None

    def start(self, profile: str) -> None:
        caps = {
            "capabilities": {
                "alwaysMatch": {
                    "browserName": "chrome",
                    "goog:chromeOptions": {
                        "binary": CHROMIUM,
                        "args": [
                            "--headless",
                            "--no-sandbox",
                            "--disable-gpu",
                            "--disable-quic",
                            "--no-first-run",
                            "--disable-background-networking",
                            "--disable-component-update",
                            "--disable-sync",
                            "--disable-dev-shm-usage",
                            f"--user-data-dir={profile}",
                            "--window-size=1400,1400",
                        ],
                    },
                }
            }
        }
        self.session = self.call("POST", "/session", caps)["sessionId"]

    def s(self, method: str, path: str, body: Any = None) -> Any:
        return self.call(method, f"/session/{self.session}{path}", body)

    def text(self, element_id: str) -> str:
        return self.s(
            "POST",
            "/execute/sync",
            {"script": "return document.getElementById(arguments[0]).textContent;", "args": [element_id]},
        )

    def script(self, script: str) -> Any:
        return self.s("POST", "/execute/sync", {"script": script, "args": []})

    def quit(self) -> None:
        if self.session:
            try:
                self.call("DELETE", f"/session/{self.session}", timeout=20)
            except Exception:
                pass


def number(text: str) -> float:
    t = text.strip().replace(",", "")
    scale = 1e6 if t.endswith("M") else 1e3 if t.endswith("k") else 1
    return float(t.rstrip("Mk")) * scale if t not in ("", "–") else -1


@contextmanager
def browser() -> Iterator[WebDriver]:
    """chromedriver and a headless Chromium session, ended and cleaned up after."""
    port = free_port()
    driver_proc = subprocess.Popen(
        [CHROMEDRIVER, f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    profile = tempfile.mkdtemp(prefix="drainpipe-chromium-")
    driver = WebDriver(f"http://127.0.0.1:{port}")
    try:
        wait_until(lambda: _ready(driver), timeout=20)
        driver.start(profile)
        yield driver
    finally:
        driver.quit()
        driver_proc.terminate()
        try:
            driver_proc.wait(10)
        except subprocess.TimeoutExpired:
            driver_proc.kill()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def driver() -> Iterator[WebDriver]:
    """One browser session for the module's tests (each opens its own server's page, a new origin): starting
    chromedriver and Chromium cost each test about a second."""
    with browser() as session:
        yield session


def test_dashboard_updates_while_events_flow(driver: WebDriver) -> None:
    stop = threading.Event()
    with running_server(rebalance_interval_ms=300) as srv:

        def feed() -> None:
            seed = 0
            while not stop.is_set():
                post_events(srv.url, events(1500, services=10, seed=seed))
                seed += 1
                time.sleep(0.05)

        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        driver.s("POST", "/url", {"url": srv.url + "/"})
        wait_until(lambda: number(driver.text("accepted-total")) > 0, timeout=20)
        first = number(driver.text("accepted-total"))
        polls = int(driver.text("polls"))
        # the page keeps polling, and what it shows keeps moving (the feeder posts on)
        wait_until(lambda: int(driver.text("polls")) >= polls + 2, timeout=20)
        wait_until(lambda: number(driver.text("accepted-total")) > first, timeout=20)
        assert number(wait_until(lambda: (t := driver.text("events-rate")) and number(t) > 0 and t, timeout=20)) > 0
        assert driver.text("status") == "live"
        # heat strips: one row per queue, one cell per partition
        rows = driver.script(
            "return Array.from(document.querySelectorAll('#heat .heatrow')).map("
            "r => [r.id, r.querySelectorAll('.cell').length])"
        )
        assert {r[0] for r in rows} == {"heat-ingest", "heat-L1", "heat-L2", "heat-topn", "heat-persist"}
        assert all(r[1] >= 1 for r in rows)
        # the busiest services come from the store
        top = wait_until(
            lambda: driver.script(
                "return Array.from(document.querySelectorAll('#top-services tbody tr')).map(r => r.cells[0].textContent)"
            ),
            timeout=20,
        )
        assert top and all(s.startswith("svc-") for s in top)
        # the load charts have been drawn (some non-transparent pixels)
        assert (
            driver.script(
                "const c = document.getElementById('load-l1'); const d = c.getContext('2d')"
                ".getImageData(0, 0, c.width, c.height).data; let n = 0;"
                "for (let i = 3; i < d.length; i += 4) if (d[i]) n++; return n;"
            )
            > 100
        )
        assert driver.text("error") == ""
        png = base64.b64decode(driver.s("GET", "/screenshot"))
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        if os.environ.get("DRAINPIPE_UPDATE_SCREENSHOT"):  # refresh the docs' screenshot on request only
            time.sleep(2.5)  # a little more history for the screenshot
            (ROOT / "docs").mkdir(exist_ok=True)
            (ROOT / "docs" / "dashboard.png").write_bytes(base64.b64decode(driver.s("GET", "/screenshot")))
        stop.set()
        feeder.join(10)
        _numbers_equal_the_store(driver, srv)
    stop.set()


def test_the_dashboard_shows_firing_alerts_escaped(driver: WebDriver) -> None:
    """A rule fires on stored minutes (a fake clock puts them in the past); the page shows it, with the entity's name
    as text even when it looks like markup, and the notification as not sent (no webhook)."""
    m0 = int(time.time() // 60) * 60_000 - 10 * 60_000
    rule = AlertRule("slow", "service_resp_time", 100, entity="*", periods=2)
    definitions = dataclasses.replace(default_definitions(), alerts=(rule,))
    options = ServiceOptions(sample_interval_s=0.2, alert_every_s=0.2, alert_settle_s=0)
    evil = "<img src=x onerror=alert(1)>-svc"
    with running_server(options=options, definitions=definitions,
                                             clock=lambda: m0 + 2 * 60_000 + 30_000) as srv:  # fmt: skip
        for m in range(2):
            post_events(srv.url, [{"ts": m0 + m * 60_000 + i, "service": svc, "endpoint": "/x",
                                   "latency_ms": latency, "status": True}
                                  for i in range(10) for svc, latency in ((evil, 250.0), ("ok-svc", 5.0))])  # fmt: skip
        driver.s("POST", "/url", {"url": srv.url + "/"})
        firing = wait_until(
            lambda: driver.text("alerts-firing").startswith("FIRING") and driver.text("alerts-firing"), timeout=20
        )
        assert f"FIRING · slow · {evil} · 250" in firing and "ok-svc" not in firing
        assert "service_resp_time > 100 for 2 minute(s)" in firing
        assert driver.script("return document.querySelectorAll('#alerts img').length") == 0  # text, not markup
        assert "firing · slow" in driver.text("alerts-recent") and "not sent" in driver.text("alerts-recent")
        assert "1 rules" in driver.text("alert-summary") and "no webhook" in driver.text("alert-summary")


TABLE = """return [Array.from(document.querySelectorAll('#top-services thead th')).map(
    h => [h.textContent, h.dataset.decimals === undefined ? null : Number(h.dataset.decimals), h.dataset.unit || ""]),
    Array.from(document.querySelectorAll('#top-services tbody tr')).map(r => Array.from(r.cells).map(c => c.textContent)),
    document.getElementById('top-bucket').textContent];"""


def _numbers_equal_the_store(driver: WebDriver, srv: Any) -> None:
    """Every number of the busiest-services table equals the store's value for that service and minute, at the
    precision its column declares (apdex to 4 decimals, so 0.97 never shows as 1)."""
    service = srv.service
    store = service.store
    # traffic has stopped: wait until everything acknowledged is in the store, then for the page to show it (the
    # server refreshes its table every 0.5 s, the page polls every second)
    wait_until(lambda: service.feeder.committed >= service.log.end, timeout=30)
    polls = int(driver.text("polls"))
    wait_until(lambda: int(driver.text("polls")) >= polls + 3, timeout=30)  # past the server's refresh, and the page's
    headers, rows, _bucket = driver.script(TABLE)
    assert rows, "no busiest services shown"
    checked = 0
    apdex_seen = False
    for row in rows:
        service = row[0]
        for (name, decimals, unit), text in zip(headers[2:], row[2:]):
            metric = name.split(" ")[0]
            label = "p99" if name.endswith(" p99") else ""
            stored = [v for _m, e, _g, b, lab, v in store.query(metric=metric, granularity="minute", entity=service)
                      if b[11:16] == row[1] and lab == label]  # fmt: skip
            if text == "–":
                assert not stored, (service, name)
                continue
            assert decimals is not None and text.endswith(unit), (name, text, unit)
            shown = float(text[: len(text) - len(unit)].replace(",", ""))
            assert len(stored) == 1, (service, name, row[1], stored)
            assert abs(shown - stored[0]) <= 0.5 * 10**-decimals + 1e-9, (service, name, text, stored[0], decimals)
            if metric.endswith("_apdex"):
                apdex_seen = True
                assert decimals == 4 and "." in text
            checked += 1
    assert checked >= len(rows) * 3 and apdex_seen


def _ready(driver: WebDriver) -> bool:
    try:
        return bool(driver.call("GET", "/status", timeout=2)["ready"])
    except Exception:
        return False


def click(driver: WebDriver, css: str) -> None:
    element = driver.s("POST", "/element", {"using": "css selector", "value": css})
    driver.s("POST", f"/element/{next(iter(element.values()))}/click", {})


def test_drill_down_into_a_service_by_click_and_by_url(driver: WebDriver) -> None:
    """From the busiest-services table into one service: charts, endpoints and instances ranked, slowest statements,
    as the store has them; the range switches by link and the view opens from its URL alone."""
    m0 = int(time.time() // 60) * 60_000 - 40 * 60_000
    calls = {"/cart": 30, "/pay": 20, "/search": 10}  # per minute, for 30 minutes; latency varies by minute
    batch = [{"ts": m0 + m * 60_000 + i * 100, "service": "shop", "instance": f"shop-{i % 2}", "endpoint": e,
              "latency_ms": 10.0 + i + 3 * (m % 7), "status": i % 10 != 9,
              "db_statement": f"SELECT {i % 3}" if i % 5 == 0 else None}
             for m in range(30) for e, n in calls.items() for i in range(n)]  # fmt: skip
    batch += [{"ts": m0 + 29 * 60_000 + i * 1000, "service": "other", "endpoint": "/", "latency_ms": 1.0, "status": True}
              for i in range(5)]  # fmt: skip
    with running_server(token="t0k") as srv:
        post_events(srv.url, batch, token="t0k")
        store = srv.service.store
        wait_until(lambda: len(store.query("service_cpm", entity="shop", granularity="minute")) == 30, timeout=30)
        driver.s("POST", "/url", {"url": srv.url + "/#token=t0k"})
        wait_until(
            lambda: driver.script("return document.querySelectorAll('#top-services a.svc').length") == 2, timeout=20
        )
        click(driver, "#top-services a.svc[href*='service=shop']")
        wait_until(lambda: driver.text("drill-service") == "shop", timeout=20)
        assert driver.script("return location.hash").startswith("#service=shop&range=minute")
        shown = lambda view: driver.script(f"return document.getElementById('{view}').offsetParent !== null")
        assert not shown("live") and shown("drill")
        rows = lambda table: driver.script(
            f"return Array.from(document.querySelectorAll('#{table} tbody tr')).map(r => Array.from(r.cells).map(c => c.textContent))"
        )
        endpoints = wait_until(
            lambda: rows("drill-endpoints") if len(rows("drill-endpoints")) == 3 else None, timeout=20
        )
        assert [(r[0], r[1]) for r in endpoints] == [("/cart", "900"), ("/pay", "600"), ("/search", "300")]
        assert [r[5] for r in endpoints] == ["90", "60", "30"]  # every tenth request failed
        assert sorted(r[0] for r in rows("drill-instances")) == ["shop-0", "shop-1"]
        statements = rows("drill-statements")
        # the slowest: i = 25 (25 % 3 = 1) in a minute with m % 7 == 6, 10 + 25 + 18 ms
        assert statements[0][0] == "SELECT 1" and float(statements[0][1]) == 53.0
        assert not shown("drill-traces-panel")  # no exemplars kept: no traces panel
        stored_cpm = store.query("service_cpm", entity="shop", granularity="minute")[-1][5]
        assert driver.text("latest-cpm") == f"· latest {stored_cpm:.1f}/min"  # the unit display_format gives cpm
        assert driver.text("latest-errors") == "· latest 6"
        painted = ("const c = document.getElementById(arguments[0]); const d = c.getContext('2d')"
                   ".getImageData(0, 0, c.width, c.height).data; let n = 0; for (let i = 3; i < d.length; i += 4)"
                   " if (d[i]) n++; return n;")  # fmt: skip
        for chart in ("chart-cpm", "chart-latency", "chart-sla", "chart-apdex", "chart-errors"):
            assert driver.s("POST", "/execute/sync", {"script": painted, "args": [chart]}) > 100, chart
        if os.environ.get("DRAINPIPE_UPDATE_SCREENSHOT"):
            (ROOT / "docs" / "drilldown.png").write_bytes(base64.b64decode(driver.s("GET", "/screenshot")))
        click(driver, "#drill-range a.range[href*='range=hour']")
        wait_until(
            lambda: "hour" in driver.script("return document.querySelector('#drill-range b').textContent"), timeout=20
        )
        wait_until(lambda: [r[1] for r in rows("drill-endpoints")] == ["900", "600", "300"], timeout=20)
        # addressable: the URL alone opens the view
        driver.s("POST", "/url", {"url": srv.url + "/#service=other&range=day&token=t0k"})
        wait_until(lambda: driver.text("drill-service") == "other", timeout=20)
        wait_until(lambda: [r[:2] for r in rows("drill-endpoints")] == [["/", "5"]], timeout=20)
        assert driver.text("error") == "" and driver.text("drill-error") == ""
        click(driver, "#back")
        wait_until(lambda: shown("live") and not shown("drill"), timeout=20)


def test_the_drill_down_links_the_slowest_traced_requests_to_their_traces(driver: WebDriver) -> None:
    """With exemplars kept and ``[prometheus] trace_url`` set, the drill-down lists the service's slowest traced
    requests (the stored exemplars), slowest first, each a link to its trace; without exemplars the panel is hidden."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from drainpipe.pipeline.definitions import with_exemplars

    now_ns = time.time_ns()
    request = ExportTraceServiceRequest()
    rs = request.resource_spans.add()
    rs.resource.attributes.add(key="service.name").value.string_value = "shop"
    spans = rs.scope_spans.add().spans
    for i in range(40):  # latencies 5..395 ms over two routes: the slowest is i = 39 on /r1
        span = spans.add(trace_id=(i + 1).to_bytes(16, "big"), span_id=(i + 1).to_bytes(8, "big"), name="GET", kind=2,
                         start_time_unix_nano=now_ns - (i * 10 + 5) * 1_000_000, end_time_unix_nano=now_ns)  # fmt: skip
        span.attributes.add(key="http.route").value.string_value = f"/r{i % 2}"
    definitions = dataclasses.replace(with_exemplars(default_definitions()),
                                      trace_url="https://traces.example/trace/{trace_id}")  # fmt: skip
    with running_server(definitions=definitions) as srv:
        answer = urllib.request.urlopen(urllib.request.Request(
            srv.url + "/v1/traces", data=request.SerializeToString(), method="POST",
            headers={"Content-Type": "application/x-protobuf"}), timeout=10)  # fmt: skip
        assert answer.status == 200
        store = srv.service.store
        wait_until(lambda: store.query_topn("exemplars"), timeout=30)
        driver.s("POST", "/url", {"url": srv.url + "/#service=shop&range=minute"})
        wait_until(lambda: driver.text("drill-service") == "shop", timeout=20)
        links = "Array.from(document.querySelectorAll('#drill-traces a.trace')).map(a => [a.textContent, a.href])"
        got = wait_until(lambda: driver.script(f"return {links}") or None, timeout=20)
        cells = driver.script(
            "return Array.from(document.querySelectorAll('#drill-traces tbody tr')).map(r => r.cells[0].textContent)"
        )
        stored = sorted(((r[5], r[4]) for r in store.query_topn("exemplars")), key=lambda r: (-r[0], r[1]))
    assert len(got) == min(10, len(stored)) and cells[0] == "/r1"
    slowest = (40).to_bytes(16, "big").hex()  # i = 39, 395 ms
    assert got[0] == [slowest, f"https://traces.example/trace/{slowest}"]
    assert [g[0] for g in got] == [trace for _, trace in stored[: len(got)]]

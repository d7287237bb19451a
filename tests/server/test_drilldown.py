"""GET /v1/service: the drill-down's JSON read from the store: series per bucket, endpoints and instances ranked with
calls, calls-weighted averages and errors exact against the events sent; errors answered with one line."""

from __future__ import annotations

import json
import time

from server_testlib import post_events, request, running_server

from testlib import wait_until

MINUTE = 60_000


def test_the_service_view_equals_the_events_sent() -> None:
    m0 = int(time.time() // 3_600_000) * 3_600_000 - 2 * 3_600_000  # an hour start, two hours ago
    events = [{"ts": m0 + m * MINUTE + i, "service": "shop", "instance": "i", "endpoint": f"/e{m % 2}",
               "latency_ms": float(10 * (m + 1)), "status": i != 0, "db_statement": f"q{m}" if i == 0 else None}
              for m in range(4) for i in range(5 * (m + 1))]  # fmt: skip
    with running_server(token="k") as srv:
        auth = {"Authorization": "Bearer k"}
        post_events(srv.url, events, token="k")
        get = lambda q: request(srv.url + "/v1/service?" + q, headers=auth)
        stored = lambda: [v for s in json.loads(get("service=shop")[2])["series"][:1] for v in s["values"] if v]
        wait_until(lambda: len(stored()) >= 4, timeout=30, interval=0.2, what="the four minutes stored")
        view = json.loads(get("service=shop&range=minute")[2])
        assert view["end"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime((m0 + 3 * MINUTE) / 1000))
        assert len(view["buckets"]) == 60 and view["buckets"][-1] == view["end"]
        cpm = next(s for s in view["series"] if s["role"] == "cpm")
        assert cpm["values"][-4:] == [5.0, 10.0, 15.0, 20.0] and cpm["values"][:-4] == [None] * 56
        errors = next(s for s in view["series"] if s["role"] == "errors")
        assert errors["values"][-4:] == [1.0, 1.0, 1.0, 1.0]
        # /e0: minutes 0 and 2 (5 + 15 calls at 10 and 30 ms), /e1: minutes 1 and 3 (10 + 20 at 20 and 40 ms)
        e = {r["name"]: r for r in view["endpoints"]}
        assert [r["name"] for r in view["endpoints"]] == ["/e1", "/e0"]
        assert e["/e0"]["calls"] == 20 and e["/e0"]["avg_ms"] == (5 * 10 + 15 * 30) / 20 and e["/e0"]["errors"] == 2
        assert e["/e1"]["calls"] == 30 and e["/e1"]["avg_ms"] == (10 * 20 + 20 * 40) / 30 and e["/e1"]["errors"] == 2
        assert e["/e1"]["max_p99_ms"] == 40.0
        assert view["instances"][0]["calls"] == 50 and abs(view["instances"][0]["sla"] - 92.0) < 1e-9
        assert [s["key"] for s in view["statements"]] == ["q3", "q2", "q1", "q0"]
        hour = json.loads(get("service=shop&range=hour")[2])
        assert next(s for s in hour["series"] if s["role"] == "cpm")["values"][-1] == 50 / 60
        assert {r["name"]: r["calls"] for r in hour["endpoints"]} == {"/e0": 20, "/e1": 30}
        assert json.loads(get("service=nobody")[2])["buckets"] == []
        status, _, body = get("service=shop&range=week")
        assert status == 400 and "range must be minute, hour or day" in json.loads(body)["error"]
        assert get("range=minute")[0] == 400
        assert get("service=shop&end=yesterday")[0] == 400
        assert request(srv.url + "/v1/service?service=shop")[0] == 401

"""The stored per-minute metrics in a real Prometheus by remote-write (Debian's ``prometheus``, started with its
remote-write receiver), through a recording proxy that decodes every request it forwards.

``drainpipe serve --remote-write``: three minutes of traffic, then the receiver down (the proxy answers 503) while two
more minutes become final, then up again, then the server stopped and started again on the same store with two more
minutes. Every value in Prometheus (its raw samples, read back through the query API) equals the store's value of
that series and minute; nothing is missing; the proxy saw no sample twice (the position in the store survived the
restart, and a refused request was sent again, not skipped); the writer counted the refusals as failures, and
events of a minute already sent as late (in the store, not sent again)."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import cramjam
import pytest
from server_testlib import PROMETHEUS, post_events, prometheus, promql, running_server

from drainpipe.pipeline import RemoteWriteOptions
from drainpipe.pipeline.definitions import DEFAULT_DEFINITIONS
from drainpipe.pipeline.prompb import decode_write_request
from drainpipe.pipeline.store import open_store
from drainpipe.server.service import ServiceOptions
from testlib import wait_until

pytestmark = [
    pytest.mark.skipif(
        not Path(PROMETHEUS).exists(), reason="needs Debian's prometheus package (make test installs it)"
    ),
    pytest.mark.wall_clock("a real Prometheus takes samples by its own clock"),
]

MINUTE = 60_000
SCOPES = {m.name: m.scope for m in DEFAULT_DEFINITIONS.metrics}


class RecordingProxy:
    """An HTTP server in front of Prometheus' ``/api/v1/write``: forwards each request and records the samples of
    those Prometheus took; while ``down``, answers 503 without forwarding."""

    def __init__(self, target: str | None) -> None:
        """``target``: Prometheus' write URL (None: take every request with 204, as a receiver that keeps nothing)."""
        self.target = target
        self.down = False
        self.refused = 0
        self.samples: list[tuple[tuple[tuple[str, str], ...], int, float]] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if proxy.down:
                    proxy.refused += 1
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                status, text = 204, b""
                if proxy.target is not None:
                    request = urllib.request.Request(proxy.target, data=body, method="POST",
                                                     headers={k: v for k, v in self.headers.items()
                                                              if k.lower() not in ("host", "content-length")})  # fmt: skip
                    try:
                        with urllib.request.urlopen(request, timeout=10) as answer:
                            status, text = answer.status, answer.read()
                    except urllib.error.HTTPError as exc:
                        status, text = exc.code, exc.read()
                if status < 300:
                    decoded = decode_write_request(bytes(cramjam.snappy.decompress_raw(body)))
                    for ts in decoded.timeseries:
                        labels = tuple((label.name, label.value) for label in ts.labels)
                        proxy.samples += [(labels, s.timestamp, s.value) for s in ts.samples]
                self.send_response(status)
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                self.wfile.write(text)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api/v1/write"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def expected_series(store_url: str) -> dict[tuple[tuple[tuple[str, str], ...], int], float]:
    """The store's minute values as the series they must be in Prometheus (the docs' naming, written out here)."""
    store = open_store(store_url)
    try:
        rows = store.query(granularity="minute")
    finally:
        store.close()
    out = {}
    for metric, entity, _, bucket, label, value in rows:
        scope = SCOPES[metric]
        labels = {"__name__": f"drainpipe_{metric}"}
        if scope == "service":
            labels["service"] = entity
        else:
            labels["service"], labels[scope] = entity.split("/", 1)
        if label:
            labels["percentile"] = label
        minute = int(time.mktime(time.strptime(bucket, "%Y-%m-%dT%H:%M:%SZ")) - time.timezone) * 1000
        out[(tuple(sorted(labels.items())), minute)] = value
    return out


def in_prometheus(base: str) -> dict[tuple[tuple[tuple[str, str], ...], int], float]:
    """Every raw sample of drainpipe's series in Prometheus (a range selector returns them as stored)."""
    out = {}
    for series in promql(base, '{__name__=~"drainpipe_.+"}[5h]', time.time()):
        labels = tuple(sorted(series["metric"].items()))
        for ts, value in series["values"]:
            out[(labels, round(float(ts) * 1000))] = float(value)
    return out


def events(minute_ms: int, n: int, seed: int) -> list[dict[str, Any]]:
    return [{"ts": minute_ms + (i * 997 + seed) % MINUTE, "service": f"svc{i % 3}", "instance": f"i{i % 2}",
             "endpoint": f"/e{(i + seed) % 4}", "latency_ms": float((i * 37 + seed) % 900),
             "status": (i + seed) % 11 != 0} for i in range(n)]  # fmt: skip


def test_the_stored_minutes_reach_prometheus_once_across_an_outage_and_a_restart(tmp_path: Path) -> None:
    workdir = tmp_path / "prom"
    workdir.mkdir()
    store_url = f"duckdb:///{tmp_path / 'rw.duckdb'}"
    first = (int(time.time() * 1000) // MINUTE - 20) * MINUTE  # 20 minutes ago (Prometheus' head takes it)
    now = [first + MINUTE // 2]  # the servers' clock: minute m is final once it reads past its end (lateness 0)
    options = ServiceOptions(
        sample_interval_s=0.25,
        top_refresh_s=0.5,
        checkpoint_s=0.2,
        remote_write=None,
    )
    config = "global: {scrape_interval: 1h}\n"
    with prometheus(workdir, config, ["--web.enable-remote-write-receiver"]) as prom:
        proxy = RecordingProxy(prom + "/api/v1/write")
        rw = RemoteWriteOptions(proxy.url, lateness_s=0, interval_s=0.2)
        try:
            with running_server(store_url=store_url, options=_with(options, rw), clock=lambda: now[0]) as srv:
                writer = srv.service.remote_writer
                assert writer is not None
                for m in range(3):
                    assert post_events(srv.url, events(first + m * MINUTE, 300, m))[0] == 200
                now[0] = first + 3 * MINUTE
                wait_until(
                    lambda: writer.position >= first + 2 * MINUTE, 30, what="the first three minutes sent", interval=0.1
                )
                proxy.down = True
                for m in range(3, 5):
                    assert post_events(srv.url, events(first + m * MINUTE, 300, m))[0] == 200
                now[0] = first + 5 * MINUTE
                wait_until(lambda: writer.stats()["failures"] >= 2, 30, what="the refused requests", interval=0.1)
                assert writer.position < first + 3 * MINUTE  # nothing moves on while the receiver is down
                proxy.down = False
                wait_until(
                    lambda: writer.position >= first + 4 * MINUTE,
                    30,
                    what="the minutes sent after the outage",
                    interval=0.1,
                )
                # late: events of minute 1, sent already, are stored but not sent again
                assert post_events(srv.url, events(first + MINUTE, 50, 99))[0] == 200
                wait_until(
                    lambda: writer.stats()["late_events"] == 50, 30, what="the late events counted", interval=0.1
                )
            with running_server(store_url=store_url, options=_with(options, rw), clock=lambda: now[0]) as srv:
                writer = srv.service.remote_writer  # the same store again
                assert writer is not None and writer.position == first + 4 * MINUTE  # resumed from the store
                for m in range(5, 7):
                    assert post_events(srv.url, events(first + m * MINUTE, 300, m))[0] == 200
                now[0] = first + 7 * MINUTE
                wait_until(
                    lambda: writer.position >= first + 6 * MINUTE,
                    30,
                    what="the minutes after the restart",
                    interval=0.1,
                )
            assert proxy.refused >= 2
            sent = Counter((labels, ts) for labels, ts, _ in proxy.samples)
            assert sent and max(sent.values()) == 1, [k for k, n in sent.items() if n > 1][:5]  # none sent twice
            want = expected_series(store_url)
            late_minute = first + MINUTE
            got = wait_until(
                lambda: (g := in_prometheus(prom)) and len(g) >= len(want) and g, 30, what="the samples", interval=0.1
            )
            assert set(got) == set(want)  # every series and minute, nothing else
            for key, value in want.items():
                if key[1] != late_minute:  # minute 1 changed after it was sent (the late events): not re-sent
                    assert got[key] == pytest.approx(value, rel=1e-9), key
            stale = [k for k in want if k[1] == late_minute and got[k] != pytest.approx(want[k], rel=1e-9)]
            assert stale, "the late events changed minute 1 in the store only"
        finally:
            proxy.close()


def _with(options: ServiceOptions, rw: RemoteWriteOptions) -> ServiceOptions:
    from dataclasses import replace

    return replace(options, remote_write=rw)


def test_the_remote_write_flags_are_checked() -> None:
    from drainpipe.cli import build_parser
    from drainpipe.errors import UsageError
    from drainpipe.pipeline import remote_write_options

    parse = build_parser().parse_args
    args = parse(["serve", "--remote-write", "http://p:9090/api/v1/write", "--remote-write-header", "X-Scope: t1"])
    assert remote_write_options(args) == RemoteWriteOptions("http://p:9090/api/v1/write", (("X-Scope", "t1"),))
    for bad in (["--remote-write", "p:9090"], ["--remote-write-header", "A: b"],
                ["--remote-write", "http://p", "--remote-write-header", "no colon"]):  # fmt: skip
        with pytest.raises(UsageError):
            remote_write_options(parse(["serve", *bad]))
    assert json.dumps(remote_write_options(parse(["serve"]))) == "null"


def test_run_sends_what_it_stored_and_skips_history_unless_the_receiver_takes_it(tmp_path: Path) -> None:
    """``drainpipe run --remote-write``: minutes within ``--remote-write-max-age-s`` are sent (and equal the store);
    older ones are counted and not sent, unless a larger max age is given for a Prometheus with an out-of-order
    window, which then takes them."""
    import subprocess
    import sys

    drainpipe = str(Path(sys.executable).with_name("drainpipe"))
    now = int(time.time() * 1000) // MINUTE * MINUTE
    workdir = tmp_path / "prom"
    workdir.mkdir()
    config = "global: {scrape_interval: 1h}\nstorage: {tsdb: {out_of_order_time_window: 4h}}\n"
    with prometheus(workdir, config, ["--web.enable-remote-write-receiver"]) as prom:
        outputs = {}
        for name, extra in (("default", []), ("history", ["--remote-write-max-age-s", "14400"])):
            path = tmp_path / f"{name}.jsonl"
            old = [dict(e, service=f"{name}-{e['service']}") for e in events(now - 180 * MINUTE, 200, 1)]
            recent = [dict(e, service=f"{name}-{e['service']}") for e in events(now - 10 * MINUTE, 200, 2)]
            path.write_text("".join(json.dumps(e) + "\n" for e in old + recent))
            store = f"duckdb:///{tmp_path / name}.duckdb"
            done = subprocess.run([drainpipe, "run", "-q", "--input", str(path), "--store", store, "--remote-write",
                                   prom + "/api/v1/write", *extra], capture_output=True, text=True, timeout=120)  # fmt: skip
            assert done.returncode == 0, done.stdout + done.stderr
            outputs[name] = (done.stdout, expected_series(store))
        got = wait_until(lambda: (g := in_prometheus(prom)) and len(g) >= sum(len(w) for _, w in outputs.values()) // 2
                       and g, 30, what="the samples", interval=0.1)  # fmt: skip
    out, want = outputs["default"]
    assert "remote write to" in out and "1 minutes older than 3600 s not sent" in out, out
    recent_minute = now - 10 * MINUTE
    assert {k: v for k, v in want.items() if k[1] == recent_minute} == {
        k: got[k] for k in want if k[1] == recent_minute
    }
    assert not any(k in got for k in want if k[1] != recent_minute)  # the old minute was not sent
    out, want = outputs["history"]
    assert "older than" not in out, out
    assert {k: got.get(k) for k in want} == pytest.approx(want)  # both minutes, the old one too


@pytest.mark.kafka
def test_consume_sends_the_minutes_it_stored(servers: str, tmp_path: Path) -> None:
    """``drainpipe consume --remote-write``: a topic of three minutes of events read to its end; every stored minute
    reaches the receiver once, with the store's values (the receiver here keeps what it is sent: the proxy alone)."""
    import subprocess
    import sys

    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"rw-{time.time_ns()}"
    admin = AdminClient({"bootstrap.servers": servers})
    for future in admin.create_topics([NewTopic(topic, 2, 1)]).values():
        future.result(30)
    first = (int(time.time() * 1000) // MINUTE - 20) * MINUTE
    producer = Producer({"bootstrap.servers": servers})
    for m in range(3):
        for k in range(0, 300, 50):
            batch = events(first + m * MINUTE, 300, m)[k : k + 50]
            producer.produce(topic, "\n".join(json.dumps(e) for e in batch).encode())
    producer.flush(30)
    proxy = RecordingProxy(None)
    store = f"duckdb:///{tmp_path / 'c.duckdb'}"
    try:
        done = subprocess.run(
            [str(Path(sys.executable).with_name("drainpipe")), "consume", "--bootstrap-servers", servers, "--topic",
             topic, "--group", f"g-{topic}", "--store", store, "--exit-at-end", "--remote-write", proxy.url,
             "--remote-write-lateness-s", "0"], capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
    finally:
        proxy.close()
    sent = {(labels, ts): value for labels, ts, value in proxy.samples}
    assert len(sent) == len(proxy.samples)  # none twice
    want = expected_series(store)
    assert len(want) > 100 and sent == pytest.approx(want)

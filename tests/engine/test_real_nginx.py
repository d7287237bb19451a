"""A real nginx (Debian's package, `make nginx` installs it) under load from wrk writes an access log in a custom
format (request and upstream times, a proxied upstream, a host name); `drainpipe run --log-format` with that same
format string reads every line, and the stored counts equal what the log says, counted here independently."""

from __future__ import annotations

import collections
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from drainpipe.cli import main
from drainpipe.pipeline.store import open_store

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
WRK = shutil.which("wrk") or "/usr/bin/wrk"
LOG_FORMAT = (
    '$remote_addr [$time_local] "$request" $status $body_bytes_sent $request_time "$upstream_response_time" $hostname'
)
WRK_SCRIPT = """
counter = 0
request = function()
  counter = counter + 1
  local r = counter % 5
  local path
  if r == 0 then path = "/api/users/" .. counter
  elseif r == 1 then path = "/api/orders/" .. counter .. "/items?page=" .. counter
  elseif r == 2 then path = "/api/fail/" .. counter
  elseif r == 3 then path = "/static/" .. counter .. "/app.js"
  else path = "/health" end
  return wrk.format(counter % 7 == 0 and "POST" or "GET", path)
end
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(tmp: Path, front: int, back: int) -> str:
    temp = "".join(
        f"  {name}_temp_path {tmp}/{name};\n" for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    return f"""
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log;
events {{ worker_connections 256; }}
http {{
{temp}
  log_format timed '{LOG_FORMAT}';
  server {{
    listen 127.0.0.1:{front};
    access_log {tmp}/access.log timed;
    location = /health {{ return 200 "ok"; }}
    location /static/ {{ return 404; }}
    location /api/ {{ proxy_pass http://127.0.0.1:{back}; }}
  }}
  server {{
    listen 127.0.0.1:{back};
    access_log off;
    location /api/fail/ {{ return 503; }}
    location / {{ return 200 "fine"; }}
  }}
}}
"""


def _template(path: str) -> str:
    """The endpoint the log's path should give (an independent, simple rule for these paths)."""
    path = path.split("?", 1)[0]
    return "/".join("{id}" if part.isdigit() else part for part in path.split("/"))


def test_a_real_nginx_log_under_load_is_read_exactly(tmp_path: Path) -> None:
    front, back = _free_port(), _free_port()
    conf = tmp_path / "nginx.conf"
    conf.write_text(_config(tmp_path, front, back))
    server = subprocess.Popen([NGINX, "-c", str(conf), "-p", str(tmp_path)], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", front), timeout=0.2).close()
                break
            except OSError:
                assert server.poll() is None, server.stderr.read().decode() if server.stderr else ""
                assert time.monotonic() < deadline, "nginx did not start"
                time.sleep(0.05)
        script = tmp_path / "paths.lua"
        script.write_text(WRK_SCRIPT)
        out = subprocess.run([WRK, "-t1", "-c4", "-d1s", "-s", str(script), f"http://127.0.0.1:{front}/"],
                             capture_output=True, text=True, timeout=60, check=True).stdout  # fmt: skip
    finally:
        server.send_signal(signal.SIGQUIT)  # graceful: the log is complete once it exits
        server.wait(timeout=20)
    lines = (tmp_path / "access.log").read_text().splitlines()
    sent = int(re.search(r"(\d+) requests in", out).group(1))
    assert len(lines) >= sent > 500
    # what the log says, counted here: requests and errors per endpoint
    want: collections.Counter = collections.Counter()
    errors = 0
    upstream = 0
    for line in lines:
        method, path = line.split('"')[1].split(" ")[:2]
        status = int(line.split('"')[2].split()[0])
        want[f"{method} {_template(path)}"] += 1
        errors += status >= 500
        upstream += line.split('"')[3] != "-"
    assert errors and upstream and len(want) == 10  # 5 routes x 2 methods: the mix reached the log
    store = f"duckdb:///{tmp_path / 'nginx.duckdb'}"
    code = main(["run", "--input", str(tmp_path / "access.log"), "--service", "web", "--store", store,
                 "--log-format", LOG_FORMAT, "--quiet"])  # fmt: skip
    assert code == 0
    s = open_store(store)
    try:
        by_endpoint: collections.Counter = collections.Counter()
        for _m, entity, _g, _b, _l, value in s.query(metric="endpoint_cpm", granularity="minute"):
            by_endpoint[entity.split("/", 1)[1]] += round(value)
        stored_errors = sum(v for *_, v in s.query(metric="service_error_count", granularity="minute"))
        hosts = {e for _m, e, *_ in s.query(metric="instance_cpm", granularity="minute")}
    finally:
        s.close()
    assert by_endpoint == want
    assert stored_errors == errors
    assert hosts == {f"web/{socket.gethostname()}"}
    assert not (tmp_path / "nginx.rejected.jsonl").exists() or not (tmp_path / "nginx.rejected.jsonl").read_text()

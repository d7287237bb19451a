"""Every input format beside JSON Lines, and beside DuckDB SQL on the same file (issue 37).

The same request events (one service, endpoints with ids in their paths such as ``/users/123``, second-resolution
times, HTTP statuses, millisecond request times) are written as JSON Lines, CSV and an nginx access log (the
default "combined" format with ``$request_time``; paths carry their ids and some a query string, which drainpipe
normalizes to ``/users/{id}``; the JSON Lines and CSV events carry the normalized endpoint). Each file is run through

* ``drainpipe run --input FILE`` (``--service shop`` for the log), the command a user types, timed from start to
  exit, and
* DuckDB SQL computing the same default metric set from the same file in a Python process (the SQL of
  ``benchmarks/pipeline.py``): ``read_json`` for JSON Lines, ``read_csv`` for CSV, and for the log its lines read
  with ``read_csv`` as one column, cut by ``regexp_extract``, the time parsed by ``strptime``, the ids normalized
  by ``regexp_replace``.

Runs are interleaved (format by format, contender by contender, the order rotating each run); the table gives
medians of ``--runs`` runs, events/s and the ratios against JSON Lines (drainpipe) and against DuckDB on the same
file. Before timing, each format's drainpipe store is checked to hold the same metric values as DuckDB's on the
same file (the check that both compute the same thing).

Targets: access log and CSV >= 0.5x of JSON Lines' events/s, OTLP JSON >= 0.25x, each >= DuckDB on its file.

    .venv/bin/python benchmarks/formats.py                  # 5M events, 3 runs
    .venv/bin/python benchmarks/formats.py --events 1000000 --runs 3 --formats jsonl,log
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from drainpipe.inputs import EVENT_SCHEMA
from drainpipe.inputs.formats import format_of
from pipeline import SQL_JOB, _compare, _rows_of, byte_compile_drainpipe, sql_statements

RESULTS = Path(__file__).parent / "results"
SERVICE = "shop"
RATE = 5_000  # requests per second of log time
BASE_S = 1_790_000_000
ROUTES = (
    ("GET", "/api/users/", ""), ("GET", "/api/users/", "/orders"), ("POST", "/api/orders/", "/items"),
    ("GET", "/api/products/", ""), ("GET", "/static/app.js", None), ("GET", "/health", None),
    ("PUT", "/api/carts/", ""), ("GET", "/api/search", None),
)  # fmt: skip
STATUSES = (200, 200, 200, 200, 201, 304, 404, 500, 503)
TARGETS = {"log": 0.5, "csv": 0.5, "otlp": 0.25}
SUFFIX = {"jsonl": ".jsonl", "csv": ".csv", "log": ".log", "otlp": ".otlp.jsonl"}
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


# -------------------------------------------------------------------------------------------------- the data


def _columns(n: int, seed: int = 42) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    route = rng.integers(0, len(ROUTES), n)
    ids = rng.integers(1, 200_000, n)
    query = rng.random(n) < 0.2
    latency = np.minimum(rng.lognormal(4.0, 1.0, n).astype(np.int64) + 1, 30_000)
    status = np.array(STATUSES)[rng.integers(0, len(STATUSES), n)]
    seconds = BASE_S + np.arange(n) // RATE
    method = pa.array([r[0] for r in ROUTES]).take(route)
    has_id = np.array([r[2] is not None for r in ROUTES])[route]
    prefix = pa.array([r[1] for r in ROUTES]).take(route)
    suffix = pa.array([r[2] or "" for r in ROUTES]).take(route)
    id_text = pc.if_else(pa.array(has_id), pc.cast(pa.array(ids), pa.string()), "")
    template = pc.if_else(pa.array(has_id), "{id}", "")
    endpoint = pc.binary_join_element_wise(method, pc.binary_join_element_wise(prefix, template, suffix, ""), " ")
    raw_path = pc.binary_join_element_wise(prefix, id_text, suffix, "")
    raw_path = pc.if_else(pa.array(query), pc.binary_join_element_wise(raw_path, pa.array(["?page=2"] * n), ""),
                          raw_path)  # fmt: skip
    return {"seconds": seconds, "method": method, "endpoint": endpoint, "raw_path": raw_path, "latency": latency,
            "status": status}  # fmt: skip


def _events(cols: dict[str, Any]) -> pa.RecordBatch:
    n = len(cols["seconds"])
    return pa.RecordBatch.from_arrays(
        [
            pa.array(cols["seconds"] * 1000),
            pa.array([SERVICE], pa.string()).take(np.zeros(n, np.int32)),
            pa.array([""], pa.string()).take(np.zeros(n, np.int32)),
            cols["endpoint"],
            pa.array(cols["latency"].astype(np.float64)),
            pa.array(cols["status"] < 500),
            pa.nulls(n, pa.string()),
        ],
        schema=EVENT_SCHEMA,
    )


def _clf(seconds: np.ndarray) -> pa.Array:
    """``10/Oct/2026:13:55:36 +0000`` per second, formatted once per distinct second."""
    unique, index = np.unique(seconds, return_inverse=True)
    texts = []
    for s in unique.tolist():
        t = time.gmtime(s)
        texts.append(f"{t.tm_mday:02d}/{MONTHS[t.tm_mon - 1]}/{t.tm_year}:{t.tm_hour:02d}:{t.tm_min:02d}:"
                     f"{t.tm_sec:02d} +0000")  # fmt: skip
    return pa.array(texts).take(pa.array(index))


def _access_lines(cols: dict[str, Any]) -> pa.Array:
    n = len(cols["seconds"])

    def s(value: Any) -> pa.Array:
        return pc.cast(pa.array(value), pa.string())

    def const(text: str) -> pa.Array:
        return pa.array([text]).take(np.zeros(n, np.int32))

    latency = cols["latency"]
    rt = pc.binary_join_element_wise(s(latency // 1000), pc.utf8_lpad(s(latency % 1000), 3, "0"), ".")
    ip = pc.binary_join_element_wise(const("10.0."), s(np.arange(n) % 250), "")
    pieces = [ip, const(" - - ["), _clf(cols["seconds"]), const('] "'), cols["method"], const(" "), cols["raw_path"],
              const(' HTTP/1.1" '), s(cols["status"]), const(" "), s(np.arange(n) % 5000 + 100),
              const(' "-" "Mozilla/5.0 (X11; Linux x86_64) wrk/4.2" '), rt, const("\n")]  # fmt: skip
    return pc.binary_join_element_wise(*pieces, "")


#: spans per OTLP JSON line (an export, as the Collector's file exporter writes one batch per line)
OTLP_SPANS_PER_LINE = 1000


def _otlp_lines(cols: dict[str, Any], seed: int = 7) -> list[bytes]:
    """The events as OTLP JSON lines, as an SDK's spans reach the Collector's file exporter: one SERVER span per
    request (named by its route template, which is the endpoint: no ``http.route`` here so that the name is used,
    as the other files carry ``METHOD /template``), the raw path, method and status as attributes, status ERROR for
    a 5xx (the SDK's rule), random trace and span ids, end time = the request's second, start = end - latency."""
    n = len(cols["seconds"])
    rng = np.random.default_rng(seed)

    def s(value: Any) -> pa.Array:
        return pc.cast(pa.array(value), pa.string())

    def const(text: str) -> pa.Array:
        return pa.array([text]).take(np.zeros(n, np.int32))

    def hex_ids(width: int) -> pa.Array:
        raw = rng.integers(1, 2**63, (n, width // 8), dtype=np.int64).view(np.uint8).reshape(n, width)
        digits = np.frombuffer(b"0123456789abcdef", np.uint8)
        text = np.empty((n, 2 * width), np.uint8)
        text[:, 0::2], text[:, 1::2] = digits[raw >> 4], digits[raw & 15]
        return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(np.arange(n + 1, dtype=np.int32) * 2 * width),
                                                      pa.py_buffer(text.tobytes())])  # fmt: skip

    end = cols["seconds"].astype(np.int64) * 1_000_000_000
    start = end - cols["latency"].astype(np.int64) * 1_000_000
    failed = cols["status"] >= 500
    status = pc.if_else(pa.array(failed), const('{"code":2}'), const("{}"))
    pieces = [const('{"traceId":"'), hex_ids(16), const('","spanId":"'), hex_ids(8), const('","flags":1,"name":"'),
              cols["endpoint"], const('","kind":2,"startTimeUnixNano":"'), s(start), const('","endTimeUnixNano":"'),
              s(end), const('","attributes":[{"key":"http.request.method","value":{"stringValue":"'), cols["method"],
              const('"}},{"key":"url.path","value":{"stringValue":"'), cols["raw_path"],
              const('"}},{"key":"http.response.status_code","value":{"intValue":"'), s(cols["status"]),
              const('"}}],"status":'), status, const("}")]  # fmt: skip
    spans = pc.binary_join_element_wise(*pieces, "").to_pylist()
    head = ('{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"'
            f'{SERVICE}"}}}},{{"key":"host.name","value":{{"stringValue":"bench-host"}}}}]}},"scopeSpans":[{{"scope":'
            '{"name":"bench","version":"1.0"},"spans":[')  # fmt: skip
    return [(head + ",".join(spans[i : i + OTLP_SPANS_PER_LINE]) + "]}]}]}\n").encode()
            for i in range(0, n, OTLP_SPANS_PER_LINE)]  # fmt: skip


def write_inputs(data_dir: Path, n: int, formats: list[str]) -> dict[str, Path]:
    """The input files (written once per event count and reused)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    paths = {f: data_dir / f"events-{n}{SUFFIX[f]}" for f in formats}
    todo = [f for f in formats if not paths[f].exists()]
    if not todo:
        return paths
    cols = _columns(n)
    events = _events(cols)
    for fmt in todo:
        tmp = paths[fmt].with_name(paths[fmt].name + ".tmp")
        t0 = time.perf_counter()
        if fmt == "log":
            with open(tmp, "wb") as f:
                for start in range(0, n, 1_000_000):
                    part = {k: v[start : start + 1_000_000] for k, v in cols.items()}
                    lines = _access_lines(part)
                    offsets = np.frombuffer(lines.buffers()[1], np.int32)[lines.offset : lines.offset + len(lines) + 1]
                    f.write(memoryview(lines.buffers()[2])[offsets[0] : offsets[-1]])
        elif fmt == "otlp":
            with open(tmp, "wb") as f:
                for start in range(0, n, 1_000_000):
                    f.writelines(_otlp_lines({k: v[start : start + 1_000_000] for k, v in cols.items()}))
        else:
            writer, _ = format_of(tmp.with_name(paths[fmt].name))
            writer.write([events.slice(i, 500_000) for i in range(0, n, 500_000)], str(tmp), False)
        tmp.rename(paths[fmt])
        print(f"wrote {paths[fmt]} ({paths[fmt].stat().st_size / 1e6:.0f} MB, {time.perf_counter() - t0:.1f} s)",
              flush=True)  # fmt: skip
    return paths


# -------------------------------------------------------------------------------------------------- the SQL side

_ID = r"[0-9]+|[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}|[0-9a-fA-F]{16,}"
#: the default format, as DuckDB's regexp_extract reads it (groups: time, method, path without query, status, rt)
_LOG_RE = (
    r'^\S+ \S+ \S+ \[([^\]]+)\] "([A-Za-z]+) ([^ ?"]*)[^"]*" ([0-9]{3}) \S+ "(?:[^"\\]|\\.)*" '
    r'"(?:[^"\\]|\\.)*" ([0-9]+(?:\.[0-9]+)?)\s*$'
)


def events_sql(fmt: str, path: Path) -> str | None:
    """DuckDB's events of the file, in the event schema's columns (None: JSON Lines, pipeline.py's own)."""
    if fmt == "jsonl":
        return None
    if fmt == "csv":
        return (
            f"SELECT * FROM read_csv('{path}', header = true, auto_detect = false, columns = {{ts: 'BIGINT', "
            "service: 'VARCHAR', instance: 'VARCHAR', endpoint: 'VARCHAR', latency_ms: 'DOUBLE', status: 'BOOLEAN', "
            "db_statement: 'VARCHAR'})"
        )
    if fmt == "otlp":
        return _otlp_sql(path)
    assert fmt == "log"
    return f"""
        SELECT epoch_ms(strptime(x.time, '%d/%b/%Y:%H:%M:%S %z')) AS ts, '{SERVICE}' AS service, '' AS instance,
               x.method || ' ' || {_normalized_path_sql()} AS endpoint,
               CAST(x.rt AS DOUBLE) * 1000.0 AS latency_ms, CAST(x.status AS INTEGER) < 500 AS status,
               CAST(NULL AS VARCHAR) AS db_statement
        FROM (SELECT regexp_extract(line, '{_LOG_RE.replace("'", "''")}', ['time', 'method', 'path', 'status', 'rt'])
                     AS x
              FROM read_csv('{path}', columns = {{line: 'VARCHAR'}}, header = false, delim = '\\x01', quote = '',
                            escape = '', auto_detect = false))
        WHERE x.time <> ''"""


def _otlp_sql(path: Path) -> str:
    """The span mapping (docs/pipeline.md) in SQL over the exports, read with the fields it needs: SERVER spans;
    service and instance from the resource; endpoint = ``http.route``, else the name; an error is status ERROR, or
    status UNSET with an HTTP status >= 500."""
    value = "STRUCT(key VARCHAR, value STRUCT(stringValue VARCHAR, intValue VARCHAR))[]"
    spans = (f"STRUCT(name VARCHAR, kind INTEGER, startTimeUnixNano VARCHAR, endTimeUnixNano VARCHAR, "
             f"attributes {value}, status STRUCT(code INTEGER))[]")  # fmt: skip
    columns = f"{{resourceSpans: 'STRUCT(resource STRUCT(attributes {value}), scopeSpans STRUCT(spans {spans})[])[]'}}"

    def attr(owner: str, key: str, kind: str = "stringValue") -> str:
        return f"list_filter({owner}.attributes, lambda a: a.key = '{key}')[1].value.{kind}"

    return f"""
        WITH resources AS (
            SELECT unnest(resourceSpans) AS rs
            FROM read_json('{path}', format = 'newline_delimited', columns = {columns},
                           maximum_object_size = 1073741824)),
        spans AS (
            SELECT coalesce({attr("rs.resource", "service.name")}, 'unknown_service') AS service,
                   coalesce({attr("rs.resource", "service.instance.id")}, {attr("rs.resource", "host.name")}, '')
                       AS instance,
                   unnest(flatten(list_transform(rs.scopeSpans, lambda x: x.spans))) AS s
            FROM resources)
        SELECT (CAST(s.endTimeUnixNano AS UBIGINT) // 1000000)::BIGINT AS ts, service, instance,
               coalesce({attr("s", "http.route")}, s.name) AS endpoint,
               (CAST(s.endTimeUnixNano AS UBIGINT) - CAST(s.startTimeUnixNano AS UBIGINT)) / 1e6 AS latency_ms,
               NOT (coalesce(s.status.code, 0) = 2 OR (coalesce(s.status.code, 0) = 0
                    AND coalesce(CAST({attr("s", "http.response.status_code", "intValue")} AS BIGINT) >= 500, false)))
                   AS status,
               CAST(NULL AS VARCHAR) AS db_statement
        FROM spans
        WHERE s.kind = 2"""


def _normalized_path_sql() -> str:
    """Id segments to ``{id}``: two passes, as each match takes the ``/`` after its segment."""
    once = f"regexp_replace(x.path, '/({_ID})(/|$)', '/{{id}}\\2', 'g')"
    return f"regexp_replace({once}, '/({_ID})(/|$)', '/{{id}}\\2', 'g')"


# -------------------------------------------------------------------------------------------------- running


def command(contender: str, fmt: str, path: Path, db: Path) -> list[str]:
    if contender == "drainpipe":
        cmd = [str(Path(sys.executable).with_name("drainpipe")), "run", "--input", str(path), "--store",
               f"duckdb:///{db}", "--quiet"]  # fmt: skip
        return cmd + (["--service", SERVICE] if fmt == "log" else [])
    statements = db.with_suffix(".sql.json")
    statements.write_text(json.dumps(sql_statements(path, events_sql(fmt, path))))
    return [sys.executable, "-c", SQL_JOB, str(statements), str(db)]


def run_once(contender: str, fmt: str, path: Path, work: Path) -> dict[str, Any]:
    db = work / f"{contender}-{fmt}.duckdb"
    for stale in (db, db.with_suffix(".duckdb.wal")):
        stale.unlink(missing_ok=True)
    cmd = command(contender, fmt, path, db)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"{contender} on {fmt} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    if contender == "drainpipe":
        accepted = re.search(r"accepted ([\d,]+)", proc.stdout)
        events = int(accepted.group(1).replace(",", "")) if accepted else -1
    else:
        events = int(proc.stdout.strip().splitlines()[-1])
    return {"events": events, "wall_s": wall, "eps": events / wall, "db": str(db)}


def check_same(fmt: str, path: Path, work: Path) -> dict[str, Any]:
    """drainpipe's store and DuckDB's on the same file hold the same metric values."""
    dp = run_once("drainpipe", fmt, path, work)
    sql = run_once("sql", fmt, path, work)
    ref_values, _ = _rows_of(Path(dp["db"]))
    values, _ = _rows_of(Path(sql["db"]))
    common, problems = _compare(ref_values, values)
    print(f"check {fmt}: {dp['events']:,} events each way, {common:,} value rows compared, "
          f"{'the same' if not problems else '; '.join(problems)}", flush=True)  # fmt: skip
    return {"events": [dp["events"], sql["events"]], "rows": common, "problems": problems}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=5_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--formats", default="jsonl,csv,log,otlp")
    ap.add_argument("--data-dir", type=Path, default=Path.home() / ".cache" / "drainpipe-bench" / "formats")
    ap.add_argument("--check-events", type=int, default=200_000, help="events of the equality check's files")
    ap.add_argument("--json", type=Path, default=RESULTS / "formats.json")
    args = ap.parse_args()
    byte_compile_drainpipe()
    formats = args.formats.split(",")
    report: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                              "events": args.events, "runs": args.runs, "check": {}, "runs_by_format": {}}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="drainpipe-formats-") as tmp:
        work = Path(tmp)
        small = write_inputs(args.data_dir, args.check_events, formats)
        for fmt in formats:
            report["check"][fmt] = check_same(fmt, small[fmt], work)
        paths = write_inputs(args.data_dir, args.events, formats)
        runs: dict[str, dict[str, list[dict]]] = {f: {"drainpipe": [], "sql": []} for f in formats}
        for r in range(args.runs):
            order = formats[r % len(formats) :] + formats[: r % len(formats)]
            for fmt in order:
                for contender in ("drainpipe", "sql") if r % 2 == 0 else ("sql", "drainpipe"):
                    result = run_once(contender, fmt, paths[fmt], work)
                    runs[fmt][contender].append(result)
                    print(f"run {r + 1}: {fmt:5s} {contender:9s} {result['eps']:>11,.0f} events/s "
                          f"({result['wall_s']:.2f} s)", flush=True)  # fmt: skip
    report["runs_by_format"] = runs
    rows = {}
    jsonl_eps = statistics.median(x["eps"] for x in runs["jsonl"]["drainpipe"]) if "jsonl" in runs else None
    for fmt in formats:
        dp = statistics.median(x["eps"] for x in runs[fmt]["drainpipe"])
        sql = statistics.median(x["eps"] for x in runs[fmt]["sql"])
        rows[fmt] = {"drainpipe_eps": dp, "sql_eps": sql, "vs_sql": dp / sql,
                     "vs_jsonl": dp / jsonl_eps if jsonl_eps else None, "target_vs_jsonl": TARGETS.get(fmt)}  # fmt: skip
    report["table"] = rows
    print()
    print(f"{args.events:,} events, medians of {args.runs} runs, `drainpipe run` and DuckDB SQL from start to exit")
    print()
    print("| format | drainpipe events/s | DuckDB SQL events/s | drainpipe / DuckDB | of JSON Lines | target |")
    print("|---|---|---|---|---|---|")
    for fmt, row in rows.items():
        of_jsonl = f"{row['vs_jsonl']:.2f}x" if row["vs_jsonl"] is not None else "-"
        target = f">= {row['target_vs_jsonl']}x" if row["target_vs_jsonl"] else "-"
        print(f"| {fmt} | {row['drainpipe_eps']:,.0f} | {row['sql_eps']:,.0f} | {row['vs_sql']:.2f}x | {of_jsonl} | "
              f"{target} |")  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1))
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()

"""Access logs in columns: the C scanner, the pyarrow (RE2) path and the per-line reference give the same batches and
the same dead-letter reasons for any block; every field of nginx and Apache formats, custom formats with their
units, unusable formats refused at start; parts and growing files."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from drainpipe import native
from drainpipe.errors import InputError
from drainpipe.inputs import ReadStats, RejectList, Sink, log_format_of, parse_log_format, plan_parts, read_part
from drainpipe.inputs.endpoints import EndpointRules
from drainpipe.inputs.formats import access_format
from drainpipe.inputs.options import InputOptions
from drainpipe.inputs.parts import whole_file

HYPO = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NGINX_TIMED = (
    '$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer" '
    '"$http_user_agent" $request_time'
)
NGINX_UPSTREAM = '$remote_addr [$time_local] "$request" $status $upstream_response_time $request_time $hostname'
APACHE_D = r"%h %l %u %t \"%r\" %>s %b \"%{Referer}i\" \"%{User-agent}i\" %D"
APACHE_T = '%h %l %u %t "%r" %>s %b %T %v'


def decode(data: bytes, options: InputOptions, path: str) -> tuple[pa.RecordBatch, list]:
    """One block through the path named: "c" (the scanner, pyarrow where it declines), "arrow", "line"."""
    count = data.count(b"\n") + (not data.endswith(b"\n") and bool(data))
    with native.disabled(*{"c": (), "arrow": ("logscan",), "line": ("columnar",)}[path]):
        batch, rejects = access_format.decode_access_block(data, count, 0, options)
    return batch.rows, rejects


def same_everywhere(data: bytes, options: InputOptions) -> tuple[pa.RecordBatch, list]:
    reference = decode(data, options, "line")
    for path in ("c", "arrow"):
        got = decode(data, options, path)
        assert got[0].equals(reference[0]), (path, got[0].to_pylist()[:5], reference[0].to_pylist()[:5])
        assert got[1] == reference[1], path
    return reference


def clf(ts_ms: int) -> str:
    return time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(ts_ms // 1000))


# ------------------------------------------------------------------------------------------------ fields


def test_every_field_of_the_default_format_nginx_and_apache():
    opts = InputOptions(service="web")
    lines = (
        b'10.0.0.1 - alice [10/Oct/2026:13:55:36 -0700] "GET /users/42/orders?page=2 HTTP/1.1" 200 612 '
        b'"https://x/" "curl/8 \\"quoted\\"" 0.123\n'
        b'10.0.0.2 - - [10/Oct/2026:13:55:37 +0000] "POST /files/3f2b8c4e-1d2a-4b6c-9e8f-0a1b2c3d4e5f HTTP/2.0" '
        b'503 0 "-" "-" 1500\n'
    )
    batch, rejects = same_everywhere(lines, opts)
    assert rejects == []
    rows = batch.to_pylist()
    assert rows[0] == {"ts": 1791665736000, "service": "web", "instance": "", "endpoint": "GET /users/{id}/orders",
                       "latency_ms": 123.0, "status": True, "db_statement": None}  # fmt: skip
    assert rows[1]["endpoint"] == "POST /files/{id}" and rows[1]["latency_ms"] == 1.5  # %D: microseconds
    assert rows[1]["status"] is False and rows[1]["ts"] == 1791640537000


def test_a_request_time_too_long_for_the_scanner_is_read_as_every_path_reads_it():
    """A time of 64 digits or more: the scanner read it as absent and took the upstream time instead (200 ms, where
    pyarrow and the reference read 1e-60 s). It leaves such a line to the others now; all paths agree (each line
    alone: a block the scanner declines in part goes to pyarrow whole)."""
    opts = InputOptions(
        service="s", log_format=parse_log_format('[$time_local] "$request" $upstream_response_time $request_time')
    )
    long = b"0." + b"0" * 62 + b"1"
    head = b'[21/Nov/2026:10:00:00 +0000] "GET /" '
    for line, latency in ((head + b"0.2 " + long + b"\n", float(long) * 1000.0), (head + long + b" 0.3\n", 300.0)):
        rows, rejects = same_everywhere(line, opts)
        assert rows.column("latency_ms").to_pylist() == [latency] and rejects == []


def test_custom_formats_take_their_units_from_the_declaration():
    ts = 1_791_639_337_000
    nginx = InputOptions(service="s", log_format=parse_log_format(NGINX_UPSTREAM))
    data = (
        f'1.2.3.4 [{clf(ts)}] "GET /a HTTP/1.1" 200 0.010, 0.020 : 0.005 0.050 host-a\n'  # $request_time wins
        f'1.2.3.4 [{clf(ts)}] "GET /b HTTP/1.1" 502 0.010, 0.020 : 0.005 - host-b\n'  # upstream times add up
        f'1.2.3.4 [{clf(ts)}] "GET /c HTTP/1.1" 504 - - -\n'  # no time at all: a reject
        f'1.2.3.4 [{clf(ts)}] "GET /d HTTP/1.1" 200 - 0.004 host-a\n'
    ).encode()
    batch, rejects = same_everywhere(data, nginx)
    got = [(r["endpoint"], r["latency_ms"], r["status"], r["instance"]) for r in batch.to_pylist()]
    assert got == [("GET /a", 50.0, True, "host-a"), ("GET /b", (0.010 + 0.020 + 0.005) * 1000.0, False, "host-b"),
                   ("GET /d", 4.0, True, "host-a")]  # fmt: skip
    assert [(line, reason) for line, _, reason in rejects] == [(3, "missing field: latency_ms")]
    apache = InputOptions(service="s", log_format=parse_log_format(APACHE_T))
    data = f'1.2.3.4 - - [{clf(ts)}] "GET /x/7 HTTP/1.1" 200 5 2 vhost1\n'.encode()
    batch, _ = same_everywhere(data, apache)
    assert batch.to_pylist()[0] | {} == {"ts": ts, "service": "s", "instance": "vhost1", "endpoint": "GET /x/{id}",
                                         "latency_ms": 2000.0, "status": True, "db_statement": None}  # fmt: skip
    for fmt, text, ms in (("%{ms}T", "17", 17.0), ("%{us}T", "1700", 1.7), ("%D", "1700", 1.7), ("%T", "3", 3000.0)):
        opts = InputOptions(service="s", log_format=parse_log_format(f'%t "%r" %s {fmt}'))
        batch, rejects = same_everywhere(f'[{clf(ts)}] "GET / HTTP/1.1" 200 {text}\n'.encode(), opts)
        assert batch.column("latency_ms").to_pylist() == [ms] and rejects == [], fmt


def test_iso_and_epoch_times_and_a_method_with_a_path():
    opts = InputOptions(
        service="s", log_format=parse_log_format("$time_iso8601 $request_method $uri $status $request_time")
    )
    batch, rejects = same_everywhere(b"2026-10-10T13:55:36+02:00 GET /u/9 200 0.5\n"
                                     b"2026-10-10T13:55:36Z get? /u/9 200 0.5\n", opts)  # fmt: skip
    assert batch.to_pylist()[0]["ts"] == 1791633336000 and batch.to_pylist()[0]["endpoint"] == "GET /u/{id}"
    assert [r[2] for r in rejects] == ["bad value: request"]
    opts = InputOptions(service="s", log_format=parse_log_format('$msec "$request" $request_time'))
    batch, _ = same_everywhere(b'1791634536.123 "GET / HTTP/1.1" 0.001\n', opts)
    assert batch.column("ts").to_pylist() == [1791634536123]
    opts = InputOptions(service="s", log_format=parse_log_format('%{msec}t "%r" %D'))
    batch, _ = same_everywhere(b'1791634536123 "GET / HTTP/1.1" 1\n', opts)
    assert batch.column("ts").to_pylist() == [1791634536123]


@pytest.mark.parametrize(
    "text, message",
    [
        ("$remote_addr $status $request_time", "no time"),
        ("[$time_local] $status $request_time", "no request"),
        ('[$time_local] "$request" $status', "no request time"),
        ('[$time_local] "$request"$status $request_time', ""),  # fine: a literal separates them
        ('[$time_local] "$request" $status$request_time', "nothing separates"),
        ('%t "%r" %>s %Z', "unknown Apache directive %Z"),
        ('%{%d/%b}t "%r" %D', "not a time drainpipe reads"),
        ('%t "%r" %{ns}T', "no unit"),
        ("   ", "empty"),
    ],
)
def test_an_unusable_format_is_refused_with_one_line(text: str, message: str):
    if not message:
        parse_log_format(text)
        return
    with pytest.raises(InputError) as e:
        log_format_of(text)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_the_cli_refuses_an_unusable_format_before_reading(tmp_path: Path, capsys):
    from drainpipe.cli import main

    log = tmp_path / "a.log"
    log.write_text("x\n")
    code = main(["run", "--input", str(log), "--service", "s", "--store", f"duckdb:///{tmp_path / 'db'}",
                 "--log-format", "$remote_addr $status"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "--log-format: no time" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "db").exists()


# ------------------------------------------------------------------------------------------------ dead letter


def test_bad_lines_get_reasons():
    opts = InputOptions(service="s")
    good = '1.1.1.1 - - [10/Oct/2026:13:55:36 +0000] "GET /a HTTP/1.1" 200 1 "-" "ua" 0.1'
    cases = {
        good[:40]: "not an access log line",  # truncated
        good.replace("Oct", "Foo"): "bad timestamp: ts",
        good.replace("10/Oct", "32/Oct"): "bad timestamp: ts",
        good.replace('"GET /a HTTP/1.1"', '"-"'): "bad value: request",
        good.replace(" 200 ", " 2x0 "): "not an access log line",  # a field that does not parse
        good.replace(' "ua"', ""): "not an access log line",  # a missing field
        good.replace("0.1", "1e9"): "not an access log line",
        good.replace("[10/Oct/2026", "[10/Oct/0000"): "bad timestamp: ts",
    }
    data = "".join(line + "\n" for line in cases).encode() + b"\x00\xff\xfe binary\n" + (good + "\n").encode()
    batch, rejects = same_everywhere(data, opts)
    assert batch.num_rows == 1
    assert [reason for _, _, reason in rejects] == [*cases.values(), "not UTF-8"]
    assert [line for line, _, _ in rejects] == list(range(1, len(cases) + 2))
    assert rejects[0][1] == (good[:40] + "\n").encode()


def test_a_huge_latency_is_out_of_range_not_a_crash():
    opts = InputOptions(service="s")
    line = '1.1.1.1 - - [10/Oct/2026:13:55:36 +0000] "GET /a HTTP/1.1" 200 1 "-" "ua" 99999999999999.5\n'
    batch, rejects = same_everywhere(line.encode(), opts)
    assert batch.num_rows == 0 and rejects[0][2].startswith("out of range")


# ------------------------------------------------------------------------------------------------ fuzzing

_PARTS = {
    "ip": st.sampled_from(["10.0.0.1", "::1", "-", "a b"]),
    "user": st.sampled_from(["-", "alice", '"x y"']),
    "time": st.one_of(
        st.integers(0, 2 * 10**9).map(lambda s: clf(s * 1000)),
        st.sampled_from(
            [
                "10/oct/2026:13:55:36 +0000",
                "31/Feb/2026:23:59:60 -1259",
                "00/Jan/2026:00:00:00 +0000",
                "10/Oct/2026:24:00:00 +0000",
                "1/Oct/2026:13:55:36 +0000",
                "10/Oct/0001:00:00:00 +0100",
            ]
        ),
    ),  # fmt: skip
    "method": st.sampled_from(["GET", "post", "M-SEARCH", "", 'GET\\"', "abcdefabcdefabcdef"]),
    "path": st.one_of(
        st.lists(
            st.sampled_from(
                [
                    "users",
                    "42",
                    "",
                    "x?y",
                    "3f2b8c4e-1d2a-4b6c-9e8f-0a1b2c3d4e5f",
                    "DEADBEEFDEADBEEF",
                    "12ab",
                    "?q=1",
                    '\\"',
                    "%20",
                ]
            ),
            max_size=5,
        ).map("/".join),
        st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126, blacklist_characters='"'), max_size=12),
    ),  # fmt: skip
    "proto": st.sampled_from([" HTTP/1.1", "", " HTTP/1.1 x"]),
    "status": st.sampled_from(["200", "499", "500", "503", "20", "2000", "-"]),
    "rt": st.one_of(
        st.floats(0, 1e6, allow_nan=False).map(lambda x: f"{x:.3f}"),
        st.integers(0, 10**20).map(str),
        st.sampled_from(["-", "0.", ".5", "1.2.3", "0.010, 0.020", "1e3"]),
    ),
    "tail": st.sampled_from(["", " ", "\r", " \t", " x"]),
}


@st.composite
def log_lines(draw) -> bytes:
    lines = []
    for _ in range(draw(st.integers(1, 12))):
        p = {k: draw(v) for k, v in _PARTS.items()}
        line = (f'{p["ip"]} - {p["user"]} [{p["time"]}] "{p["method"]} {p["path"]}{p["proto"]}" {p["status"]} 12 '
                f'"-" "Mozilla \\"x\\"" {p["rt"]}{p["tail"]}')  # fmt: skip
        cut = draw(st.one_of(st.none(), st.integers(0, len(line))))
        if cut is not None:
            line = line[:cut]
        if draw(st.integers(0, 30)) == 0:
            line = line.replace("a", "\u00e9")  # not ASCII: the scanner declines, pyarrow reads it
        lines.append(line)
    data = "\n".join(lines).encode()
    if draw(st.booleans()):
        data += b"\n"
    if draw(st.integers(0, 20)) == 0:
        data += b"\xff\n"
    return data


@HYPO
@given(log_lines(), st.booleans())
def test_fuzzed_blocks_read_alike_on_every_path(data: bytes, rules: bool):
    """Lines cut anywhere, odd times, methods, paths, statuses and request times: the three paths agree on every
    row and every reason (with and without a user endpoint rule, which sends endpoints through Python)."""
    endpoints = EndpointRules((("^POST /users", "POST /people"),)) if rules else EndpointRules()
    same_everywhere(data, InputOptions(service="s", endpoints=endpoints))


FORMATS = [
    NGINX_TIMED,
    NGINX_UPSTREAM,
    APACHE_D,
    APACHE_T,
    '%t "%r" %s %{ms}T',
    '$status $request_time [$time_local] "$request"',
]


@HYPO
@given(st.sampled_from(FORMATS), st.data())
def test_fuzzed_custom_formats_read_alike_on_every_path(text: str, data):
    """Lines written by each format with random values (and cut), read by it: the paths agree."""
    fmt = parse_log_format(text)
    values = {
        "$remote_addr": "1.2.3.4", "$remote_user": "-", "$body_bytes_sent": "5", "$http_referer": "-",
        "$http_user_agent": 'a \\"b\\"', "%h": "h", "%l": "-", "%u": "u", "%b": "7", "%{Referer}i": "-",
        "%{User-agent}i": "ua", "$hostname": "host", "%v": "vh",
    }  # fmt: skip
    lines = []
    for _ in range(data.draw(st.integers(1, 8))):
        line = text.replace('\\"', '"')
        fill = {
            "$time_local": clf(data.draw(st.integers(0, 2 * 10**12))), "%t": f"[{clf(data.draw(st.integers(0, 10**12)))}]",
            "$request": data.draw(st.sampled_from(["GET /a/1 HTTP/1.1", "-", "PUT /b?x HTTP/1.0"])),
            "%r": data.draw(st.sampled_from(["GET /a/1 HTTP/1.1", "x", "POST / HTTP/2"])),
            "$status": data.draw(_PARTS["status"]), "%>s": data.draw(_PARTS["status"]), "%s": data.draw(_PARTS["status"]),
            "$request_time": data.draw(_PARTS["rt"]), "$upstream_response_time": data.draw(
                st.sampled_from(["0.010, 0.020 : 0.005", "-", "- : 0.5", "1", "0.1,0.2"])),
            "%D": data.draw(_PARTS["rt"]), "%T": data.draw(_PARTS["rt"]), "%{ms}T": data.draw(_PARTS["rt"]),
        }  # fmt: skip
        for key in sorted({**values, **fill}, key=len, reverse=True):
            line = line.replace(key, {**values, **fill}[key])
        if data.draw(st.integers(0, 5)) == 0:
            line = line[: data.draw(st.integers(0, len(line)))]
        lines.append(line)
    same_everywhere(("\n".join(lines) + "\n").encode(), InputOptions(service="s", log_format=fmt))


def test_the_scanner_runs_where_it_should_and_declines_where_it_must():
    """The paths above are really different paths: the scanner reads the default and common custom formats, and
    has no program for formats it cannot read as the expression does."""
    for text in (NGINX_TIMED, NGINX_UPSTREAM, APACHE_D, APACHE_T):
        assert parse_log_format(text).program, text
    for text in ("$time_iso8601 $request_method $uri $status $request_time", '[$time_local] $request $status $request_time',
                 '[$time_local] "$request" ${request_time}1 $status'):  # fmt: skip
        assert not parse_log_format(text).program, text
    line = b'1.1.1.1 - - [10/Oct/2026:13:55:36 +0000] "GET /a HTTP/1.1" 200 1 "-" "ua" 0.1\n'
    same_everywhere(line, InputOptions(service="s"))
    assert access_format._scanned(line, 1, InputOptions(service="s")) is not None  # the "c" path ran the scanner
    with native.disabled("logscan"):
        assert access_format._scanned(line, 1, InputOptions(service="s")) is None


def test_endpoints_normalized_in_columns_equal_the_per_value_rules():
    @settings(max_examples=300, deadline=None)
    @given(st.lists(st.sampled_from(["a", "12", "", "0", "deadbeefdeadbeef0", "DEADBEEFDEADBEEF", "abc-1",
                                     "3f2b8c4e-1d2a-4b6c-9e8f-0a1b2c3d4e5f", "1a"]), max_size=6),
           st.sampled_from(["GET ", "X ", "deadbeefdeadbeefff "]))  # fmt: skip
    def check(segments, head):
        raw = head + "/".join(segments)
        rules = EndpointRules()
        assert rules.normalize_column(pa.array([raw])).to_pylist() == [rules.normalize(raw)], raw

    check()


# ------------------------------------------------------------------------------------------------ files


def _log_lines(n: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    return [
        f'10.0.0.{i % 9} - - [{clf(1_791_000_000_000 + i * 1000)}] "GET /u/{rng.randrange(99)} HTTP/1.1" '
        f'{rng.choice([200, 503])} 1 "-" "ua" {rng.randrange(1, 999) / 1000:.3f}'
        for i in range(n)
    ]


def _read(part) -> tuple[list, list]:
    rejects = RejectList()
    batches = list(read_part(part, Sink(part.path, ReadStats(), rejects)))
    return [r for b in batches for r in b.rows.to_pylist()], rejects.rows


def test_a_log_splits_into_parts_that_read_as_the_whole(tmp_path: Path):
    path = tmp_path / "a.log"
    lines = _log_lines(5000)
    lines[1234] = "garbage"
    path.write_text("\n".join(lines) + "\n")
    opts = InputOptions(service="s")
    whole_rows, whole_rejects = _read(whole_file(str(path), 700, options=opts))
    parts = list(plan_parts(str(path), 700, workers=3, options=opts))
    assert len(parts) > 1 and all(not p.whole for p in parts)
    rows, rejects = [], []
    for part in parts:
        r, j = _read(part)
        rows += r
        rejects += j
    assert rows == whole_rows and rejects == whole_rejects and rejects[0][0] == 1235 and len(rows) == 4999


def test_a_growing_log_is_applied_exactly_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Read in parts by worker processes and whole in this one, alternately, while it grows (a last line still being
    written waits): every request is stored once."""
    from drainpipe.pipeline import default_definitions, parallel, run_local
    from drainpipe.pipeline.store import open_store

    monkeypatch.setattr(parallel, "MIN_PARALLEL_BYTES", 0)  # a small log goes to the workers too
    path = tmp_path / "grow.log"
    lines = _log_lines(3000)
    path.write_text("\n".join(lines[:1000]) + "\n" + lines[1000][:30])
    url = f"duckdb:///{tmp_path / 'db.duckdb'}"

    def run(workers: int) -> None:
        summary = run_local([str(path)], definitions=default_definitions(), store_url=url, service="s",
                            workers=workers, batch_rows=300)  # fmt: skip
        assert summary.complete

    for workers in (0, 2):
        run(workers)
    with open(path, "a") as f:
        f.write(lines[1000][30:] + "\n" + "\n".join(lines[1001:]) + "\n")
    for workers in (2, 0):
        run(workers)
    store = open_store(url)
    try:
        minutes = store.query(metric="service_cpm", granularity="minute")
    finally:
        store.close()
    assert sum(value for *_, value in minutes) == pytest.approx(3000)


def test_the_c_scanner_declines_a_block_with_a_byte_beyond_ascii_wherever_it_is():
    """The scanner reads only ASCII blocks (pyarrow checks UTF-8 and reads the others); its check takes 32 bytes at a
    time, so a high byte is put at every offset: within the 32-byte steps, and in the tail after the last one."""
    if native.logscan is None:
        pytest.skip("the access-log scanner is not built")
    scan = native.logscan.scan
    fmt = log_format_of("")
    line = b'10.0.0.1 - - [10/Oct/2026:13:55:36 +0000] "GET /users/1 HTTP/1.1" 200 5 "-" "ua" 0.012\n'
    block = line * 3
    assert scan(block, 3, fmt.program, fmt.quoted, True) is not None
    for at in range(len(block)):
        bad = bytearray(block)
        bad[at] = 0xFF
        assert scan(bytes(bad), 3, fmt.program, fmt.quoted, True) is None, at

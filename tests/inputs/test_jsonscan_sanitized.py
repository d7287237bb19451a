"""The C scanners (JSON Lines, access logs, CSV records) and the aggregation kernel fuzzed under AddressSanitizer and
UndefinedBehaviorSanitizer.

The scanner reads raw bytes with pointer arithmetic (and copies short strings as 16-byte moves), so an off-by-one
would read past a buffer without any Python-visible symptom. This builds ``_jsonscan.c`` with ``-fsanitize=address,
undefined`` and runs it in a child process (the sanitizer runtime preloaded, every Python allocation through malloc
so that ASan sees each bytes object's bounds) over every prefix of clean lines and over random mutations of clean
blocks, at every start offset; any invalid read or undefined behaviour aborts the child. Its results must also equal
the normal build's. (Removing the bound check of the 16-byte copy makes this fail: ASan reports a heap-buffer-
overflow on the first short string at the end of a buffer.) The access-log scanner (``_logscan.c``: a format's
program over cut and mutated lines, the request times' digits copied into a small buffer), the CSV record scanner
(``_csvscan.c``: 64-byte masks and a padded tail, from many start offsets, and its cell pass), the newline finder
(``_lines.c``), the OTLP JSON and protobuf scanners (``_otlpjson.c``, ``_otlpproto.c``: every prefix of their
differential tests' exports, and mutated blocks of them) and the aggregation kernel (``_groupstates.c``: random codes, times, weights and
sizes from zero, its dense and hashed groupings; its string columns, ``_strings.h``: chunks sliced, with nulls and
damaged offsets, rows out of range) and the log's CRC-32 (``_crc32.c``: every length to 300 bytes, then longer ones,
against zlib's) get the same treatment."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

SOURCES = Path(__file__).parents[2] / "src" / "drainpipe" / "native"  # every C extension but the queue core's

#: every child's start: the sanitized build, loaded as ``sanitized`` (argv: its path, this directory, its name)
PRELUDE = r"""
import importlib.util, json, random, sys
spec = importlib.util.spec_from_file_location(sys.argv[3], sys.argv[1])
sanitized = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sanitized)
# the span mapping's roles, as the OTLP scanners' events take them (inputs/span_events.py)
SPAN_ROLES = [(b"http.route", 0, 0), (b"db.statement", 1, 0), (b"db.query.text", 1, 1),
              (b"http.response.status_code", 2, 0), (b"http.status_code", 2, 1)]
RESOURCE_ROLES = [(b"service.name", 0, 0), (b"service.instance.id", 1, 0), (b"host.name", 1, 1)]
"""

JSON_CHILD = r"""
from drainpipe.native._jsonscan import scan as normal

rng = random.Random(5)
def record():
    r = {"ts": rng.randrange(-10**15, 10**15), "service": rng.choice(["s", "svc-03", "", "caf\u00e9", "x" * 40]),
         "latency_ms": rng.choice([1.5, 0, -0.0, 1e-7, 123456.789, 10**20, 2.5e300]),
         "status": rng.choice([True, False, None])}
    for k in ("instance", "endpoint", "db_statement"):
        if rng.random() < 0.6:
            r[k] = rng.choice([None, "", "i", "/api/e02", "SELECT * FROM t WHERE id = 1"])
    keys = list(r)
    rng.shuffle(keys)
    return json.dumps({k: r[k] for k in keys}, ensure_ascii=rng.random() < 0.5,
                      separators=rng.choice([(",", ":"), (", ", ": ")])).encode()

def check(data, lines, start=0):
    got = sanitized.scan(data, lines, start)
    assert got == normal(data, lines, start), (data, lines, start)

count = 0
for _ in range(300):  # every prefix of a line, alone and after a clean line
    line = record()
    for cut in range(len(line) + 1):
        check(bytes(line[:cut]), 1)
        check(bytes(line + b"\n" + line[:cut]), 2)
        count += 2
for _ in range(3000):  # mutated blocks, every start offset of the first line
    block = bytearray(b"\n".join(record() for _ in range(rng.randrange(1, 5))))
    for _ in range(rng.randrange(1, 4)):
        i = rng.randrange(len(block))
        block[i] = rng.choice(b'{}[]",:\\ \t\r\n0123456789-+.eEtrufalsn\x00\x80\xff')
    data = bytes(block)
    for start in range(0, min(len(data), 40)):
        check(data, rng.randrange(1, 6), start)
        count += 1
print("checked", count)
"""


LOG_CHILD = r"""
from drainpipe.native._logscan import scan as normal
from drainpipe.inputs.log_formats import DEFAULT_LOG_FORMAT, parse_log_format

formats = [DEFAULT_LOG_FORMAT,
           parse_log_format('$remote_addr [$time_local] "$request" $status $upstream_response_time $request_time $hostname'),
           parse_log_format('%h %l %u %t "%r" %>s %b %T %v')]
rng = random.Random(7)
def line():
    rt = rng.choice(["0.123", "-", "12", "1" * 30, "0." + "9" * 25, "3.5", "9" * 80 + ".5"])
    return (f'10.0.0.{rng.randrange(256)} - - [10/Oct/2026:13:55:{rng.randrange(60):02d} +0000] '
            f'"GET /users/{rng.randrange(10**6)}/x?q=1 HTTP/1.1" {rng.choice([200, 503])} 5 "-" "ua \\"x\\"" {rt}').encode()

def check(data):
    count = data.count(b"\n") + (not data.endswith(b"\n") and bool(data))
    for fmt in formats:
        for ids in (True, False):
            got = sanitized.scan(data, count, fmt.program, fmt.quoted, ids)
            assert got == normal(data, count, fmt.program, fmt.quoted, ids), data

count = 0
for _ in range(200):
    text = line()
    for cut in range(len(text) + 1):
        check(text[:cut])
        count += 1
for _ in range(3000):
    block = bytearray(b"\n".join(line() for _ in range(rng.randrange(1, 4))))
    for _ in range(rng.randrange(1, 4)):
        block[rng.randrange(len(block))] = rng.choice(b'[]":/ -.0123456789\\\n\r\t?,x')
    check(bytes(block))
    count += 1
print("checked", count)
"""

CSV_CHILD = r"""
from drainpipe.native._csvscan import scan as normal

rng = random.Random(9)
count = 0
for _ in range(4000):
    data = bytes(rng.choice(b'"",,\r\n\nab1 ') for _ in range(rng.randrange(0, 200)))
    for begin in range(0, len(data) + 1, 1 if len(data) < 70 else 5):
        for records in (1, 3):
            for final in (False, True):
                assert sanitized.scan(data, begin, records, final) == normal(data, begin, records, final), data
                count += 1
from drainpipe.native._csvscan import columns as normal_columns
cells = [b"", b"1790000000000", b"-0", b"1.5e3", b"true", b"0", b'"a""b"', b'"x\r\ny"', b"svc", b'"', b"1.", b"\r"]
for _ in range(6000):  # the cell pass: records of random cells and bytes, widths and field maps
    width = rng.randrange(1, 9)
    fields = bytes(rng.choice([0, 1, 2, 3, 4, 5, 6, 7, 255]) for _ in range(width))
    records = [b",".join(rng.choice(cells) for _ in range(rng.randrange(width - 1, width + 2))) for _ in range(rng.randrange(1, 5))]
    data = rng.choice([b"\n", b"\r\n"]).join(records) + rng.choice([b"", b"\n"])
    if rng.random() < 0.3 and data:
        data = bytearray(data)
        data[rng.randrange(len(data))] = rng.choice(b'",\r\n1a')
        data = bytes(data)
    n = rng.randrange(1, 6)
    begin = rng.randrange(0, len(data) + 1) if rng.random() < 0.3 else 0
    assert sanitized.columns(data, fields, n, begin) == normal_columns(data, fields, n, begin), (data, fields, n, begin)
    count += 1
print("checked", count)
"""

OTLP_CHILD = r"""
from drainpipe.native._otlpjson import scan as normal
sys.path.insert(0, sys.argv[2])
from test_otlp_json_scan import _line  # the differential test's exports: every field, good and bad spellings

from drainpipe.native._otlpjson import events as normal_events, gather as normal_gather

rng = random.Random(11)
def check(data):
    count = data.count(b"\n") + (not data.endswith(b"\n") and bool(data))
    assert sanitized.scan(data, count) == normal(data, count), data
    args = (data, count, SPAN_ROLES, RESOURCE_ROLES, (1 << 2) | (1 << 5), 3, 2, 1e9)
    out = sanitized.events(*args)
    assert out == normal_events(*args), data
    if out is not None:  # the endpoint column gathered from the distinct values (an exit row's code: one past them)
        assert sanitized.gather(out[12], out[11] + [""]) == normal_gather(out[12], out[11] + [""]), data

count = 0
for _ in range(40):  # every prefix of an export
    text = _line(rng)
    for cut in range(0, len(text) + 1, 1 if len(text) < 2000 else 3):
        check(text[:cut])
        count += 1
for _ in range(800):  # blocks of exports, bytes mutated (two entry points each: scan and events)
    block = bytearray(b"\n".join(_line(rng) for _ in range(rng.randrange(1, 4))))
    for _ in range(rng.randrange(0, 4)):
        block[rng.randrange(len(block))] = rng.choice(b'{}[]",:\\ \t\r\n0123456789-+.eEtrufalsnu\x00\x80\xff')
    check(bytes(block))
    count += 1
print("checked", count)
"""

PROTO_CHILD = r"""
from drainpipe.native._otlpproto import scan as normal
sys.path.insert(0, str(__import__("pathlib").Path(sys.argv[2]).parent))  # (tests/: the shared helpers)
from otlp_exports import fuzzed_export as _export  # the differential test's exports: every field, odd fields, mutations

from drainpipe.native._otlpproto import events as normal_events, gather as normal_gather

rng = random.Random(12)
def check(exports):
    assert sanitized.scan(exports) == normal(exports), exports
    args = (exports, SPAN_ROLES, RESOURCE_ROLES, (1 << 2) | (1 << 5), 3, 2, 1e9)
    out = sanitized.events(*args)
    assert out == normal_events(*args), exports
    # the endpoint column gathered from the distinct values (an exit row's code: one past them)
    assert sanitized.gather(out[12], out[11] + [""]) == normal_gather(out[12], out[11] + [""]), exports

count = 0
for _ in range(40):  # every prefix of an export, each a bytes object of its own (ASan sees its end)
    export = _export(rng)
    check([export[:cut] for cut in range(len(export) + 1)])
    count += len(export) + 1
for _ in range(800):  # exports, bytes mutated (two entry points each: scan and events)
    exports = []
    for _ in range(rng.randrange(1, 4)):
        raw = bytearray(_export(rng))
        for _ in range(rng.randrange(0, 4) if raw else 0):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        exports.append(bytes(raw))
    check(exports)
    count += 1
print("checked", count)
"""

LINES_CHILD = r"""
from drainpipe.native._lines import nth as normal

rng = random.Random(13)
count = 0
for _ in range(20000):
    data = bytes(rng.choice(b"ab\n") if rng.random() < 0.3 else 97 for _ in range(rng.randrange(0, 300)))
    start = rng.randrange(len(data) + 1)
    stop = rng.randrange(start, len(data) + 1)
    n = rng.randrange(1, 10)
    assert sanitized.nth(data, start, stop, n) == normal(data, start, stop, n), (data, start, stop, n)
    count += 1
print("checked", count)
"""

GROUPS_CHILD = r"""
import numpy as np
from drainpipe.native import _groupstates as normal

rng = np.random.default_rng(17)
count = 0
for _ in range(3000):  # random codes, times, ids, weights; every function; sizes from 0
    n = int(rng.integers(0, 40))
    services = rng.integers(0, 3, n).astype(np.int32)
    subs = None if rng.random() < 0.3 else rng.integers(0, 4, n).astype(np.int32)
    ts = rng.choice([rng.integers(-10**6, 10**6, n), rng.integers(-10**14, 10**14, n)])
    width = int(rng.choice([1, 60_000, 3_600_000]))
    excluded = int(rng.integers(-1, 4))
    got = sanitized.groups(services, subs, excluded, ts, width)
    assert got == normal.groups(services, subs, excluded, ts, width)
    gid = np.frombuffer(got[0], np.int64)
    size = len(got[1]) // 8
    values = rng.choice([0.0, -0.0, 1.5, 500.0, 2000.0, 1e12, 2.0**60], n)
    status = rng.integers(0, 2, n).astype(bool)
    weights = None if rng.random() < 0.5 else rng.integers(0, 5, n).astype(np.float64)
    for function in range(6):
        args = (function, gid, size, values, status, weights, 500.0)
        assert sanitized.states(*args) == normal.states(*args)
    for precision in (0.001, 10.0, 1e6):
        assert sanitized.histogram(gid, size, values, weights, precision) == normal.histogram(gid, size, values, weights, precision)
    count += 1
for _ in range(20):  # many groups over many bins: counted group by group (beyond the dense table)
    n = 3000
    gid = rng.integers(-1, 1000, n).astype(np.int64)
    values = rng.uniform(0, 5000, n)
    weights = None if rng.random() < 0.5 else rng.integers(0, 5, n).astype(np.float64)
    assert sanitized.histogram(gid, 1000, values, weights, 1.0) == normal.histogram(gid, 1000, values, weights, 1.0)
    count += 1

def chunk():  # an Arrow string array's buffers as bytes of their own size (ASan sees their ends), sliced
    values = [rng.choice([b"", b"a", b"svc-03", b"x" * 40, None]) for _ in range(int(rng.integers(0, 30)))]
    offsets, data = [0], b""
    for v in values:
        data += v or b""
        offsets.append(len(data))
    if rng.random() < 0.1 and len(offsets) > 2:  # damaged: decreasing, or past the data
        offsets[int(rng.integers(1, len(offsets)))] = int(rng.choice([-1, len(data) + 5, 0]))
    validity = None
    if any(v is None for v in values) or rng.random() < 0.2:
        validity = bytes(sum(1 << j for j in range(8) if i + j < len(values) and values[i + j] is not None)
                         for i in range(0, len(values), 8))
    offset = int(rng.integers(0, len(values) + 1))
    length = int(rng.integers(0, len(values) - offset + 1))
    return (np.asarray(offsets, np.int32).tobytes(), data or None, offset, length, validity)

def same(f):
    try:
        a = ("ok", f(sanitized))
    except (ValueError, OverflowError) as exc:
        a = ("error", type(exc))
    try:
        b = ("ok", f(normal))
    except (ValueError, OverflowError) as exc:
        b = ("error", type(exc))
    assert a == b, (a, b)
    return a

for _ in range(3000):  # the string columns (_strings.h): codes, and values gathered by row, joined
    chunks = [chunk() for _ in range(int(rng.integers(0, 4)))]
    kind, got = same(lambda m: m.encode(chunks))
    rows_total = sum(c[3] for c in chunks)
    k = int(rng.integers(0, 20))
    rows = rng.integers(-1 if rng.random() < 0.05 else 0, rows_total + (rng.random() < 0.05), k) if rows_total else np.zeros(k if rng.random() < 0.1 else 0, np.int64)
    rows = rows.astype(np.int64)
    same(lambda m: m.gather([(chunks, rows)], b""))
    same(lambda m: m.gather([(chunks, rows), (chunks, rows[::-1].copy())], b"/"))
    count += 1
print("checked", count)
"""

CRC_CHILD = r"""
import zlib

rng = random.Random(19)
count = 0
for n in list(range(0, 300)) + [rng.randrange(300, 70000) for _ in range(300)]:  # every tail, fold and lane count
    data = rng.randbytes(n)
    value = rng.choice([0, 1, 0xFFFFFFFF, rng.getrandbits(32)])
    assert sanitized.crc32(data, value) == zlib.crc32(data, value), (n, value)
    count += 1
print("checked", count)
"""

CHILDREN = {"_jsonscan": JSON_CHILD, "_logscan": LOG_CHILD, "_csvscan": CSV_CHILD, "_otlpjson": OTLP_CHILD,
            "_otlpproto": PROTO_CHILD, "_lines": LINES_CHILD, "_groupstates": GROUPS_CHILD, "_crc32": CRC_CHILD}  # fmt: skip


def _compile(name: str, target: Path) -> Path:
    include = sysconfig.get_paths()["include"]
    cmd = ["gcc", "-shared", "-fPIC", "-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
           "-fno-sanitize-recover=undefined", f"-I{include}", str(SOURCES / f"{name}.c"), "-o", str(target)]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return target


@pytest.fixture(scope="module")
def builds(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Future]]:
    """The sanitized build of each scanner this run tests, compiled one after another in the background, in the
    tests' order: a test waits for its own build only. A test's child keeps one core busy and the next builds take
    the other (about 10 s of gcc in all, which added to the module's time when each test compiled its own)."""
    names = sorted(item.callspec.params["name"] for item in request.session.items  # (those selected)
                   if getattr(item, "module", None) is request.module and hasattr(item, "callspec"))  # fmt: skip
    directory = tmp_path_factory.mktemp("sanitized")
    pool = ThreadPoolExecutor(1)
    yield {name: pool.submit(_compile, name, directory / f"{name}_sanitized.so") for name in names}
    pool.shutdown(cancel_futures=True)


def _runtime(name: str) -> str:
    found = subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
    return found if os.path.isabs(found) and os.path.exists(found) else ""


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc (the build of the C extensions needs it too)")
@pytest.mark.parametrize("name", sorted(CHILDREN))
def test_the_scanner_under_asan_and_ubsan(builds: dict[str, Future], name: str) -> None:
    asan, ubsan = _runtime("libasan.so"), _runtime("libubsan.so")
    if not asan or not ubsan:
        pytest.skip("gcc's sanitizer runtimes are not installed")
    module = builds[name].result()
    env = dict(os.environ, LD_PRELOAD=f"{asan}:{ubsan}", PYTHONMALLOC="malloc",
               ASAN_OPTIONS="detect_leaks=0:abort_on_error=1", UBSAN_OPTIONS="print_stacktrace=1")  # fmt: skip
    child = subprocess.run([sys.executable, "-c", PRELUDE + CHILDREN[name], str(module), str(Path(__file__).parent),
                            name], env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert child.returncode == 0 and "Sanitizer" not in child.stderr, child.stderr[-4000:]
    assert "checked" in child.stdout

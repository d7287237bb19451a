"""The C JSON scanner fuzzed under AddressSanitizer and UndefinedBehaviorSanitizer.

The scanner reads raw bytes with pointer arithmetic (and copies short strings as 16-byte moves), so an off-by-one
would read past a buffer without any Python-visible symptom. This builds ``_jsonscan.c`` with ``-fsanitize=address,
undefined`` and runs it in a child process (the sanitizer runtime preloaded, every Python allocation through malloc
so that ASan sees each bytes object's bounds) over every prefix of clean lines and over random mutations of clean
blocks, at every start offset; any invalid read or undefined behaviour aborts the child. Its results must also equal
the normal build's. (Removing the bound check of the 16-byte copy makes this fail: ASan reports a heap-buffer-
overflow on the first short string at the end of a buffer.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

SOURCE = Path(__file__).parents[2] / "src" / "drainpipe" / "inputs" / "_jsonscan.c"

CHILD = r"""
import importlib.util, json, random, sys
spec = importlib.util.spec_from_file_location("_jsonscan", sys.argv[1])
sanitized = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sanitized)
from drainpipe.inputs._jsonscan import scan as normal

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


def _compile(target: Path) -> None:
    include = sysconfig.get_paths()["include"]
    cmd = ["gcc", "-shared", "-fPIC", "-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
           "-fno-sanitize-recover=undefined", f"-I{include}", str(SOURCE), "-o", str(target)]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def _runtime(name: str) -> str:
    found = subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
    return found if os.path.isabs(found) and os.path.exists(found) else ""


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc (the build of the C extensions needs it too)")
def test_the_scanner_under_asan_and_ubsan(tmp_path: Path) -> None:
    asan, ubsan = _runtime("libasan.so"), _runtime("libubsan.so")
    if not asan or not ubsan:
        pytest.skip("gcc's sanitizer runtimes are not installed")
    module = tmp_path / "_jsonscan_sanitized.so"
    _compile(module)
    env = dict(os.environ, LD_PRELOAD=f"{asan}:{ubsan}", PYTHONMALLOC="malloc",
               ASAN_OPTIONS="detect_leaks=0:abort_on_error=1", UBSAN_OPTIONS="print_stacktrace=1")  # fmt: skip
    child = subprocess.run([sys.executable, "-c", CHILD, str(module)], env=env, capture_output=True, text=True,
                           timeout=600)  # fmt: skip
    assert child.returncode == 0 and "Sanitizer" not in child.stderr, child.stderr[-4000:]
    assert "checked" in child.stdout

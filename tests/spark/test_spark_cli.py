"""`drainpipe run --engine spark -q` and `drainpipe stream`: the same formatted summary as the local engine's
(thousands separators, rejects and where they went), which tier the executors ran, and nothing else (no JVM banners
or log lines). Shipped without its C extensions, the job falls back to the Python paths, says so once, and stores
the same."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from spark_testlib import SPARK

from drainpipe.pipeline import DEFAULT_DEFINITIONS
from drainpipe.pipeline.definitions import load_definitions
from testlib import assert_same_results, stored, wait_until

pytestmark = SPARK


def _events(path: Path, n: int) -> None:
    """n events (every third traced; exemplars are per endpoint) and a line that is not JSON."""
    path.write_text(
        "".join(json.dumps({"ts": 1_795_255_200_000 + i, "service": "s", "endpoint": f"/e{i % 3}", "latency_ms": float(i % 50)}
                           | ({"trace_id": f"{i + 1:032x}"} if i % 3 == 0 else {})) + "\n" for i in range(n))
        + "not json\n"
    )  # fmt: skip


#: a metrics file with settings only: the built-in set, with exemplars and a retention of its own
SETTINGS_ONLY = '[prometheus]\nexemplars = true\n[retention]\nminute = "30d"\n'


def _drainpipe(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "drainpipe.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)  # fmt: skip


def _marked(mark: str) -> list[int]:
    """The processes whose environment holds ``DRAINPIPE_TEST_MARK=mark``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if f"DRAINPIPE_TEST_MARK={mark}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                found.append(int(pid))
        except OSError:  # (gone, or not ours to read)
            continue
    return found


def _finish(proc: subprocess.Popen[str]) -> tuple[list[str], str]:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return out.splitlines(), err


def test_spark_run_and_stream_print_the_local_engines_summary_and_no_jvm_output(tmp_path: Path) -> None:
    """``run --engine spark -q`` and ``stream``, and a run shipped without the C extensions (side by side: each is
    mostly a JVM starting)."""
    (tmp_path / "run").mkdir()
    events = tmp_path / "run" / "e.jsonl"
    _events(events, 1500)
    incoming = tmp_path / "in"
    incoming.mkdir()
    _events(incoming / "a.jsonl", 2000)
    (tmp_path / "run" / "m.toml").write_text(SETTINGS_ONLY)
    mark = f"{os.getpid()}-{tmp_path.name}"
    run = _drainpipe(tmp_path / "run", "run", "-q", "--engine", "spark", "--spark-master", "local[1]", "--input",
                     str(events), "--store", f"duckdb:///{tmp_path}/run/s.duckdb", "--metrics", "m.toml",
                     env={**os.environ, "DRAINPIPE_TEST_MARK": mark})  # fmt: skip
    stream = _drainpipe(tmp_path, "stream", "--input", str(incoming), "--checkpoint", str(tmp_path / "ck"),
                        "--store", f"duckdb:///{tmp_path}/s.duckdb", "--trigger-once", "--spark-master", "local[1]")  # fmt: skip
    fallback = subprocess.Popen([sys.executable, "-m", "drainpipe.cli", "run", "-q", "--engine", "spark",
                                 "--spark-master", "local[1]", "--input", str(events), "--store",
                                 f"duckdb:///{tmp_path}/run/f.duckdb", "--metrics", "m.toml"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=tmp_path / "run",
                                env={**os.environ, "DRAINPIPE_SPARK_NATIVE": "0"})  # fmt: skip

    lines, err = _finish(run)
    assert err == "", err
    # the command leaves its session to end with it: the JVM and its Python workers stop on their own
    wait_until(lambda: not _marked(mark), timeout=60, interval=0.1, what="the Spark JVM of a finished run to exit")
    assert lines[0] == "read 1,501 = accepted 1,500 + rejected 1   dropped 0   handler errors 0"
    assert re.fullmatch(r"[\d,]+ events/s over \d+\.\d\d s into duckdb:///.*/s\.duckdb \(spark\)", lines[1]), lines[1]
    assert lines[2] == f"rejects appended to {tmp_path}/run/s.rejected.jsonl: invalid JSON (1)"
    # the executors imported drainpipe from the shipped zip, its C extensions extracted and loaded there
    assert re.fullmatch(r"Spark started in \d+\.\d\d s; Spark executors ran the native tier \(\d C extensions\)",
                        lines[3]), lines[3]  # fmt: skip
    assert len(lines) == 4
    local, _ = _finish(_drainpipe(tmp_path / "run", "run", "-q", "--input", str(events), "--store",
                                  f"duckdb:///{tmp_path}/run/l.duckdb", "--metrics", "m.toml"))  # fmt: skip
    assert local[0] == lines[0] and local[2] == lines[2].replace("s.rejected", "l.rejected")  # the local engine's
    # both engines read the settings-only file as the built-in set with exemplars, and store the same
    definitions = load_definitions(tmp_path / "run" / "m.toml")
    assert definitions.names == (*DEFAULT_DEFINITIONS.names, "exemplars")
    assert_same_results(f"duckdb:///{tmp_path}/run/l.duckdb", f"duckdb:///{tmp_path}/run/s.duckdb", definitions)
    assert len(stored(f"duckdb:///{tmp_path}/run/s.duckdb", definitions)[1]["exemplars"]) > 0

    # shipped without its C extensions: the Python paths, said once, the same store
    lines, err = _finish(fallback)
    assert "Spark executors ran the Python fallback where a C extension was missing (the shipped code has no " \
        "extensions built for this Python" in lines[-1], lines  # fmt: skip
    assert err.count("Spark tasks ran the Python fallback") == 1, err  # logged once
    assert_same_results(f"duckdb:///{tmp_path}/run/l.duckdb", f"duckdb:///{tmp_path}/run/f.duckdb", definitions)

    lines = [x for x in _finish(stream)[0] if x.strip()]
    assert lines[0] == "micro-batch 0: read 2,001 = accepted 2,000 + rejected 1, 1 new files", lines
    assert lines[-3] == "read 2,001 = accepted 2,000 + rejected 1   dropped 0   handler errors 0"
    assert lines[-2].endswith("(spark streaming)") and " events/s over " in lines[-2]
    assert lines[-1] == f"rejects appended to {tmp_path}/s.rejected.jsonl: invalid JSON (1)"

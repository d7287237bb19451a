"""`drainpipe run --engine spark -q` and `drainpipe stream`: the same formatted summary as the local engine's
(thousands separators, rejects and where they went) and nothing else (no JVM banners or log lines)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from spark_testlib import SPARK

pytestmark = SPARK


def _events(path: Path, n: int) -> None:
    path.write_text(
        "".join(json.dumps({"ts": 1_795_255_200_000 + i, "service": "s", "latency_ms": 1.0}) + "\n" for i in range(n))
        + "not json\n"
    )


def _drainpipe(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "drainpipe.cli", *args], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)  # fmt: skip


def test_quiet_spark_run_prints_the_summary_and_no_jvm_output(tmp_path: Path) -> None:
    events = tmp_path / "e.jsonl"
    _events(events, 1500)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "drainpipe.cli",
            "run",
            "-q",
            "--engine",
            "spark",
            "--spark-master",
            "local[1]",
            "--input",
            str(events),
            "--store",
            f"duckdb:///{tmp_path}/s.duckdb",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr == "", done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "read 1,501 = accepted 1,500 + rejected 1   dropped 0   handler errors 0"
    assert re.fullmatch(r"[\d,]+ events/s over \d+\.\d\d s into duckdb:///.*/s\.duckdb \(spark\)", lines[1]), lines[1]
    assert lines[2] == f"rejects appended to {tmp_path}/s.rejected.jsonl: invalid JSON (1)"
    assert len(lines) == 3
    local = _drainpipe(tmp_path, "run", "-q", "--input", str(events), "--store", f"duckdb:///{tmp_path}/l.duckdb")
    local_lines = local.stdout.splitlines()  # the local engine prints the same summary
    assert local_lines[0] == lines[0] and local_lines[2] == lines[2].replace("s.rejected", "l.rejected")


def test_stream_prints_the_same_summary(tmp_path: Path) -> None:
    incoming = tmp_path / "in"
    incoming.mkdir()
    _events(incoming / "a.jsonl", 2000)
    done = _drainpipe(tmp_path, "stream", "--input", str(incoming), "--checkpoint", str(tmp_path / "ck"),
                      "--store", f"duckdb:///{tmp_path}/s.duckdb", "--trigger-once", "--spark-master", "local[1]")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [x for x in done.stdout.splitlines() if x.strip()]
    assert lines[0] == "micro-batch 0: read 2,001 = accepted 2,000 + rejected 1, 1 new files", lines
    assert lines[-3] == "read 2,001 = accepted 2,000 + rejected 1   dropped 0   handler errors 0"
    assert lines[-2].endswith("(spark streaming)") and " events/s over " in lines[-2]
    assert lines[-1] == f"rejects appended to {tmp_path}/s.rejected.jsonl: invalid JSON (1)"

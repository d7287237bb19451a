"""`drainpipe run --engine spark -q`: the summary and nothing else (no JVM banners or log lines)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from spark_testlib import SPARK

pytestmark = SPARK


def test_quiet_spark_run_prints_no_jvm_output(tmp_path: Path) -> None:
    events = tmp_path / "e.jsonl"
    events.write_text(
        "".join(json.dumps({"ts": 1_795_255_200_000 + i, "service": "s", "latency_ms": 1.0}) + "\n" for i in range(100))
    )
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
    assert done.stdout.splitlines()[0].startswith("read 100 = accepted 100 + rejected 0")
    assert len(done.stdout.splitlines()) == 2

"""A class-data-sharing archive of the Spark JVM's classes, so that the tests' many Spark JVMs start in about half
the time (a local session and its first job: 9 s -> 4 s on the 2-core test machine).

The tests start a JVM over and over: each ``drainpipe run --engine spark`` or ``stream`` subprocess, the standalone
cluster's master, worker and executors, the Connect server and its restarts. Most of a start is loading and
verifying the same few thousand classes from ``pyspark/jars``. Java (13+) can dump the classes a run loaded into an
archive (``-XX:ArchiveClassesAtExit``) and map it into later JVMs on the same class path
(``-XX:SharedArchiveFile``); C1-only compilation (``-XX:TieredStopAtLevel=1``) helps such short jobs too.

``make test`` builds the archive once per machine, before pytest (``python tests/jvm_archive.py``): one
Spark batch job and one streaming query in one JVM. ``tests/conftest.py`` then gives :func:`java_options` to every
Spark JVM the tests start, through Spark's launcher variables (``SPARK_SUBMIT_OPTS`` for drivers and the Connect
server, ``SPARK_DAEMON_JAVA_OPTS`` for the master and worker) and ``spark.executor.defaultJavaOptions``.

Speed only, never meaning: a JVM that cannot use the archive (another Java, another class path, no archive yet)
says nothing (``-Xlog:cds=off``) and starts as it would have. The archive's name carries the pyspark version and
a digest of ``java -version``, so an upgrade builds a new one instead of using a stale one."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: quiet about the archive whatever happens: a JVM that cannot map it just loads its classes
_SILENT = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def archive_path() -> Path:
    """Where this machine's archive is (or would be): ``.jvm/spark-<pyspark>-<java digest>.jsa``."""
    import pyspark

    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr
    digest = hashlib.sha256(java.encode()).hexdigest()[:12]
    return ROOT / ".jvm" / f"spark-{pyspark.__version__}-{digest}.jsa"


def java_options() -> str | None:
    """The JVM options that use the archive, or None when it has not been built."""
    path = archive_path()
    if not path.exists():
        return None
    return f"-XX:SharedArchiveFile={path} -XX:TieredStopAtLevel=1 {_SILENT}"


def _workload(directory: Path) -> None:
    """What the archive is made of: a batch job and a trigger-once stream of a small file, in one JVM."""
    from drainpipe.pipeline.generator import generate_events, write_events
    from drainpipe.spark import run_batch, run_stream

    (directory / "in").mkdir()
    write_events(generate_events(2_000, services=3, seed=1), directory / "in" / "events.jsonl")
    conf = {"spark.ui.enabled": "false", "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
    run_batch([str(directory / "in" / "events.jsonl")], store_url=f"duckdb:///{directory / 'a.duckdb'}",
              master="local[2]", conf=conf, quiet=True)  # fmt: skip
    run_stream(str(directory / "in"), store_url=f"duckdb:///{directory / 'b.duckdb'}",
               checkpoint=str(directory / "checkpoint"), master="local[2]", conf=conf, trigger_once=True)  # fmt: skip


def build() -> Path:
    """Build the archive unless it exists (about 15 s: one JVM runs the workload and dumps its classes on exit)."""
    path = archive_path()
    if path.exists():
        return path
    path.parent.mkdir(exist_ok=True)
    partial = path.with_suffix(".partial.jsa")
    with tempfile.TemporaryDirectory() as directory:
        env = {**os.environ, "SPARK_SUBMIT_OPTS": f"-XX:ArchiveClassesAtExit={partial} {_SILENT}"}
        # capture_output: wait for the end of the JVM's output, which outlives the Python that started it by the
        # seconds the dump takes (its stdin closing with that Python is what stops it)
        done = subprocess.run([sys.executable, __file__, "--workload", directory], env=env, capture_output=True,
                              text=True, timeout=600)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"the archive's workload failed: {done.stderr[-3000:]}")
    if not partial.exists():
        raise SystemExit(f"the JVM wrote no class archive to {partial}")
    partial.replace(path)  # whole or not at all: a JVM never maps a half-written archive
    return path


if __name__ == "__main__":
    if sys.argv[1:2] == ["--workload"]:
        _workload(Path(sys.argv[2]))
    else:
        print(build())

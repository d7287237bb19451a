"""A class-data-sharing archive of the Spark JVM's classes, so that a local Spark session starts in about half the
time: most of a JVM's start is loading and verifying the same few thousand classes from ``pyspark/jars``. Java (13+)
dumps the classes a run loaded into an archive (``-XX:ArchiveClassesAtExit``) and maps it into later JVMs on the same
class path (``-XX:SharedArchiveFile``).

* :func:`build` (:func:`main`; ``make install`` runs it) runs a small batch job and a
  trigger-once stream in one JVM and keeps what it loaded: once per machine, Java and pyspark install (the file's
  name carries the pyspark version and a digest of ``java -version`` and of where pyspark is installed, so an
  upgrade, or a second virtual environment on the machine, builds its own: a JVM maps an archive only on the class
  path it was dumped with). About 20 s.
* :func:`java_options` gives the options that map it, or None when it is not built; :func:`spark_session
  <drainpipe.spark.session.spark_session>` adds them to the driver JVM of a local master (whose executors run in it).

Speed only, never meaning: a JVM that cannot use the archive (another Java, another class path) says nothing
(``-Xlog:cds=off``) and starts as it would have. Where: ``$DRAINPIPE_JVM_ARCHIVE_DIR``, else
``$XDG_CACHE_HOME/drainpipe/jvm``, else ``~/.cache/drainpipe/jvm``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["ARCHIVE_DIR_ENV", "archive_path", "build", "java_binary", "java_options", "main", "workload"]

#: the environment variable naming the archive's directory
ARCHIVE_DIR_ENV = "DRAINPIPE_JVM_ARCHIVE_DIR"
#: quiet about the archive whatever happens: a JVM that cannot map it just loads its classes
SILENT = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def java_binary() -> str | None:
    """The Java Spark would start: ``$JAVA_HOME/bin/java``, else ``java`` on ``PATH`` (None: none)."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = os.path.join(home, "bin", "java")
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("java")


def archive_path() -> Path:
    """Where the archive of this Java and pyspark install is (or would be): ``spark-<pyspark>-<digest>.jsa`` in its
    directory, the digest over ``java -version`` and the directory pyspark (and so its jars, the class path) is in."""
    import pyspark

    java = subprocess.run([java_binary() or "java", "-version"], capture_output=True, text=True).stderr
    where = os.path.dirname(os.path.abspath(pyspark.__file__))
    digest = hashlib.sha256(f"{java}\0{where}".encode()).hexdigest()[:12]
    base = os.environ.get(ARCHIVE_DIR_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "drainpipe", "jvm"
    )
    return Path(base) / f"spark-{pyspark.__version__}-{digest}.jsa"


def java_options() -> str | None:
    """The JVM options that map the archive, or None when it is not built (or Java or pyspark is missing)."""
    if java_binary() is None:
        return None
    try:
        path = archive_path()
    except (ImportError, OSError):
        return None
    return f"-XX:SharedArchiveFile={path} {SILENT}" if path.exists() else None


def workload(workdir: str) -> None:
    """What the archive is made of: a batch job and a trigger-once stream of a small file, in one JVM."""
    from drainpipe.pipeline.generator import generate_events, write_events
    from drainpipe.spark import run_batch, run_stream

    directory = Path(workdir)
    (directory / "in").mkdir()
    write_events(generate_events(2_000, services=3, seed=1), directory / "in" / "events.jsonl")
    conf = {"spark.ui.enabled": "false", "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
    run_batch([str(directory / "in" / "events.jsonl")], store_url=f"duckdb:///{directory / 'a.duckdb'}",
              master="local[2]", conf=conf, quiet=True)  # fmt: skip
    run_stream(str(directory / "in"), store_url=f"duckdb:///{directory / 'b.duckdb'}",
               checkpoint=str(directory / "checkpoint"), master="local[2]", conf=conf, trigger_once=True)  # fmt: skip


def build() -> Path:
    """Build the archive unless it exists; its path. Raises ``RuntimeError`` (one line) when the workload fails."""
    path = archive_path()
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.partial.jsa")
    with tempfile.TemporaryDirectory() as directory:
        env = {**os.environ, "SPARK_SUBMIT_OPTS": f"-XX:ArchiveClassesAtExit={partial} {SILENT}"}
        # capture_output: wait for the end of the JVM's output, which outlives the Python that started it by the
        # seconds the dump takes (its stdin closing with that Python is what stops it)
        workload = f"from drainpipe.spark.jvm_archive import workload; workload({directory!r})"
        done = subprocess.run([sys.executable, "-c", workload], env=env, capture_output=True, text=True,
                              timeout=600)  # fmt: skip
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        raise RuntimeError(f"the JVM class archive's workload failed: {lines[-1] if lines else done.returncode}")
    if not partial.exists():
        raise RuntimeError(f"the JVM wrote no class archive to {partial}")
    partial.replace(path)  # whole or not at all: a JVM never maps a half-written archive
    return path


def main() -> None:
    """Build the archive and print its path; on failure say why in one line and exit 1 (Spark starts without it).
    Without Java (it is needed only for Spark) there is nothing to build: it says so and exits 0."""
    if java_binary() is None:
        print("drainpipe: no Java: no JVM class archive to build (Spark needs Java 17+)", file=sys.stderr)
        return
    try:
        print(build())
    except (RuntimeError, ImportError, OSError, subprocess.TimeoutExpired) as exc:
        sys.exit(f"drainpipe: no JVM class archive ({exc}): Spark starts without it")

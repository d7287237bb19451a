"""Spark set-up: a usable Java and pyspark, and the SparkSession the engine runs on.

* :func:`check_java` finds ``$JAVA_HOME/bin/java`` (else ``java`` on ``PATH``), runs ``java -version`` and
  returns the major version; it raises :class:`SparkSetupError` (a ``ValueError``, one line) when there is no
  Java or it is older than 17 (PySpark 4 needs 17 or 21).
* :func:`check_pyspark` imports pyspark and requires version >= 4.0 (``pip install 'drainpipe[spark]'``).
* :func:`spark_session` builds or reuses a session (``master``, or a Spark Connect ``remote`` such as
  ``sc://host:15002``). The executors' Python is the user's choice (``PYSPARK_PYTHON``, ``spark.pyspark.python``,
  or a packed venv shipped with ``spark.archives``); only when none is made and the master is local does it default
  to this interpreter. The job ships its own task code (:func:`ship_code`: a zip of drainpipe's Python modules and
  the pipeline's C extensions, ``addPyFile``, or ``addArtifacts`` under Connect), so the executors need only
  pyspark, pyarrow and numpy, and run the native tier where the build suits them. Modest
  defaults:
  UI and console progress bars off, ``spark.sql.shuffle.partitions=8``, Arrow batches of 64k rows, cached columns
  uncompressed, log level
  ERROR, and for ``local[...]`` masters ``spark.driver.memory=2g`` and log level FATAL (a failed task's stack
  trace is re-raised by the engine as one line). ``conf`` (``--spark-conf key=value``) overrides any default.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
import weakref
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from drainpipe.errors import SparkSetupError
from drainpipe.pipeline import open_store

from .jvm_archive import java_binary, java_options

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

__all__ = [
    "job",
    "add_rate",
    "MIN_JAVA",
    "check_java",
    "check_pyspark",
    "spark_session",
    "DEFAULT_CONF",
    "code_zip",
    "ship_code",
    "is_connect",
    "job_session",
    "short_lived_jvm",
]

MIN_JAVA = 17

# pyspark 4.x warns that it does not fully support pandas 3 when a session or an Arrow UDF is made: drainpipe
# exchanges Arrow only
warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)

#: defaults applied under the user's ``conf``
DEFAULT_CONF: Mapping[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.execution.arrow.maxRecordsPerBatch": "65536",
    "spark.sql.execution.pyspark.udf.faulthandler.enabled": "true",
    "spark.python.worker.faulthandler.enabled": "true",  # (the RDD job's workers: a crash in C shows its trace)
    # a job's task states are persisted for its two actions, seconds at most: compressing the cached columns cost
    # more CPU than it saved (run_batch of 4M events: 4.7 -> 4.2 s). It holds for every DataFrame cached in the
    # session drainpipe builds; a session handed in keeps its own
    "spark.sql.inMemoryColumnarStorage.compressed": "false",
    "spark.log.level": "ERROR",
    # an executor talks to its Python workers over a Unix domain socket instead of TCP on loopback: every task
    # paid a delayed-ACK stall there (16 trivial Python tasks on two cores 0.55 s -> 0.22 s)
    "spark.python.unix.domain.socket.enabled": "true",
    # pyspark 4.x warns on every worker start that it does not fully support pandas 3 (drainpipe uses Arrow)
    "spark.executorEnv.PYTHONWARNINGS": "ignore:PySpark does not yet fully support pandas:FutureWarning",
}
#: on a laptop, a failed task's Java stack trace is noise: the engine re-raises its cause as one line
_LOCAL_CONF: Mapping[str, str] = {"spark.driver.memory": "2g", "spark.log.level": "FATAL"}


def _major(version: str) -> int:
    """``"17.0.15"`` -> 17, ``"1.8.0_392"`` -> 8, ``"21"`` -> 21."""
    parts = re.findall(r"\d+", version)
    if not parts:
        raise ValueError(version)
    first = int(parts[0])
    return int(parts[1]) if first == 1 and len(parts) > 1 else first


def check_java(minimum: int = MIN_JAVA) -> int:
    """The major version of the Java Spark would use; :class:`SparkSetupError` if none or older than ``minimum``."""
    java = java_binary()
    if java is None:
        raise SparkSetupError(
            f"no Java found (Spark needs Java {minimum} or newer): install a JDK {minimum}+ or set JAVA_HOME"
        )
    try:
        done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SparkSetupError(
            f"cannot run {java} -version ({exc}); install a JDK {minimum}+ or set JAVA_HOME"
        ) from None
    match = re.search(r'version "([^"]+)"', done.stderr + done.stdout)
    if done.returncode != 0 or match is None:
        raise SparkSetupError(
            f"{java} does not work (exit {done.returncode}); install a JDK {minimum}+ or set JAVA_HOME"
        )
    try:
        major = _major(match.group(1))
    except ValueError:
        raise SparkSetupError(f"cannot read the version of {java}: {match.group(1)!r}") from None
    if major < minimum:
        raise SparkSetupError(
            f"Java {match.group(1)} at {java} is too old: Spark needs Java {minimum} or newer (set JAVA_HOME)"
        )
    return major


def check_pyspark() -> str:
    """pyspark's version; :class:`SparkSetupError` if it is missing or older than 4.0."""
    try:
        import pyspark
    except ImportError:
        raise SparkSetupError("pyspark is not installed: pip install 'drainpipe[spark]' (pyspark>=4.0)") from None
    major = int(re.match(r"\d+", pyspark.__version__).group())  # type: ignore[union-attr]
    if major < 4:
        raise SparkSetupError(f"pyspark {pyspark.__version__} is too old: pip install 'pyspark>=4.0'")
    return pyspark.__version__


_LOG4J = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
"""


def _quiet_log4j() -> str:
    """A log4j2 configuration (errors only, no start-up chatter) for local drivers, written once."""
    path = os.path.join(
        tempfile.gettempdir(), f"drainpipe-log4j2-{os.getuid() if hasattr(os, 'getuid') else 0}.properties"
    )
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(_LOG4J)
        os.replace(tmp, path)
    return path


def spark_session(
    master: str = "local[*]",
    conf: Mapping[str, str] | None = None,
    app_name: str = "drainpipe",
    quiet: bool = False,
    remote: str | None = None,
) -> SparkSession:
    """Build (or reuse the active) SparkSession for the engine; checks Java and pyspark first.

    An active session is reused as is (its master and static conf stay what they are). ``remote``: a Spark Connect
    URL (``sc://host:port``; default ``$SPARK_REMOTE``), instead of ``master``: no JVM in this process. ``quiet``:
    the JVM's own output (start-up banners, log lines) goes to a file in the temp directory instead of this
    process's stderr; failures still reach the caller as exceptions. The session has drainpipe's task code
    (:func:`ship_code`).
    """
    check_pyspark()
    from pyspark.sql import SparkSession

    remote = remote or os.environ.get("SPARK_REMOTE") or None
    if remote is None:
        active = SparkSession.getActiveSession()
        if active is not None:
            ship_code(active)
            return active
        check_java()
    settings = dict(DEFAULT_CONF)
    local = remote is None and master.startswith("local")
    if local:
        settings.update(_LOCAL_CONF)
        settings["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile=file:{_quiet_log4j()}"
        _map_class_archive()
    settings.update(conf or {})
    if settings.get("spark.pyspark.python"):
        # the conf takes precedence over the environment (Spark's documented order); pyspark's Python side reads
        # only the environment when the driver is a plain Python process, so the conf is put there
        os.environ["PYSPARK_PYTHON"] = settings["spark.pyspark.python"]
    elif local and not _python_chosen(settings):
        os.environ["PYSPARK_PYTHON"] = sys.executable  # local workers: this venv, unless told otherwise
    if local and _this_interpreter(os.environ.get("PYSPARK_PYTHON")) and not settings.get("spark.archives"):
        _local_daemon(settings, conf or {})
    builder = SparkSession.builder.appName(app_name)
    builder = builder.remote(remote) if remote is not None else builder.master(master)
    for key, value in settings.items():
        if remote is not None and not key.startswith("spark.sql."):
            continue  # under Connect the server's static conf is set; only session (SQL) conf applies
        builder = builder.config(key, value)
    with _jvm_output(quiet and remote is None):
        session = builder.getOrCreate()
    ship_code(session)
    return session


def _local_daemon(settings: dict[str, str], conf: Mapping[str, str]) -> None:
    """Local workers on this interpreter: their daemon is :mod:`drainpipe.spark.daemon` (pyspark imported from
    the install, not compiled from Spark's zips at every start: a cold session's first job 1.71 -> 1.04 s), with
    the directory drainpipe is imported from on the workers' path when it is not a site directory (a checkout on
    ``PYTHONPATH``, a path added at run time). Not where the conf given names a daemon or the workers' path."""
    if "spark.python.daemon.module" in conf or "spark.executorEnv.PYTHONPATH" in conf:
        return
    import site

    import drainpipe

    settings["spark.python.daemon.module"] = "drainpipe.spark.daemon"
    home = os.path.dirname(os.path.dirname(os.path.abspath(drainpipe.__file__)))
    sites = {os.path.abspath(d) for d in [*site.getsitepackages(), site.getusersitepackages()]}
    if home not in sites:  # (a site directory is on the workers' path already, after the standard library)
        settings["spark.executorEnv.PYTHONPATH"] = home


def _this_interpreter(python: str | None) -> bool:
    """Whether ``python`` (a path or a command on ``PATH``) names the interpreter running this process, by the same
    path (a venv's ``python`` and the interpreter it links to are one file but not one environment)."""
    found = shutil.which(python) if python else None
    return found is not None and os.path.abspath(found) == os.path.abspath(sys.executable)


def _python_chosen(settings: Mapping[str, str]) -> bool:
    """Whether the user chose the executors' Python: ``PYSPARK_PYTHON``, ``spark.pyspark.python`` or a shipped
    archive (``spark.archives``, Spark's documented way to ship a packed venv)."""
    return bool(
        os.environ.get("PYSPARK_PYTHON") or settings.get("spark.pyspark.python") or settings.get("spark.archives")
    )


def short_lived_jvm() -> None:
    """For a process that starts a local session, runs one job and exits (``drainpipe run --engine spark``): its
    JVM runs without the optimising compiler (C2, ``-XX:TieredStopAtLevel=1``, added to ``SPARK_SUBMIT_OPTS``, so
    a ``spark.driver.extraJavaOptions`` of the user's still wins). The JVM there mostly moves bytes between the input
    and Python, and C2 spent more CPU compiling than it saved in a job of seconds; a long-lived session (a stream,
    an application's) keeps it: there it pays back (docs/pipeline.md). Call it before the session starts."""
    _add_launcher_option("-XX:TieredStopAtLevel=1", unless=("TieredStopAtLevel",))


def _map_class_archive() -> None:
    """Before a local master's JVM starts (it runs the executors too): map the class-data archive if this machine
    has one (:mod:`.jvm_archive`; about half the start), unless the launcher's options name one already."""
    options = java_options()
    if options is not None:
        _add_launcher_option(options, unless=("SharedArchiveFile", "ArchiveClassesAtExit"))


def _add_launcher_option(option: str, unless: tuple[str, ...]) -> None:
    """Add ``option`` to the JVM options Spark's launcher reads (``SPARK_SUBMIT_OPTS``), unless they name one of
    ``unless`` already (the user's choice)."""
    submit = os.environ.get("SPARK_SUBMIT_OPTS", "")
    if not any(word in submit for word in unless):
        os.environ["SPARK_SUBMIT_OPTS"] = f"{submit} {option}".strip()


def is_connect(session: Any) -> bool:
    """Whether ``session`` is a Spark Connect client session (no SparkContext, accumulators or RDDs)."""
    return type(session).__module__.startswith("pyspark.sql.connect")


_SHIPPED: weakref.WeakSet[Any] = weakref.WeakSet()  # sessions that have the code
#: ``0`` in the driver's environment ships the task code without C extensions (executors on a platform unlike the
#: driver's, where extracting them is pointless; the tests forcing the fallback)
SHIP_NATIVE_ENV = "DRAINPIPE_SPARK_NATIVE"


def code_zip() -> str:
    """A zip of drainpipe's Python modules, compiled, and the C extensions built here for the pipeline
    (``drainpipe/native``; not the queue's, which tasks never load), built once per content in the temp directory:
    everything a Spark task imports, for executors that have nothing of ours installed. An executor extracts the
    extensions it can load (:mod:`drainpipe.native`, "From a zip") and falls back to the Python paths for the rest.

    Each module's bytecode sits beside its source (``x.pyc``, hash-based and unchecked: the zip is named by the
    sources' digest), because Python cannot cache bytecode of what it imports from a zip: without it every Python
    worker of every executor compiled each module it imported (0.15-0.35 s of CPU a worker for a task's imports).
    An executor whose Python is another version ignores the bytecode and compiles the source, as before."""
    import hashlib
    import importlib.util
    import marshal
    import zipfile
    from pathlib import Path

    import drainpipe

    root = Path(drainpipe.__file__).resolve().parent
    files = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    if os.environ.get(SHIP_NATIVE_ENV, "1") != "0":  # 0: executors run the Python paths (a platform unlike ours)
        files += sorted((root / "native").glob("*.so"))
    digest = hashlib.sha256(importlib.util.MAGIC_NUMBER)
    for path in files:
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    target = Path(tempfile.gettempdir()) / f"drainpipe-tasks-{digest.hexdigest()[:16]}.zip"
    if not target.exists():
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
            for path in files:
                name = Path("drainpipe") / path.relative_to(root)
                z.write(path, str(name))
                if path.suffix == ".py":  # (the layout and header zipimport reads: PEP 552, unchecked hash)
                    source = path.read_bytes()
                    code = compile(source, str(name), "exec", dont_inherit=True)
                    flags = (1).to_bytes(4, "little")  # (hash-based, not checked against the source)
                    header = importlib.util.MAGIC_NUMBER + flags + importlib.util.source_hash(source)
                    z.writestr(str(name.with_suffix(".pyc")), header + marshal.dumps(code))
        os.replace(tmp, target)
    return str(target)


def ship_code(session: Any) -> None:
    """Add drainpipe's task code to ``session``'s job (once per session): ``addPyFile``, or ``addArtifacts``
    under Spark Connect. Executors then import drainpipe from the zip, with the pipeline's C extensions where they
    load (never the queue's: it is imported lazily, and tasks do not use it)."""
    if session in _SHIPPED:
        return
    path = code_zip()
    if is_connect(session):
        session.addArtifacts(path, pyfile=True)
    else:
        session.sparkContext.addPyFile(path)
    _SHIPPED.add(session)


@contextlib.contextmanager
def _jvm_output(quiet: bool) -> Iterator[None]:
    """While the JVM starts, point file descriptor 2 at a log file (quiet), so the JVM inherits that instead of
    the terminal; this process's stderr is restored afterwards."""
    if not quiet:
        yield
        return
    path = os.path.join(tempfile.gettempdir(), f"drainpipe-spark-{os.getpid()}.log")
    sys.stderr.flush()
    saved = os.dup(2)
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.dup2(log, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(log)


def job_session(
    master: str,
    conf: Mapping[str, str] | None,
    spark: SparkSession | None,
    quiet: bool = False,
    remote: str | None = None,
) -> tuple[SparkSession, bool]:
    """(session, created here): an explicit or active session is used as is and not stopped."""
    if spark is not None:
        ship_code(spark)
        return spark, False
    check_pyspark()
    from pyspark.sql import SparkSession

    remote = remote or os.environ.get("SPARK_REMOTE") or None
    active = None if remote is not None else SparkSession.getActiveSession()
    return spark_session(master, conf, quiet=quiet, remote=remote), active is None


@contextlib.contextmanager
def job(
    store_url: str,
    master: str,
    conf: Mapping[str, str] | None,
    spark: SparkSession | None,
    quiet: bool = False,
    remote: str | None = None,
    keep: bool = False,
) -> Iterator[tuple[Any, SparkSession]]:
    """(store, session) for one job: the store is closed after it, the session stopped if this job started it,
    unless ``keep``."""
    store = open_store(store_url)
    try:
        session, created = job_session(master, conf, spark, quiet, remote)
        try:
            yield store, session
        finally:
            if created and not keep:
                session.stop()
    finally:
        store.close()


def add_rate(summary: dict[str, Any], t0: float) -> dict[str, Any]:
    """Add ``elapsed_s`` (since perf_counter ``t0``) and ``events_per_s`` (accepted per second) to ``summary``."""
    elapsed = time.perf_counter() - t0
    summary.update(elapsed_s=elapsed, events_per_s=summary["accepted"] / elapsed if elapsed > 0 else 0.0)
    return summary

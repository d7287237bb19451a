"""A real Spark standalone cluster for the tests: a master and one worker JVM started from pyspark's own
``bin/spark-class``, and executors whose Python is a separate venv holding only numpy and pyarrow (no drainpipe,
no duckdb, no psycopg): what a shared cluster's nodes have. The executors' interpreter is a wrapper that records
each start in a marker file, so a test can tell that the job's tasks ran there and not in the driver's Python."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

#: what the executors' venv gets from this one (the engine's tasks need these and nothing of ours)
EXECUTOR_PACKAGES = ("numpy", "numpy.libs", "pyarrow")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def executor_python(directory: Path) -> tuple[str, Path]:
    """A venv with only numpy and pyarrow (linked from this venv: no network), and a wrapper interpreter that
    appends one line to a marker file each time Spark starts it. Returns (wrapper path, marker path)."""
    venv = directory / "executor-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(sysconfig.get_paths()["purelib"])
    target = next((venv / "lib").glob("python3*/site-packages"))
    for entry in site.iterdir():
        base = entry.name.split("-")[0]
        if base in EXECUTOR_PACKAGES or (entry.name.endswith(".dist-info") and base in EXECUTOR_PACKAGES):
            (target / entry.name).symlink_to(entry)
    python = venv / "bin" / "python"
    probe = subprocess.run([str(python), "-c", "import drainpipe"], capture_output=True, text=True)
    assert probe.returncode != 0, "the executors' venv must not have drainpipe"
    marker = directory / "executor-starts.txt"
    wrapper = directory / "executor-python"
    wrapper.write_text(f'#!/bin/sh\necho "$0" >> {marker}\nexec {python} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper), marker


@dataclass
class Cluster:
    master: str  # spark://127.0.0.1:PORT
    python: str  # the executors' interpreter (the wrapper)
    marker: Path  # one line per executor Python start


def _spark_class() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


@contextmanager
def standalone_cluster(directory: Path, cores: int = 2) -> Iterator[Cluster]:
    """A master and a worker (``cores`` cores, 2 GB) on loopback, stopped afterwards."""
    python, marker = executor_python(directory)
    port, ui, worker_ui = free_port(), free_port(), free_port()
    env = {**os.environ, "SPARK_LOG_DIR": str(directory / "logs"), "SPARK_WORKER_DIR": str(directory / "work"),
           "SPARK_LOCAL_IP": "127.0.0.1"}  # fmt: skip
    env.pop("PYSPARK_PYTHON", None)
    logs = open(directory / "cluster.log", "ab")
    master = subprocess.Popen([_spark_class(), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(port), "--webui-port", str(ui)], env=env, stdout=logs, stderr=logs)  # fmt: skip
    worker = None
    try:
        url = f"spark://127.0.0.1:{port}"
        worker = subprocess.Popen([_spark_class(), "org.apache.spark.deploy.worker.Worker", url, "--host",
                                   "127.0.0.1", "--cores", str(cores), "--memory", "2g", "--webui-port",
                                   str(worker_ui), "--work-dir", str(directory / "work")], env=env, stdout=logs,
                                  stderr=logs)  # fmt: skip
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=5) as r:
                    if json.loads(r.read()).get("aliveworkers", 0) >= 1:
                        break
            except (OSError, ValueError):  # not listening yet, or an empty page while the master's UI starts
                pass
            if time.monotonic() > deadline:
                raise AssertionError(
                    "the standalone cluster did not come up: " + (directory / "cluster.log").read_text()[-3000:]
                )
            time.sleep(0.5)
        yield Cluster(url, python, marker)
    finally:
        for proc in (worker, master):
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
        logs.close()
        shutil.rmtree(directory / "work", ignore_errors=True)


class ConnectServer:
    """A running Spark Connect server (see :func:`connect_server`). ``restart()`` starts it again on the same port
    after it died (a test killed it): the same ``remote`` then reaches the new one."""

    def __init__(self, command: list[str], env: dict[str, str], log: Path, port: int, marker: Path) -> None:
        self.remote = f"sc://127.0.0.1:{port}"  # what clients connect to
        self.marker = marker  # one line per start of the server's task Python
        self._command, self._env, self._log, self._port = command, env, log, port
        self.process = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        with open(self._log, "ab") as logs:
            process = subprocess.Popen(self._command, env=self._env, stdout=logs, stderr=logs, start_new_session=True)
        deadline = time.monotonic() + 120
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self._port)) == 0:
                    return process
            if process.poll() is not None or time.monotonic() > deadline:
                self.process = process
                self.stop()
                raise AssertionError("the Connect server did not start: " + self._log.read_text()[-3000:])
            time.sleep(0.5)

    def restart(self) -> None:
        self.stop()
        self.process = self._start()

    def stop(self) -> None:
        import signal

        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(30)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)


@contextmanager
def connect_server(directory: Path, full_python: bool = False) -> Iterator[ConnectServer]:
    """A Spark Connect server as pyspark's ``sbin/start-connect-server.sh`` starts one (its jar ships in
    ``pyspark/jars``), ``local[2]`` inside, its task Python the numpy+pyarrow-only venv; stopped afterwards.
    ``full_python``: its Python is this one instead (with drainpipe and the store drivers), and it has the Kafka
    connector (``spark.jars.packages``), as streaming through
    Connect needs: Spark runs the ``foreachBatch`` function in the server's Python."""
    import pyspark

    from drainpipe.spark.kafka import connector_package

    if full_python:
        python, marker = sys.executable, directory / "no-marker"
    else:
        python, marker = executor_python(directory)
    port = free_port()
    # what sbin/start-connect-server.sh --wait does (PySpark's package has that script from 4.3 on only)
    home = Path(pyspark.__file__).parent
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOG_DIR": str(directory / "logs"),
           "SPARK_PID_DIR": str(directory), "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": python,
           "SPARK_NO_DAEMONIZE": "1", "SPARK_CONNECT_MODE": "0"}  # fmt: skip
    command = ["bash", str(home / "sbin" / "spark-daemon.sh"), "submit",
               "org.apache.spark.sql.connect.service.SparkConnectServer", "1",
               "--name", "Spark Connect server", "--master", "local[2]",
               "--conf", f"spark.connect.grpc.binding.port={port}",
               "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
               "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=8",
               *(["--conf", f"spark.jars.packages={connector_package()}"] if full_python else [])]  # fmt: skip
    server = ConnectServer(command, env, directory / "connect.log", port, marker)
    try:
        yield server
    finally:
        server.stop()

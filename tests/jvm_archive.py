"""The tests' Spark JVMs map the class-data archive of :mod:`drainpipe.spark.jvm_archive` (the one ``make install``
builds: a local session and its first job, 9 s -> 4 s on the 2-core test machine), with C1-only compilation
(``-XX:TieredStopAtLevel=1``), which helps such short jobs too.

The tests start a JVM over and over: each ``drainpipe run --engine spark`` or ``stream`` subprocess, the standalone
cluster's master, worker and executors, the Connect server and its restarts. ``tests/conftest.py`` gives
:func:`java_options` to every one, through Spark's launcher variables (``SPARK_SUBMIT_OPTS`` for drivers and the
Connect server, ``SPARK_DAEMON_JAVA_OPTS`` for the master and worker) and ``spark.executor.defaultJavaOptions``.
``make test`` builds the archive first (``python tests/jvm_archive.py``), as the install does, and fetches the Kafka
connector's jars into Ivy's cache (:func:`fetch_kafka_connector`): the tests run on two workers, and two JVMs
resolving the same packages into an empty cache at once can trip over each other's downloads."""

from __future__ import annotations

from drainpipe.spark.jvm_archive import build
from drainpipe.spark.jvm_archive import java_options as archive_options


def java_options() -> str | None:
    """The JVM options the tests' Spark JVMs get, or None when the archive has not been built."""
    options = archive_options()
    return None if options is None else f"{options} -XX:TieredStopAtLevel=1"


def fetch_kafka_connector() -> None:
    """Resolve the Kafka connector (``spark.jars.packages``) once, as the tests' Spark JVMs will: a local session
    that starts and stops (a few seconds once the jars are cached)."""
    import shutil
    import sys

    from pyspark.sql import SparkSession

    from drainpipe.spark.kafka import connector_package

    if shutil.which("java") is None:  # (as the archive: no Java, no Spark tests to serve)
        print("no java: the Kafka connector is not fetched", file=sys.stderr)
        return
    session = (
        SparkSession.builder.master("local[1]")
        .config("spark.jars.packages", connector_package())
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    session.stop()


if __name__ == "__main__":
    print(build())
    fetch_kafka_connector()

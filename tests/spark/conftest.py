"""Spark test set-up: one local[2] SparkSession for all the Spark test modules, in one JVM (PySpark starts it once
per process), which has the Kafka connector from the start: packages are only resolved when the JVM starts."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from drainpipe.spark.kafka import connector_package
from jvm_archive import java_options

JVM_OPTIONS = java_options()
#: small and quiet: two cores, 8 shuffle partitions, no UI
TEST_CONF = {
    "spark.sql.shuffle.partitions": "8",
    "spark.driver.memory": "2g",
    "spark.ui.enabled": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.jars.packages": connector_package(),
    **({"spark.executor.defaultJavaOptions": JVM_OPTIONS} if JVM_OPTIONS else {}),  # (tests/jvm_archive.py)
}


@pytest.fixture(scope="package")
def spark() -> Iterator[object]:
    """A local[2] SparkSession for the Spark tests, stopped after them. (One per module cost each module a new
    SparkContext and its first jobs' warm-up, 2-3 s, for nothing: the tests keep no state in the session; each
    writes its own store and checkpoint.)"""
    from drainpipe.spark import spark_session

    session = spark_session("local[2]", TEST_CONF, app_name="drainpipe-tests")
    yield session
    session.stop()

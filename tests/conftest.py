"""Shared fixtures. PostgreSQL: the server `make test` starts (scripts/postgres.sh), named by DRAINPIPE_TEST_PG.

The clock: a test whose data have fixed timestamps says which clock it runs under, ``@pytest.mark.clock_at(
"2026-11-21T12:00:00Z")`` (drainpipe's clock stands there, in the test's process and in every process it starts); a
test whose data are placed relative to "now" reads drainpipe's clock (:func:`drainpipe.pipeline.now_ms`, never
``time.time()``) and says so with ``@pytest.mark.clock``. ``make test`` runs the ``clock`` tests a second time with the
whole clock a year ahead and once a year behind (``DRAINPIPE_CLOCK=+365d``, ``-365d``): none may depend on the day it
runs (a ``clock_at`` test cannot: its clock stands where it says). The few that compare with a process whose clock
cannot be moved (a real Prometheus) are marked ``wall_clock(reason)``, and listed as skipped in those runs.

``make test`` runs the suite on two worker processes (pytest-xdist), a test file per worker at a time, then the tests
marked ``exclusive`` alone: they stop or restart the broker or PostgreSQL, which every other test shares, or hold
tight bounds on latency. Under several workers an ``exclusive`` test is skipped, with that reason. Each worker has a
PostgreSQL database of its own (``drainpipe_test_<worker>``), so that one worker's open transactions never hold
back the vacuum of the other's tables.

Every test gets its own schema (dropped afterwards), selected through the URL's libpq ``options``, so tests never
see each other's tables. Without DRAINPIPE_TEST_PG the tests marked ``postgres`` are skipped; without
DRAINPIPE_TEST_KAFKA (the broker `make test` starts, scripts/kafka.sh) those marked ``kafka``.
"""

from __future__ import annotations

import os
import urllib.parse
import uuid
from collections.abc import Iterator

import pytest

from drainpipe.pipeline.clock import clock_setting, using_clock
from jvm_archive import java_options

PG_ENV = "DRAINPIPE_TEST_PG"

#: every Spark JVM the tests start maps the class archive `make test` built (tests/jvm_archive.py): drivers and the
#: Connect server through spark-submit, the standalone master and worker through spark-class; executors get it from
#: the tests' conf (tests/spark/conftest.py)
JVM_OPTIONS = java_options()
if JVM_OPTIONS:
    for variable in ("SPARK_SUBMIT_OPTS", "SPARK_DAEMON_JAVA_OPTS"):
        os.environ[variable] = f"{os.environ.get(variable, '')} {JVM_OPTIONS}".strip()


KAFKA_ENV = "DRAINPIPE_TEST_KAFKA"


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker and os.environ.get(PG_ENV):
        # a database of its own per worker: a database's open transactions hold back the vacuum of its every table
        # (the retention tests measure table sizes), and advisory locks are a database's (a store keys its own by
        # its schema, but a hash of the name). Set before any test reads it, so the processes tests start inherit
        # it too
        os.environ[PG_ENV] = _worker_database(os.environ[PG_ENV], f"drainpipe_test_{worker}")


def _worker_database(url: str, name: str) -> str:
    """``url`` with its database ``name``, created if missing."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as con:
        if con.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is None:
            con.execute(f'CREATE DATABASE "{name}"')
    return urllib.parse.urlunsplit(urllib.parse.urlsplit(url)._replace(path=f"/{name}"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        # a test that stops the broker or PostgreSQL would fail what the other workers run meanwhile
        alone = pytest.mark.skip(
            reason="needs the machine or a shared service to itself: run it alone (make test does)"
        )
        for item in items:
            if item.get_closest_marker("exclusive") is not None:
                item.add_marker(alone)
    if clock_setting():
        # a run on a moved clock (make test's shifted runs): a test that must see the wall clock cannot follow it
        for item in items:
            if (exempt := item.get_closest_marker("wall_clock")) is not None:
                item.add_marker(pytest.mark.skip(reason=f"runs on the wall clock: {exempt.args[0]}"))
    for marker, env, what in (("postgres", PG_ENV, "a private PostgreSQL"), ("kafka", KAFKA_ENV, "a Kafka broker")):
        if os.environ.get(env):
            continue
        skip = pytest.mark.skip(reason=f"{env} is not set (make test starts {what} and sets it)")
        for item in items:
            if item.get_closest_marker(marker) is not None:  # (not keywords: they hold the directory's name)
                item.add_marker(skip)


def with_schema(url: str, schema: str) -> str:
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query)
    query.append(("options", f"-csearch_path={schema}"))
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A URL whose tables live in a fresh schema of the test server."""
    yield from _fresh_schema()


@pytest.fixture
def other_pg_url() -> Iterator[str]:
    """A URL of another fresh schema of the same database as :func:`pg_url`'s (another store beside it)."""
    yield from _fresh_schema()


def _fresh_schema() -> Iterator[str]:
    import psycopg

    base = os.environ[PG_ENV]
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(base, autocommit=True) as con:
        con.execute(f"CREATE SCHEMA {schema}")
    try:
        yield with_schema(base, schema)
    finally:
        try:
            with psycopg.connect(base, autocommit=True, connect_timeout=10) as con:
                # a failed test may leave a process holding locks in the schema (a member it paused): give up on the
                # schema rather than hang the suite
                con.execute("SET lock_timeout = '10s'")
                con.execute(f"DROP SCHEMA {schema} CASCADE")
        except psycopg.Error:
            pass


@pytest.fixture(autouse=True)
def _the_tests_clock(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test marked ``clock_at("INSTANT")`` runs with drainpipe's clock standing at that instant, here and in the
    processes it starts; any other runs on the clock the run was given (the wall clock, or a shifted one)."""
    marker = request.node.get_closest_marker("clock_at")
    if marker is None:
        yield
        return
    with using_clock(marker.args[0]):
        yield


@pytest.fixture(scope="module")
def servers() -> str:
    """The Kafka broker `make test` starts (``host:port``), warmed (kafka_testlib)."""
    from kafka_testlib import warm_broker

    return warm_broker()


@pytest.fixture
def no_member_left() -> Iterator[None]:
    """After the test, end the traffic it started and kill every ``drainpipe consume`` member it started that still
    runs (kafka_testlib)."""
    from kafka_testlib import end_traffic, kill_members

    yield
    end_traffic()
    kill_members()


@pytest.fixture(autouse=True)
def _a_live_broker(request: pytest.FixtureRequest) -> None:
    """Before a test marked ``kafka``: the broker scripts/kafka.sh started for the run is up, or is started again, with
    a warning that quotes the end of its log (a broker that died must cost the test it died in, not every test after
    it, and the run's report must say why it died)."""
    if request.node.get_closest_marker("kafka") is None or not os.environ.get(KAFKA_ENV):
        return
    from kafka_testlib import revive_broker

    revive_broker()

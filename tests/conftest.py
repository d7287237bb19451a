"""Shared fixtures. PostgreSQL: the server `make test` starts (scripts/postgres.sh), named by DRAINPIPE_TEST_PG.

Every test gets its own schema (dropped afterwards), selected through the URL's libpq ``options``, so tests never
see each other's tables. Without DRAINPIPE_TEST_PG the tests marked ``postgres`` are skipped.
"""

from __future__ import annotations

import os
import urllib.parse
import uuid
from collections.abc import Iterator

import pytest

PG_ENV = "DRAINPIPE_TEST_PG"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(PG_ENV):
        return
    skip = pytest.mark.skip(reason=f"{PG_ENV} is not set (make test starts a private PostgreSQL and sets it)")
    for item in items:
        if "postgres" in item.keywords:
            item.add_marker(skip)


def with_schema(url: str, schema: str) -> str:
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query)
    query.append(("options", f"-csearch_path={schema}"))
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A URL whose tables live in a fresh schema of the test server."""
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
                con.execute(f"DROP SCHEMA {schema} CASCADE")
        except psycopg.Error:
            pass

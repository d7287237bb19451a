"""The Kafka tests' fixtures (kafka_testlib): the warmed broker, and no member left running after a test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kafka_testlib import kill_members, warm_broker


@pytest.fixture(scope="module")
def servers() -> str:
    return warm_broker()


@pytest.fixture(autouse=True)
def no_member_left() -> Iterator[None]:
    yield
    kill_members()

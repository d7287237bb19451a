"""Spark actions run from the driver, their failures mapped to drainpipe's errors at this one boundary.

A task that raised :class:`~drainpipe.errors.InputError` (a corrupt input file) fails the action with that error
and its one line; any other failure of Spark or of the bridge to its JVM becomes
:class:`~drainpipe.errors.SparkJobError` with the last line Spark gave.

Thread-safety: as the session's own calls (the driver's job thread).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa

from drainpipe.errors import InputError, SparkJobError

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame

__all__ = ["collect", "local_iterator", "run"]

T = TypeVar("T")

_INPUT_ERROR = re.compile(r"(?:drainpipe\.errors\.)?InputError: (.+)")


@contextlib.contextmanager
def _mapped() -> Iterator[None]:
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    try:
        yield
    except (PySparkException, Py4JError) as exc:
        text = str(exc)
        found = _INPUT_ERROR.findall(text)
        if found:
            raise InputError(found[-1].strip()) from exc
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        raise SparkJobError(f"spark job failed: {lines[-1] if lines else type(exc).__name__}") from exc


def run(action: Callable[[], T]) -> T:
    """``action()``, a Spark action (a job), with its failure mapped (see the module docstring)."""
    with _mapped():
        return action()


def collect(frame: DataFrame) -> pa.Table:
    """``frame.toArrow()``, its failure mapped."""
    with _mapped():
        return frame.toArrow()


def local_iterator(frame: DataFrame) -> Iterator[Any]:
    """``frame.toLocalIterator()`` (one partition fetched at a time), its failure mapped."""
    with _mapped():
        yield from frame.toLocalIterator(prefetchPartitions=False)

"""Every exception drainpipe raises on purpose, in one tree.

::

    DrainpipeError                      base: catch this to catch them all
    ├── ConfigError (ValueError)        a queue configuration, policy or handler registration is invalid
    ├── QueueError (RuntimeError)       the queue cannot do that now: it is shut down, or its name is taken
    ├── UsageError (ValueError)         a command-line option or argument is wrong
    ├── InputError (ValueError)         an input cannot be read: missing file, unmatched glob, unknown format,
    │                                   a file that is not what its name says (corrupt gzip or Parquet, no CSV header)
    ├── DefinitionError (ValueError)    a metric definition or definitions file is invalid
    ├── StoreError (ValueError)         a store cannot be opened, written or queried
    │   ├── StoreUnavailable            a store write failed for a reason that may pass (server restarting,
    │                                   connection lost): the engine retries it with backoff
    │   └── Fenced                      a commit carried a fencing token older than the store's: another writer
    │                                   owns that part now (a Kafka partition moved); nothing of it was written
    ├── SparkSetupError (ValueError)    Spark cannot run here: no usable Java or pyspark
    ├── SparkJobError (ValueError)      a Spark job failed for a reason other than its input
    ├── StatsError                      ``drainpipe stats`` cannot read the server
    ├── OtlpError (ValueError)          a body or file line is not an OTLP trace export at all
    ├── LogFull                         the serve write-ahead log cannot take a record now (budget used, disk full)
    ├── Rejected (ValueError)           a record fails validation (control flow inside the readers: its ``reason``
    │                                   goes to the dead letter; it never reaches a caller)
    ├── ChannelClosed (EOFError)        the other end of a helper process's channel is gone (it died or closed)
    └── RequestRefused                  ``drainpipe serve`` answers a request with an error: ``status`` and ``message``
        ├── BadBody                     the body cannot be accepted (400, 411, 413, 501)
        └── IngestRefused               no room for the request now (429/503 with ``retry_after``)

Every message is one line that says what is wrong and, where it helps, what to do. The ``ValueError`` and
``RuntimeError`` bases keep the contracts that name those builtins (a bad ``BatchQueueConfig`` raises
``ValueError``, a call on a shut-down queue ``RuntimeError``).

The ``drainpipe`` command prints a :class:`DrainpipeError` as one line (``drainpipe: error: ...``) and exits 2.
Any other exception reaching it is a bug in drainpipe: it prints the traceback and says so.

Per-record validation failures are not exceptions a caller sees: they are rejects, counted and written to the
dead letter with a reason.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "DrainpipeError",
    "ConfigError",
    "QueueError",
    "UsageError",
    "InputError",
    "DefinitionError",
    "StoreError",
    "StoreUnavailable",
    "Fenced",
    "SparkSetupError",
    "SparkJobError",
    "StatsError",
    "OtlpError",
    "RemoteWriteError",
    "LogFull",
    "Rejected",
    "ChannelClosed",
    "RequestRefused",
    "BadBody",
    "IngestRefused",
    "first_line",
]


class DrainpipeError(Exception):
    """The base of every error drainpipe raises on purpose; the message is one line."""


class ConfigError(DrainpipeError, ValueError):
    """A queue configuration, policy or handler registration is invalid; the message names the bad field."""


class QueueError(DrainpipeError, RuntimeError):
    """The queue cannot do that now: it is shut down, or (``BatchQueueManager.create``) its name is taken."""


class UsageError(DrainpipeError, ValueError):
    """A command-line option or argument is wrong (a mistake the user can fix)."""


class InputError(DrainpipeError, ValueError):
    """An input problem reported as one clear line: missing file, unmatched glob, unknown format, unreadable
    (corrupt) file, a CSV without its header. Per-record problems are never raised: they are rejects."""


class DefinitionError(DrainpipeError, ValueError):
    """A metric definition (or definitions file) is invalid."""


class StoreError(DrainpipeError, ValueError):
    """A store cannot be opened, written or queried."""


class StoreUnavailable(StoreError):
    """A store write failed for a reason that may pass (connection lost, server restarting): retry later."""


class Fenced(StoreError):
    """A commit carried a fencing token older than the one the store issued since: the part (a Kafka partition) has
    another owner now. The transaction wrote nothing."""


class SparkSetupError(DrainpipeError, ValueError):
    """Spark cannot run here (no usable Java, no pyspark); the message says what to do."""


class SparkJobError(DrainpipeError, ValueError):
    """The Spark job failed for a reason other than the input."""


class StatsError(DrainpipeError):
    """The server could not be read."""


class OtlpError(DrainpipeError, ValueError):
    """A body that is not an OTLP trace export at all (undecodable protobuf, invalid JSON): one line."""


class RemoteWriteError(DrainpipeError):
    """A remote-write receiver could not take a request now (unreachable, 5xx, 429): the samples stay unsent and are
    sent again later. ``retry_after_s``: the receiver's own delay, when it gave one."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class LogFull(DrainpipeError):
    """The log cannot take a record now: its byte budget is used up (the store is behind) or the disk is full."""


class Rejected(DrainpipeError, ValueError):
    """A record fails validation; ``reason`` is its dead-letter reason (short, low-cardinality). Raised by the
    validation rules and caught by the readers, which count and write the record: never raised to a caller."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ChannelClosed(DrainpipeError, EOFError):
    """The other end of a helper process's channel is gone (it exited, was killed, or closed the channel)."""


class RequestRefused(DrainpipeError):
    """A request the server answers with an error: ``status`` (an HTTP status) and a one-line ``message``.

    The HTTP and gRPC front ends map it, at one place each, to their answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:  # the constructor's arguments are not ``args``
        return (type(self), (self.status, self.message))


class BadBody(RequestRefused):
    """A body that cannot be accepted (400 malformed, 411/413/501 framing and size): nothing was taken from it."""


class IngestRefused(RequestRefused):
    """No room for a request now: answer ``status`` (429 or 503) with ``Retry-After: retry_after``."""

    def __init__(self, status: int, message: str, retry_after: int) -> None:
        super().__init__(status, message)
        self.retry_after = retry_after

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.status, self.message, self.retry_after))


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (its class name when it has none): how a foreign exception (a database
    driver's, Spark's) becomes the one-line message of a drainpipe error."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

"""drainpipe's one notion of "now": the wall clock, unless a test or an operator sets another.

Everything that compares stored data with the present reads :func:`now_ms`: retention purges and the books' record
times (through :attr:`~drainpipe.pipeline.store.SqlStore.clock`, whose default it is), alert evaluation and
remote-write's final minutes (through the store's clock), the drill-down's and the dashboard's "last hours". Durations,
timeouts and rates do not: they use ``time.monotonic`` or ``time.perf_counter``, which no clock setting moves.

The clock is set in two ways, with one grammar:

* for a process **and the processes it starts**, by the environment variable ``DRAINPIPE_CLOCK`` (read once, when this
  module is imported), so that ``serve``, ``run`` and ``consume`` started by a test or a script follow it;
* inside a process, by :func:`set_clock` or the :func:`using_clock` context manager, which also sets the variable for
  the children it starts from then on.

The grammar (:func:`parse_clock`):

================================ ==================================================================================
``+365d``, ``-12h``, ``+90m``    the wall clock shifted by a signed duration (units ``s m h d w``): it runs on
``2026-11-21T10:00:00Z``         an instant (ISO-8601, as ``--from``/``--to`` take it, or epoch ms): the clock stands
``1795255200000``                still there, so a test with fixed timestamps reads the same "now" on every day
empty or unset                   the wall clock
================================ ==================================================================================

A value that does not parse is refused with one line (:class:`~drainpipe.errors.DefinitionError`) when the module is
imported: a process told to run at a time it cannot read must not run at the wall clock instead.

Thread-safety: :func:`now_ms` reads one module global (a tuple swapped whole by :func:`set_clock`); no lock.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import DefinitionError
from .retention import parse_duration
from .times import parse_time_ms

__all__ = ["CLOCK_ENV", "now_ms", "parse_clock", "set_clock", "using_clock", "clock_setting"]

#: the environment variable that sets the clock of a process and of those it starts
CLOCK_ENV = "DRAINPIPE_CLOCK"

#: (shift in ms, or None for a frozen clock; the frozen instant in ms, or None) with the setting's text
_Setting = tuple[int | None, int | None, str]

_WALL: _Setting = (0, None, "")


def parse_clock(text: str) -> _Setting:
    """A clock setting (the module's grammar) as (shift ms or None, frozen instant ms or None, the text).

    Raises :class:`~drainpipe.errors.DefinitionError` with one line when the text is not a setting."""
    value = text.strip()
    if not value:
        return _WALL
    if value[0] in "+-":
        try:
            shift = parse_duration(value[1:], f"{CLOCK_ENV} {text!r}")
        except DefinitionError:
            shift = None
        if shift is None:  # "forever" is no shift
            raise DefinitionError(f"{CLOCK_ENV}={text!r}: expected a signed duration like +365d or -12h, or an instant")
        return (-shift if value[0] == "-" else shift), None, value
    try:
        frozen = int(value) if value.isdigit() else parse_time_ms(value)
    except Exception:
        raise DefinitionError(
            f"{CLOCK_ENV}={text!r}: expected an instant like 2026-11-21T10:00:00Z or epoch ms, or a shift like +365d"
        ) from None
    return None, frozen, value


_setting: _Setting = parse_clock(os.environ.get(CLOCK_ENV, ""))


def now_ms() -> int:
    """Epoch milliseconds of "now" by drainpipe's clock. Never blocks; thread-safe."""
    shift, frozen, _ = _setting
    if shift is None:
        return frozen  # type: ignore[return-value]
    return int(time.time() * 1000) + shift


def clock_setting() -> str:
    """The clock's setting as its text ("" for the wall clock), as a child process would be given it."""
    return _setting[2]


def set_clock(text: str) -> None:
    """Sets this process's clock, and ``DRAINPIPE_CLOCK`` for the processes it starts from now on ("" restores the
    wall clock). Raises :class:`~drainpipe.errors.DefinitionError` when the text is not a setting."""
    global _setting
    setting = parse_clock(text)
    _setting = setting
    if setting[2]:
        os.environ[CLOCK_ENV] = setting[2]
    else:
        os.environ.pop(CLOCK_ENV, None)


@contextmanager
def using_clock(text: str) -> Iterator[None]:
    """:func:`set_clock` for the ``with`` block, the previous setting restored after it (not for use by two threads
    at once: the setting is the process's)."""
    before = clock_setting()
    set_clock(text)
    try:
        yield
    finally:
        set_clock(before)

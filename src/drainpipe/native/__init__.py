"""drainpipe's native tiers in one place: which C extensions this process has, and which fast paths are in use.

Every C extension but the queue core's is built from this package and imported here only. Each has a Python path
beside it giving the same results (held equal by tests), which runs where the extension is not built (a Spark
executor imports drainpipe from a zip of its Python modules) or is turned off. Callers ask this module at the time
of the call, never keep an extension of their own::

    from drainpipe import native

    scan = native.jsonscan        # the C extension module, or None: not built here, or turned off
    if native.enabled("columnar"):
        ...

Tiers (:data:`TIERS`; :func:`tiers` lists them with what runs without each, ``python -m drainpipe.native`` prints
that list):

* C extensions: ``fastpath`` (the queue's hot paths, ``drainpipe._fastpath``: required, reported only), ``lines``,
  ``jsonscan``, ``csvscan``, ``logscan``, ``otlpjson``, ``otlpproto``, ``spanmap``, ``groupstates``, ``crc32`` (only
  on a CPU with carry-less multiplication: zlib's CRC is the faster one without);
* Python paths that can be turned off: ``columnar`` (the text formats read in columns, by their C scanner or else by
  pyarrow; off, every block goes to the per-record reference reader) and ``threads`` (pyarrow's thread pool in the
  JSON Lines reader; worker and parser processes turn it off: the processes are the parallelism).

Turning tiers off (tests and benchmarks forcing the Python path; a process that wants no threads)::

    with native.disabled("jsonscan"):           # this block, and the processes started in it
        ...
    native.disable("threads")                   # for the rest of this process

``DRAINPIPE_NATIVE_OFF`` (comma-separated tier names) turns tiers off for a process and every process it starts:
:func:`disabled` sets it for its block, so worker processes see the same tiers whether forked or spawned.

**From a zip** (a Spark executor runs drainpipe from the zip the job ships, :func:`drainpipe.spark.session.code_zip`,
which holds the built extensions): a shared object cannot load from a zip, so on import this package extracts the
extensions built for this interpreter (``importlib.machinery.EXTENSION_SUFFIXES``) to the local temp directory,
once per content (a directory named by their digest, made atomically), and puts that directory first on its
``__path__``: the imports below then find them as on an install. An extension built for another Python, platform or
C library does not import, and its tier falls back; :data:`missing` says why (the task reports it to the driver).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import os
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType

from ..errors import UsageError

#: why a C extension is not here ("" when every one imports): the first import error, or what the zip lacks
missing = ""


def _unzipped_extensions() -> list[str]:
    """When this package is imported from a zip: the directory its extensions for this interpreter were extracted
    to (see the module docstring), else []."""
    global missing
    archive = getattr(globals().get("__loader__"), "archive", None)  # a zipimport.zipimporter's file
    if archive is None:
        return []
    prefix = __name__.replace(".", "/") + "/"
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    with zipfile.ZipFile(archive) as z:
        shipped = [i for i in z.infolist() if i.filename.startswith(prefix) and "/" not in i.filename[len(prefix) :]
                   and i.filename.endswith((".so", ".pyd"))]  # fmt: skip
        ours = [i for i in shipped if i.filename.endswith(suffixes)]
        if not ours:
            missing = (f"the shipped code has no extensions built for this Python ({suffixes[0]}; shipped: "
                       f"{sorted({i.filename.rsplit('.', 2)[-2] for i in shipped}) or 'none'})")  # fmt: skip
            return []
        digest = hashlib.sha256(b"".join(f"{i.filename}:{i.CRC}:{i.file_size};".encode() for i in ours))
        target = os.path.join(tempfile.gettempdir(), f"drainpipe-native-{digest.hexdigest()[:16]}")
        if not os.path.isdir(target):
            staging = f"{target}.{os.getpid()}.tmp"
            os.makedirs(staging, exist_ok=True)
            for info in ours:
                with open(os.path.join(staging, info.filename[len(prefix) :]), "wb") as f:
                    f.write(z.read(info))
            try:
                os.rename(staging, target)  # atomic: another task's extraction may have won meanwhile
            except OSError:
                for name in os.listdir(staging):
                    os.unlink(os.path.join(staging, name))
                os.rmdir(staging)
    return [target]


def _missing(exc: ImportError) -> None:
    """An extension did not import: remember the first reason (an install without a build says nothing)."""
    global missing
    if not missing and getattr(globals().get("__loader__"), "archive", None) is not None:
        missing = f"{exc.name or 'an extension'}: {exc}"


__path__[:0] = _unzipped_extensions()  # extracted extensions first: the imports below find them

# The extensions, each bound to its public name while it is on (None when it is not built or turned off). mypy
# types each by its stub beside its source.
try:
    from . import _lines as lines
except ImportError as exc:
    lines = None  # type: ignore[assignment]
    _missing(exc)
try:
    from . import _jsonscan as jsonscan
except ImportError as exc:
    jsonscan = None  # type: ignore[assignment]
    _missing(exc)
try:
    from . import _csvscan as csvscan
except ImportError as exc:
    csvscan = None  # type: ignore[assignment]
    _missing(exc)
try:
    from . import _logscan as logscan
except ImportError as exc:
    logscan = None  # type: ignore[assignment]
    _missing(exc)
try:
    from . import _otlpjson as otlpjson
except ImportError as exc:
    otlpjson = None  # type: ignore[assignment]
    _missing(exc)
try:
    from . import _otlpproto as otlpproto
except ImportError as exc:
    otlpproto = None  # type: ignore[assignment]
    _missing(exc)
try:
    from . import _spanmap as spanmap
except ImportError as exc:
    spanmap = None  # type: ignore[assignment]
    _missing(exc)
try:
    from . import _groupstates as groupstates
except ImportError as exc:
    groupstates = None  # type: ignore[assignment]
    _missing(exc)
try:
    from . import _crc32 as crc32
except ImportError:  # (also on a CPU without carry-less multiplication: zlib's is the faster path there)
    # not recorded in ``missing``: the log's CRC is no tier of a Spark task's, and its absence is no fallback of one
    crc32 = None  # type: ignore[assignment]
try:  # the queue core's (its modules import it themselves: it is required, and only reported here)
    from .. import _fastpath
except ImportError:  # a Spark executor's zip: the queue is never loaded there
    _fastpath = None  # type: ignore[assignment]

__all__ = [
    "ENV",
    "missing",
    "TIERS",
    "Tier",
    "available",
    "crc32",
    "csvscan",
    "disable",
    "disabled",
    "enabled",
    "groupstates",
    "jsonscan",
    "lines",
    "logscan",
    "otlpjson",
    "otlpproto",
    "report",
    "spanmap",
    "tiers",
]

#: the environment variable naming the tiers turned off in a process and the processes it starts
ENV = "DRAINPIPE_NATIVE_OFF"


@dataclass(frozen=True)
class Tier:
    """One tier: ``native`` (a C extension) or a Python path; ``built`` (importable here; a Python path always is);
    ``enabled`` (built and not turned off); ``required`` (cannot be turned off); what it does and what runs
    without it."""

    name: str
    native: bool
    built: bool
    enabled: bool
    required: bool
    does: str
    without: str


#: name -> (native, required, what it does, what runs without it)
_SPECS: dict[str, tuple[bool, bool, str, str]] = {
    "fastpath": (True, True, "the queue's per-item hot paths (drainpipe._fastpath)", "nothing: the queue needs it"),
    "lines": (True, False, "the n-th newline of a byte range (cutting line files into blocks and parts)", "numpy"),
    "jsonscan": (True, False, "JSON Lines blocks straight into Arrow columns", "pyarrow.json, else line by line"),
    "csvscan": (True, False, "CSV record ends and cells into columns", "numpy's quote parity, pyarrow's reader"),
    "logscan": (True, False, "access-log lines into columns by a format's program", "pyarrow with the format's RE2"),
    "otlpjson": (True, False, "OTLP JSON lines into span columns", "json and pyarrow (inputs.span_json)"),
    "otlpproto": (True, False, "OTLP protobuf exports into span columns", "protobuf, then ptars (inputs.span_columns)"),
    "spanmap": (True, False, "the OTLP span mapping's per-span pass", "numpy (inputs._spanmap_fallback)"),
    "groupstates": (True, False, "aggregation's group ids, states and histograms", "numpy (pipeline.aggregate)"),
    "crc32": (True, False, "the write-ahead log's CRC-32 by carry-less multiplication", "zlib.crc32"),
    "columnar": (False, False, "text formats read in columns (a C scanner, else pyarrow)", "the per-record readers"),
    "threads": (False, False, "pyarrow's thread pool in the JSON Lines reader", "the calling thread only"),
}
#: every tier's name, the C extensions first
TIERS: tuple[str, ...] = tuple(_SPECS)
_BUILT: dict[str, ModuleType | None] = {
    "fastpath": _fastpath,
    "lines": lines,
    "jsonscan": jsonscan,
    "csvscan": csvscan,
    "logscan": logscan,
    "otlpjson": otlpjson,
    "otlpproto": otlpproto,
    "spanmap": spanmap,
    "groupstates": groupstates,
    "crc32": crc32,
}
_off: frozenset[str] = frozenset()
#: the tiers in use here (built and not off): what :func:`enabled` asks, once per block of a reader
_on: frozenset[str] = frozenset(n for n in TIERS if _BUILT.get(n, True) is not None)


def _names(names: tuple[str, ...] | list[str]) -> frozenset[str]:
    unknown = [n for n in names if n not in _SPECS]
    if unknown:
        raise UsageError(f"unknown native tier {', '.join(unknown)} (tiers: {', '.join(TIERS)})")
    required = [n for n in names if _SPECS[n][1]]
    if required:
        raise UsageError(f"the {', '.join(required)} tier cannot be turned off: drainpipe has no Python path for it")
    return frozenset(names)


def _set(off: frozenset[str]) -> None:
    """Turn exactly ``off`` off: rebind the extensions' names, and tell the processes this one starts."""
    global _off, _on
    _off = off
    _on = frozenset(n for n in TIERS if n not in off and _BUILT.get(n, True) is not None)
    names = globals()
    for name, module in _BUILT.items():
        if name != "fastpath":
            names[name] = None if name in off else module
    if off:
        os.environ[ENV] = ",".join(sorted(off))
    else:
        os.environ.pop(ENV, None)


def enabled(name: str) -> bool:
    """Whether tier ``name`` is in use here: built, and not turned off."""
    if name in _on:
        return True
    if name not in _SPECS:
        raise UsageError(f"unknown native tier {name} (tiers: {', '.join(TIERS)})")
    return False


def available() -> frozenset[str]:
    """The tiers built in this process (the C extensions that import, and the Python paths), whether on or off."""
    return frozenset(n for n in TIERS if _BUILT.get(n, True) is not None)


def tiers() -> tuple[Tier, ...]:
    """Every tier, with whether it is built and on here."""
    built = available()
    return tuple(Tier(n, native, n in built, enabled(n), required, does, without)
                 for n, (native, required, does, without) in _SPECS.items())  # fmt: skip


def disable(*names: str) -> None:
    """Turn tiers off for the rest of this process (and the processes it starts from now)."""
    _set(_off | _names(names))


@contextmanager
def disabled(*names: str) -> Iterator[None]:
    """Turn tiers off for the block (in this process, and in the processes started in it): the callers take their
    Python path. The tiers that were off before stay off after."""
    before = _off
    _set(before | _names(names))
    try:
        yield
    finally:
        _set(before)


def report() -> str:
    """The tiers as a table of text: name, kind, state, what each does and what runs without it."""
    rows = [
        (t.name, "C" if t.native else "Python", "on" if t.enabled else "off" if t.built else "not built", t.does,
         "required" if t.required else t.without)
        for t in tiers()
    ]  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[4] for r in rows)


_at_start = [n for n in os.environ.get(ENV, "").replace(" ", "").split(",") if n]
if _at_start:
    _set(_names(_at_start))

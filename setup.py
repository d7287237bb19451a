"""Build the C extensions (the queue's per-item hot paths; and in ``drainpipe.native``, the optional ones: the JSON
Lines scanner, the access-log scanner, the CSV record scanner, the line formats' newline finder, the OTLP JSON and protobuf
scanners, the OTLP span mapping's per-span pass, the aggregation's group ids and states, the log's CRC-32); everything else is in pyproject.toml.
"""
from setuptools import Extension, setup

_FLAGS = ["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers",
          "-Wno-cast-function-type"]
_NATIVE = "src/drainpipe/native"  # every optional extension: drainpipe.native is the one module importing them
_NUMBERS = [f"{_NATIVE}/_numbers.h"]  # JSON numbers, for every scanner that reads them
# the event columns the JSON and CSV scanners fill
_COLUMNS = [f"{_NATIVE}/_columns.h", f"{_NATIVE}/_hash.h", *_NUMBERS]
# the OTLP scanners' columns
_SPANS = [f"{_NATIVE}/{h}" for h in ("_hash.h", "_spancols.h", "_spanrules.h", "_spanevents.h")]


def _native(name: str, depends: list[str] | None = None) -> Extension:
    return Extension(f"drainpipe.native.{name}", [f"{_NATIVE}/{name}.c"], depends=depends or [],
                     extra_compile_args=_FLAGS)


setup(ext_modules=[Extension("drainpipe._fastpath", ["src/drainpipe/_fastpath.c"], extra_compile_args=_FLAGS),
                   _native("_jsonscan", _COLUMNS),
                   _native("_spanmap", [f"{_NATIVE}/_spanrules.h"]),
                   _native("_logscan"),
                   _native("_csvscan", _COLUMNS),
                   _native("_lines"),
                   _native("_groupstates", [f"{_NATIVE}/_strings.h", f"{_NATIVE}/_hash.h"]),
                   _native("_otlpjson", [*_SPANS, *_NUMBERS]),
                   _native("_otlpproto", _SPANS),
                   _native("_crc32")])

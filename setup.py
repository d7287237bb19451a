"""Build the C extensions (the queue's per-item hot paths, the JSON Lines scanner, the access-log scanner, the CSV
record scanner, the line formats' newline finder, the OTLP JSON scanner, the OTLP span mapping's per-span pass, the
aggregation's group ids and states); everything else is in pyproject.toml."""
from setuptools import Extension, setup

_FLAGS = ["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers",
          "-Wno-cast-function-type"]
_NUMBERS = ["src/drainpipe/inputs/_numbers.h"]  # JSON numbers, for every scanner that reads them
_COLUMNS = ["src/drainpipe/inputs/_columns.h", *_NUMBERS]  # the event columns the JSON and CSV scanners fill

setup(ext_modules=[Extension("drainpipe._fastpath", ["src/drainpipe/_fastpath.c"], extra_compile_args=_FLAGS),
                   Extension("drainpipe.inputs._jsonscan", ["src/drainpipe/inputs/_jsonscan.c"], depends=_COLUMNS,
                             extra_compile_args=_FLAGS),
                   Extension("drainpipe.inputs._spanmap", ["src/drainpipe/inputs/_spanmap.c"],
                             extra_compile_args=_FLAGS),
                   Extension("drainpipe.inputs._logscan", ["src/drainpipe/inputs/_logscan.c"],
                             extra_compile_args=_FLAGS),
                   Extension("drainpipe.inputs._csvscan", ["src/drainpipe/inputs/_csvscan.c"], depends=_COLUMNS,
                             extra_compile_args=_FLAGS),
                   Extension("drainpipe.inputs._lines", ["src/drainpipe/inputs/_lines.c"], extra_compile_args=_FLAGS),
                   Extension("drainpipe.pipeline._groupstates", ["src/drainpipe/pipeline/_groupstates.c"],
                             extra_compile_args=_FLAGS),
                   Extension("drainpipe.inputs._otlpjson", ["src/drainpipe/inputs/_otlpjson.c"], depends=_NUMBERS,
                             extra_compile_args=_FLAGS)])

"""Build the one C extension (the queue's per-item hot paths); everything else is in pyproject.toml."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("drainpipe._fastpath", ["src/drainpipe/_fastpath.c"],
                             extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                                 "-Wno-missing-field-initializers", "-Wno-cast-function-type"])])

"""The Python daemon of a local session's executors: pyspark's own (``pyspark.daemon``), started so that it and
the workers it forks import pyspark from this interpreter's install, compiled once, instead of from Spark's zips.

Spark starts ``python -m <spark.python.daemon.module>`` with ``pyspark.zip`` and ``py4j-*.zip`` first on the path.
Python caches no bytecode of what it imports from a zip, so the daemon compiled pyspark's modules at every start
(0.42 s) and each worker it forked compiled the worker's (pyspark.worker, the Arrow serializers) again, before
its first task. :func:`~drainpipe.spark.session.spark_session` names this module for a local master whose workers
run this interpreter, where those zips are copies of the installed pyspark. It takes them off the path, imports
the worker's modules once before forking (pure Python: no thread, the daemon's rule), forgets drainpipe's own
modules (tasks import drainpipe from the zip the job ships, as every executor does) and runs pyspark's daemon.
"""

from __future__ import annotations

import importlib.util
import os
import runpy
import sys

__all__ = ["installed_copies", "main"]


def installed_copies(path: list[str]) -> list[str]:
    """The entries of ``path`` that are zips inside an installed pyspark (``<site>/pyspark/python/lib/*.zip``)
    whose ``<site>`` is on ``path`` too: the same modules, importable with their bytecode. py4j's zip counts only
    when py4j is installed beside it."""
    found = []
    for entry in path:
        lib = os.path.dirname(entry)
        package = os.path.dirname(os.path.dirname(lib))
        site = os.path.dirname(package)
        if not (entry.endswith(".zip") and os.path.basename(package) == "pyspark" and site in path):
            continue
        name = "pyspark" if os.path.basename(entry) == "pyspark.zip" else "py4j"
        if os.path.isfile(os.path.join(site, name, "__init__.py")):
            found.append(entry)
    return found


def _found_beside(entry: str) -> bool:
    """Whether the package ``entry`` (a zip of :func:`installed_copies`) holds is now imported from the install the
    zip sits in, not from some other copy earlier on the path (which might not be the JVM's version)."""
    name = "pyspark" if os.path.basename(entry) == "pyspark.zip" else "py4j"
    site = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(entry))))
    spec = importlib.util.find_spec(name)
    return spec is not None and spec.origin == os.path.join(site, name, "__init__.py")


def main() -> None:
    copies = installed_copies(sys.path)
    kept = list(sys.path)
    for entry in copies:
        sys.path.remove(entry)
    if not all(_found_beside(entry) for entry in copies):  # another copy comes first on the path: Spark's zips
        sys.path[:] = kept
    import pyspark.worker  # noqa: F401  (before the fork: every worker has it)

    for name in [m for m in sys.modules if m == "drainpipe" or m.startswith("drainpipe.")]:
        del sys.modules[name]
    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()

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

import importlib.machinery
import os
import runpy
import sys

__all__ = ["installed_copies", "without_installed_copies", "main"]


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


def without_installed_copies(path: list[str]) -> list[str]:
    """``path`` without the zips of :func:`installed_copies`, when each zip's package is then found in the install
    the zip sits in; ``path`` as it is when another copy of pyspark or py4j would come first (it might not be the
    JVM's version)."""
    copies = installed_copies(path)
    rest = [entry for entry in path if entry not in copies]
    for entry in copies:
        name = "pyspark" if os.path.basename(entry) == "pyspark.zip" else "py4j"
        site = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(entry))))
        spec = importlib.machinery.PathFinder.find_spec(name, rest)  # (the path alone, not what is imported)
        if spec is None or spec.origin != os.path.join(site, name, "__init__.py"):
            return list(path)
    return rest


def main() -> None:
    sys.path[:] = without_installed_copies(sys.path)
    import pyspark.worker  # noqa: F401  (before the fork: every worker has it)

    for name in [m for m in sys.modules if m == "drainpipe" or m.startswith("drainpipe.")]:
        del sys.modules[name]
    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()

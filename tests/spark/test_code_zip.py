"""The task code a Spark job ships to executors that have nothing of drainpipe installed
(:func:`drainpipe.spark.session.code_zip`)."""

from __future__ import annotations

import importlib.util
import zipfile
import zipimport

from drainpipe.spark.session import code_zip


def test_the_shipped_modules_carry_their_bytecode_and_an_executor_imports_it() -> None:
    """Python caches no bytecode of what it imports from a zip, so each module's comes in the zip beside its source
    (hash-based, unchecked): an executor's worker loads it instead of compiling the module."""
    path = code_zip()
    with zipfile.ZipFile(path) as z:
        names = set(z.namelist())
        header = z.read("drainpipe/spark/tasks.pyc")[:8]
    sources = {n for n in names if n.endswith(".py")}
    assert sources and {n[:-3] + ".pyc" for n in sources} <= names
    assert header == importlib.util.MAGIC_NUMBER + (1).to_bytes(4, "little")
    code = zipimport.zipimporter(f"{path}/drainpipe/spark/").get_code("tasks")
    assert code.co_filename == "drainpipe/spark/tasks.py"  # (compiled from the source, it would name the zip)

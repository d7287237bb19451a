"""The class-data archive a local Spark session maps (drainpipe/spark/jvm_archive.py): where it is looked for, and
that a session's launcher options name it once it exists (a JVM that cannot map it starts as it would have)."""

from __future__ import annotations

from pathlib import Path

import pytest
from spark_testlib import SPARK

from drainpipe.spark import jvm_archive

pytestmark = SPARK


def test_the_options_name_the_archive_once_it_is_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(jvm_archive.ARCHIVE_DIR_ENV, str(tmp_path))
    path = jvm_archive.archive_path()
    assert path.parent == tmp_path and path.name.startswith("spark-") and path.suffix == ".jsa"
    assert jvm_archive.java_options() is None  # not built here: nothing to map
    path.write_bytes(b"")
    options = jvm_archive.java_options()
    assert options is not None and f"-XX:SharedArchiveFile={path}" in options and "-Xlog:cds=off" in options


def test_each_pyspark_install_names_its_own_archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A JVM maps an archive only on the class path it was dumped with: a second virtual environment on the machine
    (its own pyspark, its own jars) must build its own, not find the first one's and start without it."""
    import pyspark

    monkeypatch.setenv(jvm_archive.ARCHIVE_DIR_ENV, str(tmp_path))
    here = jvm_archive.archive_path()
    monkeypatch.setattr(pyspark, "__file__", str(tmp_path / "other-venv" / "pyspark" / "__init__.py"))
    other = jvm_archive.archive_path()
    assert other != here and other.parent == here.parent

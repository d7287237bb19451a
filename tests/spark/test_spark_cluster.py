"""The Spark engine on a real standalone cluster (tests/spark/cluster.py): executors in their own processes and
working directories, with their own Python that has nothing of ours installed. With a relative input path, the
results equal the local engine's; the tasks ran in the executors' Python (checked), importing drainpipe from the
zip the job shipped, its C extensions extracted and loaded there (the native tier, checked)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cluster import connect_server, standalone_cluster
from spark_testlib import SPARK, skewed_inputs

from conftest import JVM_OPTIONS
from drainpipe.inputs import head_of, node_of
from drainpipe.pipeline.definitions import default_definitions
from drainpipe.pipeline.generator import generate_events, write_events
from drainpipe.pipeline.run import run_local
from drainpipe.pipeline.store import open_store
from testlib import assert_same_results

pytestmark = SPARK
HERE = Path(__file__).parent


def finished(proc: subprocess.Popen[str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """A process started with pipes, waited for, as ``subprocess.run`` returns it (killed after ``timeout``)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with standalone_cluster(tmp_path_factory.mktemp("cluster")) as c:
        yield c


def test_a_relative_input_on_a_standalone_cluster_equals_the_local_engine(cluster, tmp_path: Path) -> None:
    write_events(generate_events(30_000, services=12, seed=5), tmp_path / "events.jsonl")
    with (tmp_path / "events.jsonl").open("a") as f:
        f.write('{"ts": 1, "service": ""}\nnot json\n')
    local = f"duckdb:///{tmp_path / 'local.duckdb'}"
    starts_before = cluster.marker.read_text().count("\n") if cluster.marker.exists() else 0
    job = subprocess.Popen(
        [sys.executable, "-m", "drainpipe.cli", "run", "-q", "--engine", "spark", "--spark-master", cluster.master,
         "--spark-conf", f"spark.pyspark.python={cluster.python}", "--spark-conf", "spark.driver.host=127.0.0.1",
         "--spark-conf", "spark.executor.cores=1", "--spark-conf", "spark.executor.memory=1g",
         *(["--spark-conf", f"spark.executor.defaultJavaOptions={JVM_OPTIONS}"] if JVM_OPTIONS else []),
         "--input", "events.jsonl", "--store", "duckdb:///spark.duckdb", "--dead-letter", "spark.jsonl"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    # the reference while the job's driver starts
    summary = run_local([str(tmp_path / "events.jsonl")], definitions=default_definitions(), store_url=local,
                        dead_letter=str(tmp_path / "local.jsonl"))  # fmt: skip
    done = finished(job)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.splitlines()[0].startswith(f"read {summary.read:,} = accepted {summary.accepted:,}")
    # the tasks ran in the executors' own Python (the wrapper recorded its starts), not the driver's
    assert cluster.marker.exists() and cluster.marker.read_text().count("\n") > starts_before
    # ... which had nothing of ours installed, and ran the C extensions the job shipped in its zip
    assert any("Spark executors ran the native tier" in line for line in done.stdout.splitlines()), done.stdout
    assert_same_results(local, f"duckdb:///{tmp_path / 'spark.duckdb'}", default_definitions())


@pytest.fixture(scope="module")
def connect(tmp_path_factory: pytest.TempPathFactory):
    with connect_server(tmp_path_factory.mktemp("connect")) as c:
        yield c


def test_the_same_job_through_spark_connect(connect, tmp_path: Path) -> None:
    """No SparkContext, no accumulators, no RDDs on the client: the DataFrame job runs on the server, whose task
    Python has nothing of ours; drainpipe reaches it as an artifact."""
    write_events(generate_events(20_000, services=8, seed=9), tmp_path / "events.jsonl")
    local = f"duckdb:///{tmp_path / 'local.duckdb'}"
    job = subprocess.Popen(
        [sys.executable, "-m", "drainpipe.cli", "run", "-q", "--engine", "spark", "--spark-remote", connect.remote,
         "--input", "events.jsonl", "--store", "duckdb:///connect.duckdb", "--dead-letter", "connect.jsonl"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    summary = run_local(
        [str(tmp_path / "events.jsonl")],
        definitions=default_definitions(),
        store_url=local,
        dead_letter=str(tmp_path / "local.jsonl"),
    )
    done = finished(job)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.splitlines()[0].startswith(f"read {summary.read:,} = accepted {summary.accepted:,}")
    assert connect.marker.exists()  # the server's tasks ran in the venv without drainpipe
    # the artifact carried the C extensions: the server's executors ran them
    assert any("Spark executors ran the native tier" in line for line in done.stdout.splitlines()), done.stdout
    assert_same_results(local, f"duckdb:///{tmp_path / 'connect.duckdb'}", default_definitions())


@pytest.fixture(scope="module")
def connect_full(tmp_path_factory: pytest.TempPathFactory):
    with connect_server(tmp_path_factory.mktemp("connect-full"), full_python=True) as c:
        yield c


def test_a_stream_through_spark_connect_equals_the_local_engine(connect_full, tmp_path: Path) -> None:
    """``drainpipe stream --spark-remote``: the foreachBatch function runs on the Connect server, opens the store
    there for each micro-batch and hands its totals back through the session; relative paths are resolved on the
    client. A rerun finds nothing new. The store equals the local engine's and the summary counts every event."""
    (tmp_path / "in").mkdir()
    for i in range(2):
        write_events(generate_events(10_000, services=6, seed=20 + i), tmp_path / "in" / f"part{i}.jsonl")
    with (tmp_path / "in" / "part1.jsonl").open("a") as f:
        f.write("not json\n")
    local = f"duckdb:///{tmp_path / 'local.duckdb'}"
    inputs = sorted(str(p) for p in (tmp_path / "in").iterdir())
    command = [sys.executable, "-m", "drainpipe.cli", "stream", "-q", "--spark-remote", connect_full.remote,
               "--input", "in", "--store", "duckdb:///connect.duckdb", "--checkpoint", "ck", "--trigger-once"]  # fmt: skip
    job = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    summary = run_local(
        inputs, definitions=default_definitions(), store_url=local, dead_letter=str(tmp_path / "local.jsonl")
    )
    done = finished(job)
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"read {summary.read:,} = accepted {summary.accepted:,} + rejected 1" in done.stdout, done.stdout
    assert_same_results(local, f"duckdb:///{tmp_path / 'connect.duckdb'}", default_definitions())
    again = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-4000:]
    assert_same_results(local, f"duckdb:///{tmp_path / 'connect.duckdb'}", default_definitions())
    assert (tmp_path / "connect.rejected.jsonl").read_text().count("\n") == 1


def test_a_stream_on_the_cluster_survives_a_killed_driver(cluster, tmp_path: Path) -> None:
    """Structured Streaming on the standalone cluster, one file per micro-batch (JSON Lines with bad lines, gzipped
    CSV, Parquet); the driver is killed (SIGKILL) right after micro-batch 1 reached the store, before Spark could
    mark it committed in its checkpoint (the worst moment for exactly once): two files are stored, one not. Restarted
    from the checkpoint, batch 1 runs again and changes nothing, then the rest: the store equals the local engine's
    over the same files, and the dead letter holds each reject once."""
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    jsonl, csv_gz, parquet = skewed_inputs(tmp_path / "source", events=16_000)
    for i, path in enumerate((jsonl, csv_gz, parquet)):
        os.replace(path, incoming / f"part-{i}{''.join(Path(path).suffixes)}")
    files = sorted(str(p) for p in incoming.iterdir())
    local = f"duckdb:///{tmp_path / 'local.duckdb'}"
    url = f"duckdb:///{tmp_path / 'stream.duckdb'}"
    args = [sys.executable, str(HERE / "stream_child.py"), str(incoming), url, str(tmp_path / "ckpt"),
            str(tmp_path / "stream.jsonl")]  # fmt: skip
    child = subprocess.Popen([*args, "1", cluster.master, cluster.python], cwd=HERE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    expected = run_local(
        files, definitions=default_definitions(), store_url=local, dead_letter=str(tmp_path / "local.jsonl")
    )
    assert expected.rejected >= 12
    killed = finished(child)
    assert killed.returncode == -9 and "batch 1 stored" in killed.stdout, killed.stdout + killed.stderr[-3000:]
    with open_store(url) as store:
        applied = [bool(store.progress("file", head=head_of(f), node=node_of(f))) for f in files]
    assert sum(applied) == 2, applied  # Spark takes files oldest first: which two is its choice
    resumed = subprocess.run([*args, "-1", cluster.master, cluster.python], cwd=HERE, capture_output=True,
                             text=True, timeout=600)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads(resumed.stdout.split("summary ", 1)[1])
    assert (summary["batches"], summary["unchanged_files"], summary["files"]) == (2, 1, 2), summary
    assert_same_results(local, url, default_definitions())
    assert (tmp_path / "stream.jsonl").read_text().count("\n") == expected.rejected  # each reject once


@pytest.mark.kafka
@pytest.mark.usefixtures("no_member_left")
def test_a_kafka_stream_killed_on_the_cluster_and_through_connect_stores_what_consume_stores(
    cluster, connect_full, servers: str, tmp_path: Path
) -> None:
    """``drainpipe stream --bootstrap-servers`` killed (SIGKILL) right after micro-batch 0 reached the store and
    before Spark marked it committed, then restarted from its checkpoint, twice side by side: on the standalone
    cluster (its executors, with nothing of ours, get the connector from the driver; the driver is killed), and
    through Spark Connect (the query runs on the server, started with the connector: the server's JVM is killed,
    then restarted on its port, then the stream). Both stores equal the one ``drainpipe consume`` fills from the
    same topic, and both dead letters hold its rejects once."""
    import threading

    from kafka_testlib import consume, finish, new_topic, produce, rejected

    topic = new_topic(servers, 2)
    produce(servers, topic, 3_000, seed=6)  # with the poison messages
    reference = f"duckdb:///{tmp_path / 'consume.duckdb'}"
    member = consume(servers, topic, f"g-{topic}", reference, tmp_path / "consume.jsonl", "--exit-at-end")

    def child(name: str, kill_after: int, *master: str) -> list[str]:
        return [sys.executable, str(HERE / "stream_child.py"), f"kafka://{servers}/{topic}",
                f"duckdb:///{tmp_path / name}.duckdb", str(tmp_path / f"ck-{name}"), str(tmp_path / f"{name}.jsonl"),
                str(kill_after), *master]  # fmt: skip

    def in_the_window(name: str) -> bool:  # batch 0 planned, not marked committed: Spark will run it again
        return (tmp_path / f"ck-{name}/offsets/0").exists() and not (tmp_path / f"ck-{name}/commits/0").exists()

    outcome: dict[str, Any] = {}

    def through_connect() -> None:
        try:
            client = subprocess.Popen(child("connect", 0, connect_full.remote), cwd=HERE, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True)  # fmt: skip
            connect_full.process.wait(600)  # killed by the batch's Python on the server
            client.kill()  # (its client retries a dead server for minutes)
            outcome["killed"] = in_the_window("connect"), client.communicate()[0][-3000:]
            connect_full.restart()
            outcome["resumed"] = subprocess.run(child("connect", -1, connect_full.remote), cwd=HERE,
                                                capture_output=True, text=True, timeout=600)  # fmt: skip
        except BaseException as exc:  # (reported by the test's thread)
            outcome["error"] = exc

    side = threading.Thread(target=through_connect)
    side.start()  # side by side: each is mostly a driver starting
    killed = subprocess.run(child("cluster", 0, cluster.master, cluster.python), cwd=HERE, capture_output=True,
                            text=True, timeout=600)  # fmt: skip
    assert killed.returncode == -9 and "batch 0 stored" in killed.stdout, killed.stdout + killed.stderr[-3000:]
    assert in_the_window("cluster")
    resumed = subprocess.run(child("cluster", -1, cluster.master, cluster.python), cwd=HERE, capture_output=True,
                             text=True, timeout=600)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    side.join(900)
    finish(member)  # the reference, read meanwhile
    assert "error" not in outcome, outcome.get("error")
    assert outcome["killed"][0], outcome["killed"][1]
    assert outcome["resumed"].returncode == 0, outcome["resumed"].stderr[-3000:]
    for name in ("cluster", "connect"):
        assert_same_results(reference, f"duckdb:///{tmp_path / name}.duckdb", default_definitions())
        assert rejected(tmp_path / f"{name}.jsonl") == rejected(tmp_path / "consume.jsonl"), name

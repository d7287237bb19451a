"""Runs a stream and kills itself (SIGKILL, no clean-up) right after micro-batch ``kill_after`` reached the store,
before Spark could mark that batch committed in the checkpoint: the worst moment for exactly-once.

    python stream_child.py INPUT STORE_URL CHECKPOINT DEAD_LETTER KILL_AFTER [MASTER EXECUTOR_PYTHON]

INPUT: a directory (one file per micro-batch), or ``kafka://HOST:PORT/TOPIC`` (100 messages per micro-batch).

KILL_AFTER -1: run to the end, and print the summary as JSON (a line starting ``summary``). MASTER/EXECUTOR_PYTHON: a standalone cluster and its executors' Python (default
``local[2]`` and this interpreter); or MASTER ``sc://HOST:PORT``, a Spark Connect server: the query and its
``foreachBatch`` run there, so the kill is of the server (its JVM, then the batch's Python), which the test restarts.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # tests/ (jvm_archive, for the conftest's TEST_CONF)
from conftest import TEST_CONF
from drainpipe.spark import KafkaTopics, run_stream


def main(input_dir: str, store_url: str, checkpoint: str, dead_letter: str, kill_after: str,
         master: str = "local[2]", python: str = "") -> None:  # fmt: skip
    kill_at = int(kill_after)

    def on_batch(batch_id: int, summary: dict[str, Any]) -> None:  # (under Connect: pickled, run on the server)
        print(f"batch {batch_id} stored: {summary.get('accepted', 0)} events", flush=True)
        if batch_id == kill_at:
            pid = os.getpid()
            while pid > 1:  # under Connect: the server's JVM, an ancestor of this Python
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"SparkConnectServer" in f.read():
                        os.kill(pid, signal.SIGKILL)
                        break
                with open(f"/proc/{pid}/stat") as f:
                    pid = int(f.read().rsplit(")", 1)[1].split()[1])
            os.kill(os.getpid(), signal.SIGKILL)

    source: Any = input_dir
    conf = {**TEST_CONF, **({"spark.pyspark.python": python} if python else {})}
    if input_dir.startswith("kafka://"):
        servers, topic = input_dir.removeprefix("kafka://").split("/", 1)
        source = KafkaTopics.at(servers, [topic], max_messages=100)
    else:  # files need no Kafka connector: resolving it (Ivy) and shipping its jars to each executor cost seconds
        del conf["spark.jars.packages"]
    remote = master if master.startswith("sc://") else None
    summary = run_stream(
        source,
        store_url=store_url,
        checkpoint=checkpoint,
        dead_letter=dead_letter,
        master="local[2]" if remote else master,
        remote=remote,
        conf=conf,
        trigger_once=True,
        max_files_per_trigger=1,
        on_batch=on_batch,
    )
    print("summary", json.dumps(summary, default=str), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])

"""The write-ahead log on its own: positions, segments, group commit, torn tails and damage, release, the byte
budget, a full disk, one process per directory; and the memory log's same interface."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from drainpipe.errors import DrainpipeError, LogFull
from drainpipe.inputs import EventBatch
from drainpipe.server import wal as wal_module
from drainpipe.server.wal import MAGIC, SUFFIX, MemoryLog, WriteAheadLog
from testlib import event_batch


def rows(n: int, tag: int = 0) -> pa.RecordBatch:
    return event_batch(
        {"ts": 1_700_000_000_000 + i, "service": f"s{tag}", "instance": None, "endpoint": None, "latency_ms": float(i)}
        for i in range(n)
    )


def batch(n: int, tag: int = 0) -> EventBatch:
    return EventBatch.of(rows(n, tag))


def read_all(log, position: int = 0) -> list[tuple[int, EventBatch]]:
    reader = log.reader(position)
    out = []
    while chunk := reader.read(7):
        out += chunk
    reader.close()
    return out


def tags(records) -> list[str]:
    return [b.rows.column("service")[0].as_py() for _, b in records]


def test_records_come_back_in_order_across_segments_with_growing_positions(tmp_path: Path) -> None:
    log = WriteAheadLog(tmp_path, segment_bytes=4096)
    ends = [log.append(batch(20, i)) for i in range(40)]
    assert ends == sorted(ends) and len(set(ends)) == 40 and log.end == ends[-1]
    assert len(list(tmp_path.glob("*" + SUFFIX))) > 3  # rolled over
    records = read_all(log)
    assert [e for e, _ in records] == ends and tags(records) == [f"s{i}" for i in range(40)]
    assert records[5][1] == batch(20, 5)
    # a reader resumes after any position, and follows what is appended later
    assert tags(read_all(log, ends[9])) == [f"s{i}" for i in range(10, 40)]
    reader = log.reader(log.end)
    assert reader.read(10) == []
    log.append(batch(3, 99))
    assert tags(reader.read(10)) == ["s99"]
    log.close()
    reopened = WriteAheadLog(tmp_path, segment_bytes=4096)  # the same log after a restart
    assert reopened.key == log.key and reopened.end == log.end and reopened.repair.bytes == 0
    assert tags(read_all(reopened)) == [f"s{i}" for i in range(40)] + ["s99"]
    reopened.close()


def test_concurrent_appends_share_fsyncs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    syncs = [0]
    real = os.fdatasync

    def counting(fd: int) -> None:
        syncs[0] += 1
        real(fd)

    monkeypatch.setattr(wal_module.os, "fdatasync", counting)
    log = WriteAheadLog(tmp_path)
    ends: list[int] = []
    lock = threading.Lock()

    def writer(k: int) -> None:
        for i in range(50):
            end = log.append(batch(10, k * 1000 + i))
            with lock:
                ends.append(end)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(ends)) == 400
    assert syncs[0] < 400  # group commit: fewer syncs than appends
    records = read_all(log)
    assert sorted(tags(records)) == sorted(f"s{k * 1000 + i}" for k in range(8) for i in range(50))
    log.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(1, 40), min_size=1, max_size=12), cut=st.floats(0, 1), damage=st.booleans())
def test_a_torn_or_damaged_tail_is_cut_and_a_prefix_of_the_records_survives(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], cut: float, damage: bool
) -> None:
    """Whatever happens to the last segment's tail (cut at any byte, or a byte flipped), reopening never fails,
    keeps exactly the records before the damage, and appends go on after them."""
    d = tmp_path_factory.mktemp("wal")
    log = WriteAheadLog(d)
    ends = [log.append(batch(n, i)) for i, n in enumerate(sizes)]
    log.close()
    (segment,) = d.glob("*" + SUFFIX)
    data = bytearray(segment.read_bytes())
    at = len(MAGIC) + int(cut * (len(data) - len(MAGIC)))
    if damage and at < len(data):
        data[at] ^= 0xFF
    else:
        del data[at:]
    segment.write_bytes(bytes(data))
    reopened = WriteAheadLog(d)
    kept = [e for e in ends if e <= at - len(MAGIC)]
    assert reopened.end == (kept[-1] if kept else 0)
    assert tags(read_all(reopened)) == [f"s{i}" for i in range(len(kept))]
    assert reopened.repair.bytes == len(data) - len(MAGIC) - reopened.end
    assert (reopened.repair.records > 0) == (reopened.repair.bytes > 0)
    reopened.append(batch(2, 77))
    assert tags(read_all(reopened))[-1] == "s77"
    reopened.close()


def test_release_deletes_applied_segments_but_never_the_active_one(tmp_path: Path) -> None:
    log = WriteAheadLog(tmp_path, segment_bytes=2048)
    ends = [log.append(batch(20, i)) for i in range(30)]
    segments = len(list(tmp_path.glob("*" + SUFFIX)))
    log.release(ends[14])
    left = len(list(tmp_path.glob("*" + SUFFIX)))
    assert 1 < left < segments and log.start <= ends[14]
    assert tags(read_all(log, ends[14])) == [f"s{i}" for i in range(15, 30)]
    log.release(log.end)
    assert len(list(tmp_path.glob("*" + SUFFIX))) == 1 and log.size == 0
    log.close()
    assert WriteAheadLog(tmp_path).end == ends[-1]  # positions go on from where they were


def test_the_byte_budget_refuses_with_log_full(tmp_path: Path) -> None:
    log = WriteAheadLog(tmp_path, max_bytes=20_000)
    with pytest.raises(LogFull, match="write-ahead log full"):
        for i in range(1000):
            log.append(batch(50, i))
    n = len(read_all(log))
    assert 0 < n < 1000 and log.size <= 20_000
    log.release(log.end)  # the store caught up: room again
    assert log.size == 0
    log.append(batch(50, 0))
    log.close()


def test_a_full_disk_refuses_the_write_and_leaves_no_partial_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = WriteAheadLog(tmp_path)
    log.append(batch(10, 1))
    real_write = os.write
    calls = [0]

    def full(fd: int, data) -> int:
        calls[0] += 1
        if calls[0] == 1:
            return real_write(fd, bytes(data[:100]))  # part of it went to disk, then the disk filled up
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(wal_module.os, "write", full)
    with pytest.raises(LogFull, match="No space left"):
        log.append(batch(10, 2))
    monkeypatch.setattr(wal_module.os, "write", real_write)
    log.append(batch(10, 3))  # room again: the log goes on, without the failed record
    assert tags(read_all(log)) == ["s1", "s3"]
    log.close()
    reopened = WriteAheadLog(tmp_path)
    assert reopened.repair.bytes == 0 and tags(read_all(reopened)) == ["s1", "s3"]
    reopened.close()


def test_one_process_per_log_directory(tmp_path: Path) -> None:
    log = WriteAheadLog(tmp_path)
    with pytest.raises(DrainpipeError, match=r"in use by another process \(pid \d+\); give each server its own"):
        WriteAheadLog(tmp_path)
    log.close()
    WriteAheadLog(tmp_path).close()  # released on close


def test_the_memory_log_has_the_same_interface() -> None:
    log = MemoryLog(max_bytes=rows(10).nbytes * 5)
    ends = [log.append(batch(10, i)) for i in range(5)]
    with pytest.raises(LogFull, match="in-memory buffer full"):
        log.append(batch(10, 5))
    assert tags(read_all(log, ends[1])) == ["s2", "s3", "s4"]
    log.release(ends[2])
    assert log.start == ends[2] and tags(read_all(log, ends[2])) == ["s3", "s4"]
    log.append(batch(10, 9))
    assert log.wait(ends[-1], 0) and tags(read_all(log, ends[-1])) == ["s9"]


def test_exit_rows_keep_their_mark_through_the_log(tmp_path: Path) -> None:
    """A batch with exit rows (an OTLP export's CLIENT statements) is written with its request row count and read
    back with it, across a restart; plain records beside it read as before."""
    marked = EventBatch.with_exits(rows(5, 1), rows(3, 2))
    assert marked.requests == 5 and marked.num_rows == 8
    log = WriteAheadLog(tmp_path)
    log.append(batch(4, 0))
    log.append(marked)
    log.close()
    reopened = WriteAheadLog(tmp_path)
    (_, plain), (_, back) = read_all(reopened)
    reopened.close()
    assert plain.requests == plain.num_rows == 4
    assert back.requests == 5 and back == marked

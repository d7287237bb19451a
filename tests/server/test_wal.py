"""The write-ahead log on its own: positions, segments, group commit, torn tails and damage, release, the byte
budget, a full disk, one process per directory; and the memory log's same interface."""

from __future__ import annotations

import errno
import os
import threading
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from drainpipe import native
from drainpipe.errors import DrainpipeError, LogFull
from drainpipe.inputs import EventBatch
from drainpipe.server import wal as wal_module
from drainpipe.server.wal import (
    HEADER,
    HEADER2,
    MAGIC,
    SEGMENT2,
    SPARE_SUFFIX,
    SPARES,
    SUFFIX,
    MemoryLog,
    Repair,
    WriteAheadLog,
)
from testlib import event_batch, wait_until


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
    head = SEGMENT2.size
    at = head + int(cut * (len(data) - head))
    flipped = damage and at < len(data)
    if flipped:
        data[at] ^= 0xFF
    else:
        del data[at:]
    segment.write_bytes(bytes(data))
    reopened = WriteAheadLog(d)
    kept = [e for e in ends if e <= at - head]
    assert reopened.end == (kept[-1] if kept else 0)
    assert tags(read_all(reopened)) == [f"s{i}" for i in range(len(kept))]
    if flipped and 8 <= at - head - reopened.end < HEADER2.size:
        # a record whose position is not where it stands reads as the end of a reused segment: cut, not counted
        assert reopened.repair == Repair()
    else:
        assert reopened.repair.bytes == len(data) - head - reopened.end
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


def test_a_record_larger_than_opening_the_log_reads_is_refused_not_acknowledged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opening a log cuts a record longer than MAX_RECORD as damage, so append refuses one (here MAX_RECORD is made
    small): an acknowledged record is never one that the next start would cut."""
    log = WriteAheadLog(tmp_path)
    log.append(batch(10, 1))
    small = len(b"".join(bytes(p) for p in batch(10, 2).encode_parts()))
    monkeypatch.setattr(wal_module, "MAX_RECORD", small + 100)
    with pytest.raises(LogFull, match="larger than the log takes"):
        log.append(batch(10, 2), batch(1000, 3))  # all or none: the small one is not logged either
    end = log.append(batch(10, 4))
    log.close()
    reopened = WriteAheadLog(tmp_path)
    assert reopened.repair.bytes == 0 and reopened.end == end and tags(read_all(reopened)) == ["s1", "s4"]
    reopened.close()


def test_batches_appended_together_are_records_of_one_group_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """append(a, b, c) writes a record each, in order, with one write and one fsync; a failed write fails all."""
    log = WriteAheadLog(tmp_path)
    syncs = [0]
    real_sync = os.fdatasync

    def counted(fd: int) -> None:
        syncs[0] += 1
        real_sync(fd)

    def broken(fd: int, buffers, offset: int) -> int:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(wal_module.os, "fdatasync", counted)
    end = log.append(batch(10, 1), batch(20, 2), batch(30, 3))
    assert syncs[0] == 1 and end == log.end
    records = read_all(log)
    assert tags(records) == ["s1", "s2", "s3"] and [b.num_rows for _, b in records] == [10, 20, 30]
    assert records[-1][0] == end
    monkeypatch.setattr(wal_module.os, "pwritev", broken)
    with pytest.raises(LogFull, match="I/O error"):
        log.append(batch(10, 4), batch(10, 5))
    assert log.end == end
    log.close()
    memory = MemoryLog()
    memory.append(batch(10, 1), batch(20, 2))
    assert tags(read_all(memory)) == ["s1", "s2"]


def test_a_record_queued_as_the_log_closes_is_refused_not_written_to_the_closed_descriptor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append queues its record, then waits for the flush lock; a close that takes the lock first closes the
    segment's descriptor, whose number the process may give to another file. The flush that follows fails the
    record (its append raises LogFull) and writes nothing. (The window is between append's two locks: the record is
    queued here by hand, as append does.)"""
    log = WriteAheadLog(tmp_path)
    log.append(batch(10, 1))
    ticket = wal_module._Ticket(batch(10, 2).encode_parts())
    log._queue.append(ticket)
    log.close()
    writes: list[int] = []
    monkeypatch.setattr(wal_module.os, "pwritev", lambda fd, buffers, offset: writes.append(fd) or 0)
    log._flush()
    assert writes == [] and isinstance(ticket.error, OSError) and ticket.error.errno == errno.EBADF and not ticket.end
    reopened = WriteAheadLog(tmp_path)
    assert reopened.repair.bytes == 0 and tags(read_all(reopened)) == ["s1"]
    reopened.close()


def test_a_full_disk_refuses_the_write_and_leaves_no_partial_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = WriteAheadLog(tmp_path)
    log.append(batch(10, 1))
    real_write = os.pwritev
    calls = [0]

    def full(fd: int, buffers, offset: int) -> int:
        calls[0] += 1
        if calls[0] == 1:
            return os.pwrite(fd, bytes(b"".join(buffers)[:100]), offset)  # part went to disk, then the disk filled
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(wal_module.os, "pwritev", full)
    with pytest.raises(LogFull, match="No space left"):
        log.append(batch(10, 2))
    assert calls[0] == 2
    monkeypatch.setattr(wal_module.os, "pwritev", real_write)
    log.append(batch(10, 3))  # room again: the log goes on, without the failed record
    assert tags(read_all(log)) == ["s1", "s3"]
    log.close()
    reopened = WriteAheadLog(tmp_path)
    assert reopened.repair.bytes == 0 and tags(read_all(reopened)) == ["s1", "s3"]
    reopened.close()


def test_short_writes_are_written_on_from_where_they_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = WriteAheadLog(tmp_path)
    real_write, taken = os.pwritev, []

    def short(fd: int, buffers, offset: int) -> int:  # the kernel takes 7 bytes at a time, across buffers' ends
        taken.append(len(buffers))
        return real_write(fd, [bytes(b"".join(buffers)[:7])], offset)

    monkeypatch.setattr(wal_module.os, "pwritev", short)
    _one_group(log, (1, 2, 3))
    monkeypatch.setattr(wal_module.os, "pwritev", real_write)
    assert len(taken) > 10 and max(taken) == 6  # a header and a payload per record, gathered
    log.append(batch(10, 4))
    assert sorted(tags(read_all(log))) == ["s1", "s2", "s3", "s4"]
    log.close()
    reopened = WriteAheadLog(tmp_path)
    assert reopened.repair.bytes == 0 and sorted(tags(read_all(reopened))) == ["s1", "s2", "s3", "s4"]
    reopened.close()


def _one_group(log: WriteAheadLog, tags: tuple[int, ...]) -> list[BaseException]:
    """Appends of ``tags`` from threads of their own, queued behind the flush lock so that they are written as one
    group; what each raised (nothing for those written)."""
    errors: list[BaseException] = []

    def append(tag: int) -> None:
        try:
            log.append(batch(10, tag))
        except BaseException as exc:  # the test reads it
            errors.append(exc)

    threads = [threading.Thread(target=append, args=(tag,)) for tag in tags]
    with log._flush_lock:
        for t in threads:
            t.start()
        wait_until(lambda: len(log._queue) == len(tags), what="the appends queued behind the flush lock")
    for t in threads:
        t.join(10)
    return errors


def test_a_group_that_failed_whole_leaves_no_record_that_a_later_one_could_uncover(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group of two records written whole, then its fsync failed: the next record is written where the group
    began. Had the group's bytes stayed, a next record as long as the group's first would end where the group's
    second begins, and that one (its position the one expected there, its CRC good) would come back at the next
    start though it was never acknowledged."""
    log = WriteAheadLog(tmp_path)
    log.append(batch(10, 1))
    real_sync = os.fdatasync
    monkeypatch.setattr(wal_module.os, "fdatasync", lambda fd: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
    errors = _one_group(log, (2, 3))
    assert len(errors) == 2 and all(isinstance(e, LogFull) for e in errors)
    monkeypatch.setattr(wal_module.os, "fdatasync", real_sync)
    log.append(batch(10, 4))  # as long as the failed group's first record
    log.close()
    reopened = WriteAheadLog(tmp_path)
    assert tags(read_all(reopened)) == ["s1", "s4"] and reopened.repair == Repair()
    reopened.close()


def test_released_segments_are_overwritten_and_a_restart_reads_only_the_new_records(tmp_path: Path) -> None:
    """Segments the store has applied become spares (at most SPARES), the next segments overwrite them, and their
    old records, still behind the new ones, are neither read nor taken for damage: a reopened log holds exactly
    what was not released, and no spare outlives the process."""
    log = WriteAheadLog(tmp_path, segment_bytes=8192)
    ends: list[int] = []
    names: dict[int, set[str]] = {}  # inode -> the names it had: a spare reused has had two segment names
    live = log.reader(0)  # follows the log as it is written, as the feeder does
    for i in range(120):
        ends.append(log.append(batch(5 + i % 30, i)))
        assert [(e, tags([(e, b)])[0]) for e, b in live.read(10)] == [(ends[-1], f"s{i}")]
        for p in tmp_path.glob("*" + SUFFIX):
            names.setdefault(p.stat().st_ino, set()).add(p.name)
        if i % 10 == 9:
            log.release(ends[i - 3])
            assert len(list(tmp_path.glob("*" + SPARE_SUFFIX))) <= SPARES
    assert sum(len(n) > 1 for n in names.values()) >= 3  # segments were written over spares
    bases = sorted(int(p.stem) for p in tmp_path.glob("*" + SUFFIX))
    old_tails = [b for b, nxt in zip(bases, [*bases[1:], log.end])
                 if (tmp_path / f"{b:020d}{SUFFIX}").stat().st_size > SEGMENT2.size + nxt - b]  # fmt: skip
    assert old_tails  # old records behind new ones: the reopen below must take them for the end
    start = log.start
    expected = [f"s{i}" for i, e in enumerate(ends) if e > start]
    assert tags(read_all(log, start)) == expected
    live.close()
    log.close()
    reopened = WriteAheadLog(tmp_path, segment_bytes=8192)
    assert reopened.end == ends[-1] and reopened.start == start and reopened.repair == Repair()
    assert tags(read_all(reopened, start)) == expected and not list(tmp_path.glob("*" + SPARE_SUFFIX))
    reopened.append(batch(3, 999))
    assert tags(read_all(reopened, start)) == [*expected, "s999"]
    reopened.close()


def test_a_renewed_log_reuses_no_segment_of_the_old_identity(tmp_path: Path) -> None:
    """Positions start over under a new identity: a spare of the old one has records at the very positions the new
    one expects, so it must not be written over (a restart would read the old records as new)."""
    log = WriteAheadLog(tmp_path, segment_bytes=4096)
    ends = [log.append(batch(20, 1)) for _ in range(12)]
    log.release(ends[3])  # the first segment, from position 0: a spare
    assert list(tmp_path.glob("*" + SPARE_SUFFIX))
    log.renew()
    log.append(batch(20, 2))
    log.close()
    reopened = WriteAheadLog(tmp_path, segment_bytes=4096)
    assert tags(read_all(reopened)) == ["s2"]
    reopened.close()


_APPENDER = """
import sys
sys.path.insert(0, sys.argv[3])
from testlib import event_batch, row
from drainpipe.inputs import EventBatch
from drainpipe.server.wal import WriteAheadLog

log = WriteAheadLog(sys.argv[1], segment_bytes=4096)
ends, i = [], int(sys.argv[2])
while True:
    rows = [row(service=f"s{i}", ts=1_700_000_000_000 + k) for k in range(5 + i % 20)]
    ends.append(log.append(EventBatch.of(event_batch(rows))))
    print(f"ack {i} {ends[-1]}", flush=True)
    if len(ends) % 7 == 0:  # the store has the records up to three ago
        print(f"releasing {ends[-4]}", flush=True)
        log.release(ends[-4])
    i += 1
"""


def test_kill_9_while_segments_are_reused_loses_no_acknowledged_record_and_brings_back_no_old_one(
    tmp_path: Path,
) -> None:
    """A process appends (small segments, released as it goes, so spares are overwritten) and is killed with
    SIGKILL after a random number of acknowledged records, six times over the same log. Every record acknowledged
    and not released is there, in order, once; nothing else is, but the one append a kill may have cut short."""
    import random
    import subprocess
    import sys

    rng = random.Random(7)
    acked: dict[int, int] = {}  # tag -> end position
    released, in_flight, start = 0, set(), 0
    for _ in range(6):
        child = subprocess.Popen([sys.executable, "-c", _APPENDER, str(tmp_path), str(start), str(Path(__file__).parents[1])],
                                 stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert child.stdout is not None
        want, seen = rng.randint(20, 120), 0
        for line in child.stdout:
            kind, *rest = line.split()
            if kind == "ack":
                acked[int(rest[0])] = int(rest[1])
                seen += 1
            else:
                released = max(released, int(rest[0]))
            if seen >= want:
                child.kill()  # (what it printed before it died is read on)
        child.wait()
        in_flight.add(max(acked) + 1)
        start = max(acked) + 2
    log = WriteAheadLog(tmp_path, segment_bytes=4096)
    present = [(end, int(b.rows.column("service")[0].as_py()[1:])) for end, b in read_all(log, 0)]
    log.close()
    assert log.repair.records <= 1  # the last kill's append at most: the reused segments' old records are no damage
    got = [tag for _, tag in present]
    assert got == sorted(set(got))  # in order, each once
    assert set(got) <= set(acked) | in_flight
    assert {t for t, end in acked.items() if end > released} <= set(got)
    assert all(acked.get(tag, end) == end for end, tag in present)  # each where it was acknowledged


def test_a_damaged_position_in_a_segment_before_the_last_is_damage_not_an_end(tmp_path: Path) -> None:
    """A record whose position field is damaged reads as the end of the segment (as a reused file's old record
    would): in a segment before the last one, that end falls short of the next segment, and the records lost are
    counted and logged, not dropped quietly."""
    log = WriteAheadLog(tmp_path, segment_bytes=4096)
    ends = [log.append(batch(20, i)) for i in range(12)]
    log.close()
    first = min(tmp_path.glob("*" + SUFFIX))
    data = bytearray(first.read_bytes())
    second = SEGMENT2.size + ends[1]  # the third record's header, in the first segment
    assert int(first.stem) == 0 and ends[2] < int(sorted(tmp_path.glob("*" + SUFFIX))[1].stem)
    data[second + 8] ^= 0x01  # a bit of its position
    first.write_bytes(bytes(data))
    reopened = WriteAheadLog(tmp_path, segment_bytes=4096)
    assert reopened.repair.records == 1 and reopened.repair.bytes > 0
    assert tags(read_all(reopened))[:2] == ["s0", "s1"] and "s2" not in tags(read_all(reopened))
    reopened.close()


def test_an_empty_header_is_no_record(tmp_path: Path) -> None:
    """Sixteen zero bytes at the start of a segment of base 0 (space a power loss left unwritten) are not a record
    of length 0 at position 0: the log is empty, and says what it cut."""
    log = WriteAheadLog(tmp_path)
    log.close()
    (segment,) = tmp_path.glob("*" + SUFFIX)
    segment.write_bytes(segment.read_bytes() + bytes(HEADER2.size))
    reopened = WriteAheadLog(tmp_path)
    assert reopened.end == 0 and reopened.repair.bytes == HEADER2.size and read_all(reopened) == []
    reopened.append(batch(2, 1))
    assert tags(read_all(reopened)) == ["s1"]
    reopened.close()


def test_a_failed_roll_over_fails_its_group_and_the_next_write_rolls_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new segment cannot be made: every request of the group is refused (none is answered as written), and
    once it can, the log goes on in a new segment."""
    log = WriteAheadLog(tmp_path, segment_bytes=2048)
    while log.end < 2048:
        log.append(batch(20, 1))
    real_fsync_dir = wal_module._fsync_dir
    monkeypatch.setattr(wal_module, "_fsync_dir", lambda path: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
    errors = _one_group(log, (2, 3))
    assert len(errors) == 2 and all(isinstance(e, LogFull) and "I/O error" in str(e) for e in errors)
    monkeypatch.setattr(wal_module, "_fsync_dir", real_fsync_dir)
    log.append(batch(10, 4))
    assert tags(read_all(log))[-1] == "s4" and "s2" not in tags(read_all(log))
    log.close()


def test_a_failed_write_that_cannot_be_cut_back_stops_the_log_until_it_is_opened_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The group's write failed and so did the cut: a later record written over it could uncover one of the
    failed group's, so nothing more is written; the next start cuts the tail as damage."""
    log = WriteAheadLog(tmp_path)
    log.append(batch(10, 1))
    real_sync, real_truncate = os.fdatasync, os.ftruncate
    monkeypatch.setattr(wal_module.os, "fdatasync", lambda fd: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
    monkeypatch.setattr(wal_module.os, "ftruncate", lambda fd, n: (_ for _ in ()).throw(OSError(errno.EIO, "no")))
    with pytest.raises(LogFull):
        log.append(batch(10, 2))
    monkeypatch.setattr(wal_module.os, "fdatasync", real_sync)
    monkeypatch.setattr(wal_module.os, "ftruncate", real_truncate)
    with pytest.raises(LogFull, match="restart"):
        log.append(batch(10, 3))
    log.close()
    reopened = WriteAheadLog(tmp_path)
    assert tags(read_all(reopened)) in (["s1"], ["s1", "s2"])  # s2's bytes may have reached the disk: unacknowledged
    reopened.close()


def _format1_segment(directory: Path, batches: list[EventBatch]) -> list[int]:
    """A segment as the release before format 2 wrote it; the records' end positions."""
    data, ends = bytearray(MAGIC), []
    for b in batches:
        payload = bytes(b.encode())
        data += HEADER.pack(len(payload), zlib.crc32(payload)) + payload
        ends.append(len(data) - len(MAGIC))
    (directory / f"{0:020d}{SUFFIX}").write_bytes(bytes(data))
    return ends


def test_an_empty_format_1_segment_keeps_its_position(tmp_path: Path) -> None:
    """An old log whose only segment holds its header alone (the rest released): the log goes on from that
    segment's position, not from 0 (which a store that applied the log would take for another log)."""
    (tmp_path / f"{5000:020d}{SUFFIX}").write_bytes(MAGIC)
    log = WriteAheadLog(tmp_path)
    assert (log.start, log.end) == (5000, 5000)
    assert log.append(batch(2, 1)) > 5000 and tags(read_all(log, 5000)) == ["s1"]
    log.close()


def test_a_log_of_format_1_is_read_and_goes_on_in_format_2(tmp_path: Path) -> None:
    ends = _format1_segment(tmp_path, [batch(5, i) for i in range(3)])
    log = WriteAheadLog(tmp_path)
    assert log.end == ends[-1] and log.repair == Repair()
    end = log.append(batch(4, 7))
    assert tags(read_all(log)) == ["s0", "s1", "s2", "s7"] and [e for e, _ in read_all(log)] == [*ends, end]
    assert tags(read_all(log, ends[1])) == ["s2", "s7"]
    log.close()
    segments = sorted(tmp_path.glob("*" + SUFFIX))
    assert [p.read_bytes()[:8] for p in segments] == [MAGIC, SEGMENT2.pack(wal_module.MAGIC2, 0)[:8]]
    reopened = WriteAheadLog(tmp_path)
    assert tags(read_all(reopened)) == ["s0", "s1", "s2", "s7"] and reopened.repair == Repair()
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


def test_a_record_written_in_parts_is_the_batch_s_encoding(tmp_path: Path) -> None:
    """A batch's encoding is written as its parts (a mark and its counts, then the IPC message), gathered and checked
    by a CRC chained over them: what is read back is byte for byte :meth:`EventBatch.encode`, across a restart."""
    kinds = [
        batch(4, 0),  # one part
        EventBatch.with_exits(rows(5, 1), rows(3, 2)),  # DPX1 and the message
        batch(6, 3).with_weights(np.arange(1, 7, dtype=np.int64)),  # DPO1 and the message
    ]
    assert [len(b.encode_parts()) for b in kinds] == [1, 2, 2]
    log = WriteAheadLog(tmp_path)
    for b in kinds:
        log.append(b)
    log.close()
    reopened = WriteAheadLog(tmp_path)
    back = [b for _, b in read_all(reopened)]
    reopened.close()
    assert reopened.repair.bytes == 0
    assert [bytes(b.encoding) for b in back] == [bytes(b.encode()) for b in kinds]
    assert back == kinds


@pytest.mark.parametrize("written_native", [True, False])
def test_a_log_written_with_either_crc_reads_with_the_other(tmp_path: Path, written_native: bool) -> None:
    """The ``crc32`` native tier computes zlib's CRC-32 (the records' format is unchanged): a log written with one is
    opened, checked and read with the other, and a damaged payload is still found."""
    with native.disabled(*(() if written_native else ("crc32",))):
        log = WriteAheadLog(tmp_path, segment_bytes=4096)
        for k in range(6):
            log.append(batch(40 + k, k))
        log.close()
    with native.disabled(*(("crc32",) if written_native else ())):
        log = WriteAheadLog(tmp_path, segment_bytes=4096)
        assert log.repair == Repair() and tags(read_all(log)) == [f"s{k}" for k in range(6)]
        log.close()
    last = max(tmp_path.glob("*" + SUFFIX))
    data = bytearray(last.read_bytes())
    data[-5] ^= 0x40  # a bit of the last record's payload
    last.write_bytes(bytes(data))
    log = WriteAheadLog(tmp_path, segment_bytes=4096)
    assert log.repair.records == 1 and tags(read_all(log)) == [f"s{k}" for k in range(5)]
    log.close()

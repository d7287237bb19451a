"""Processes seen through /proc (Linux): a process's children, which of some pids still run, and a memory figure of
one. Shared by the kill tests and the benchmarks."""

from __future__ import annotations

import os


def _stat(pid: int | str) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, ...
    except OSError:
        return None


def children_of(pid: int) -> list[int]:
    """The pids whose parent is ``pid``."""
    return [int(e) for e in os.listdir("/proc") if e.isdigit() and (s := _stat(e)) is not None and int(s[1]) == pid]


def alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (not gone, not zombies)."""
    return [pid for pid in pids if (s := _stat(pid)) is not None and s[0] != "Z"]


def memory_kb(pid: int | str, field: str, file: str = "status") -> int:
    """A memory figure in kB of ``/proc/<pid>/<file>`` (``VmRSS`` or ``VmHWM`` of ``status``, ``Pss`` of
    ``smaps_rollup``); 0 once the process is gone."""
    try:
        with open(f"/proc/{pid}/{file}") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def cpu_s(pid: int | str) -> float:
    """The CPU time (user + system, seconds) ``pid`` has used so far; 0 once it is gone."""
    s = _stat(pid)
    return 0.0 if s is None else (int(s[11]) + int(s[12])) / os.sysconf("SC_CLK_TCK")

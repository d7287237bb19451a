"""Sizing within CPU limits (``drainpipe.processes.usable_cpus``): a process counts the CPUs it may use, its
affinity and its cgroup's CPU quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``), not the machine's; the CPU thread
policies resolve against it, with their ``at_most`` cap. Cgroups are fake trees here, as containers lay them out."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from drainpipe import ThreadPolicy, processes
from drainpipe.errors import ConfigError


@pytest.fixture
def host64(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 64-CPU machine on which this process may run anywhere."""
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)


def tree(tmp_path: Path, proc: str, files: dict[str, str]) -> tuple[str, str]:
    """A fake cgroup root with ``files`` (paths below it) and a /proc/self/cgroup saying ``proc``."""
    root = tmp_path / "cgroup"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text + "\n")
    root.mkdir(exist_ok=True)
    (tmp_path / "self-cgroup").write_text(proc + "\n")
    return str(root), str(tmp_path / "self-cgroup")


@pytest.mark.parametrize(
    ("proc", "files", "expected"),
    [
        ("0::/", {}, 64),  # v2, no limit files: the machine
        ("0::/", {"cpu.max": "max 100000"}, 64),  # no quota
        ("0::/", {"cpu.max": "150000 100000"}, 2),  # 1.5 CPUs: rounded up
        ("0::/kubepods/pod/c1", {"kubepods/pod/c1/cpu.max": "400000 100000"}, 4),  # its own cgroup
        ("0::/kubepods/pod/c1", {"kubepods/pod/c1/cpu.max": "max 100000", "kubepods/cpu.max": "300000 100000"}, 3),
        ("0::/a/b", {"a/b/cpu.max": "800000 100000", "a/cpu.max": "200000 100000"}, 2),  # the tightest wins
        ("0::/", {"cpu.max": "garbage"}, 64),  # unreadable: no limit
        # v1: the cpu controller's hierarchy, under cpu,cpuacct (or cpu)
        (
            "4:cpu,cpuacct:/docker/abc\n3:memory:/docker/abc",
            {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "250000", "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000"},
            3,
        ),
        ("4:cpu,cpuacct:/", {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}, 64),  # -1: none
        ("4:cpu:/x", {"cpu/x/cpu.cfs_quota_us": "50000", "cpu/x/cpu.cfs_period_us": "100000"}, 1),
        ("9:name=systemd:/\n8:pids:/", {}, 64),  # v1 without the cpu controller
    ],
)
def test_the_cgroup_quota_caps_the_cpus(tmp_path, host64, proc, files, expected) -> None:
    root, self_cgroup = tree(tmp_path, proc, files)
    assert processes.usable_cpus(root, self_cgroup) == expected


def test_affinity_caps_the_cpus_and_a_quota_caps_it_further(tmp_path, host64, monkeypatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3, 7, 9}, raising=False)  # taskset -c 3,7,9
    assert processes.usable_cpus(*tree(tmp_path, "0::/", {})) == 3
    assert processes.usable_cpus(*tree(tmp_path, "0::/", {"cpu.max": "200000 100000"})) == 2


def test_no_cgroup_file_is_no_limit(tmp_path, host64) -> None:
    assert processes.usable_cpus(str(tmp_path), str(tmp_path / "missing")) == 64


def test_the_real_process_counts_at_most_its_affinity() -> None:
    cpus = processes.usable_cpus()
    assert 1 <= cpus <= len(os.sched_getaffinity(0))


def test_cpu_policies_resolve_against_the_usable_cpus_within_their_cap(monkeypatch) -> None:
    monkeypatch.setattr(processes, "usable_cpus", lambda: 64)
    assert ThreadPolicy.cpu_cores(1.0).resolve() == 64
    assert ThreadPolicy.cpu_cores(1.0, at_most=32).resolve() == 32
    assert ThreadPolicy.cpu_cores_with_base(1, 0.25, at_most=32).resolve() == 17
    monkeypatch.setattr(processes, "usable_cpus", lambda: 2)
    assert ThreadPolicy.cpu_cores(1.0, at_most=32).resolve() == 2
    assert str(ThreadPolicy.cpu_cores(1.0, at_most=32)) == "cpu_cores(1.0, at_most=32)"
    assert ThreadPolicy.cpu_cores(1.0, at_most=32) != ThreadPolicy.cpu_cores(1.0)
    with pytest.raises(ConfigError, match="at_most"):
        ThreadPolicy.cpu_cores(1.0, at_most=0)

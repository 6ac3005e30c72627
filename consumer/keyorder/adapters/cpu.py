"""The CPU a pod may use (cgroup quota aware) and the CPU it has used, its worker processes included.

The operator needs both to tell a CPU-bound pod from one that more workers would help: a thread
or async executor is bound by one core (the GIL), a process executor by the pod's CPU limit. Linux
puts a container's limit in its cgroup (``cpu.max`` in v2, ``cpu.cfs_quota_us`` and
``cpu.cfs_period_us`` in v1), not in ``os.cpu_count()``, which reports the node's cores. Parsing is
pure (``cores_from_cpu_max``, ``cores_from_cfs``); the readers here do the file I/O.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


def cores_from_cpu_max(text: str) -> float | None:
    """cgroup v2 ``cpu.max`` (``"200000 100000"``: 2 cores; ``"max 100000"``: no quota) -> cores or ``None``."""
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    quota, period = float(parts[0]), float(parts[1])
    return quota / period if quota > 0 and period > 0 else None


def cores_from_cfs(quota_text: str, period_text: str) -> float | None:
    """cgroup v1 ``cpu.cfs_quota_us`` (``-1``: no quota) and ``cpu.cfs_period_us`` -> cores or ``None``."""
    quota, period = float(quota_text), float(period_text)
    return quota / period if quota > 0 and period > 0 else None


def available_cpus() -> int:
    """CPUs this process may be scheduled on (its affinity; the node's count where there is none)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cpu_quota(root: Path = CGROUP) -> float | None:
    """The cgroup CPU quota in cores, or ``None`` without one (or without a readable cgroup)."""
    try:
        return cores_from_cpu_max((root / "cpu.max").read_text())
    except (OSError, ValueError):
        pass
    for v1 in (root / "cpu", root / "cpu,cpuacct"):
        try:
            return cores_from_cfs((v1 / "cpu.cfs_quota_us").read_text(), (v1 / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
    return None


def pod_cpu_cores(root: Path = CGROUP) -> float:
    """Cores the pod may use: its CPU limit (the cgroup quota), at most the CPUs it may run on."""
    cpus = float(available_cpus())
    quota = cpu_quota(root)
    return min(quota, cpus) if quota is not None else cpus


def process_stat(pid: int) -> list[str] | None:
    """The fields of a live process's ``/proc/<pid>/stat`` after ``pid (comm)`` (the state first), ``None``
    if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()  # after "pid (comm)": the comm may hold spaces


def process_cpu_seconds(pid: int) -> float | None:
    """User plus system CPU seconds of a live process (Linux ``/proc``), ``None`` if unknown."""
    fields = process_stat(pid)
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pod_cpu_seconds(worker_pids: Iterable[int]) -> float:
    """CPU seconds used by this process, its exited (reaped) children and its live worker processes."""
    times = os.times()
    total = times.user + times.system + times.children_user + times.children_system
    for pid in worker_pids:
        total += process_cpu_seconds(pid) or 0.0
    return total

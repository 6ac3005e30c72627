"""The pod's CPU figures: cgroup quota parsing (table-driven) and the reader on a fake cgroup tree."""

from __future__ import annotations

import os

import pytest

from keyorder.adapters.cpu import (
    available_cpus,
    cores_from_cfs,
    cores_from_cpu_max,
    cpu_quota,
    pod_cpu_cores,
    pod_cpu_seconds,
    process_cpu_seconds,
)


@pytest.mark.parametrize(
    ("text", "cores"),
    [("200000 100000\n", 2.0), ("50000 100000", 0.5), ("max 100000\n", None), ("", None), ("0 100000", None)],
)
def test_cgroup_v2_cpu_max(text, cores):
    assert cores_from_cpu_max(text) == cores


@pytest.mark.parametrize(
    ("quota", "period", "cores"), [("150000", "100000", 1.5), ("-1", "100000", None), ("100000", "0", None)]
)
def test_cgroup_v1_cfs_quota(quota, period, cores):
    assert cores_from_cfs(quota, period) == cores


def test_the_quota_is_read_from_v2_then_v1_and_capped_at_the_cpus_the_pod_may_use(tmp_path):
    assert cpu_quota(tmp_path) is None, "no cgroup files: no quota"
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("25000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cpu_quota(tmp_path) == 0.25
    (tmp_path / "cpu.max").write_text("300000 100000\n")
    assert cpu_quota(tmp_path) == 3.0
    assert pod_cpu_cores(tmp_path) == min(3.0, available_cpus())
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert pod_cpu_cores(tmp_path) == available_cpus()


def test_cpu_seconds_count_this_process_and_live_children():
    busy = sum(number * number for number in range(300_000))  # some CPU of our own
    assert busy > 0
    own = process_cpu_seconds(os.getpid())
    assert own is not None and own > 0
    assert process_cpu_seconds(2**31 - 1) is None, "an unknown process has no figure"
    assert pod_cpu_seconds([]) >= own - 0.05
    assert pod_cpu_seconds([os.getpid()]) >= pod_cpu_seconds([]) + own - 0.05


def test_the_scaling_report_tells_the_operator_the_executor_and_the_pods_cores_and_cpu_use():

    from keyorder.adapters.scaling_report import scaling_report
    from keyorder.core.retry import RetryPolicy
    from keyorder.core.routing import Ordering
    from keyorder.engine.poll_loop import RuntimeSnapshot
    from keyorder.engine.worker_pools import Completions, ThreadWorkerPool

    class Runtime:  # FAKE: only what the report reads
        snapshot = RuntimeSnapshot()
        ordering = Ordering.KEY

    pool = ThreadWorkerPool(lambda _message: None, 2, RetryPolicy(), None, Completions())
    report = scaling_report(Runtime(), pool)  # type: ignore[arg-type]
    assert report["executor"] == "thread" and report["workerProcesses"] == 0
    assert report["cpuCores"] == round(pod_cpu_cores(), 3) and report["cpuCores"] > 0
    assert report["cpuSecondsTotal"] > 0

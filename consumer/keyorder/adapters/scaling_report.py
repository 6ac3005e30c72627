"""The pod's scaling report: what the operator needs to size the group and to name its bottleneck.

Served as JSON by ``GET /admin/scaling`` (bearer token required: it names the busiest key, which
is business data that metric labels never carry). It is built from the same sources as the
metrics (the poll loop's snapshot, the lane summary, the workers' counters) at request time, so
nothing on the hot path changes. The operator (``keyorder_operator.pod_signals``) parses it;
``REPORT_VERSION`` changes when a field changes meaning.

Counters are totals since the pod started: the operator turns two reports into rates, and a pod
that restarted (totals went down) simply gives no rate for that interval.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from keyorder.adapters.cpu import pod_cpu_cores, pod_cpu_seconds
from keyorder.core.lanes import LaneSummary
from keyorder.engine.poll_loop import ConsumerRuntime, RuntimeSnapshot
from keyorder.engine.worker_pools import WorkerPool, WorkerStats

REPORT_VERSION = 1
KEY_TEXT_LIMIT = 80
"""Longest key shown (keys are arbitrary bytes; a report and an Event must stay small)."""


def lane_name(lane: Hashable | None) -> str | None:
    """A lane as a person reads it: the key as text, or ``topic[partition]`` for a partition lane."""
    if lane is None:
        return None
    if isinstance(lane, bytes):
        text = lane.decode("utf-8", errors="backslashreplace")
    elif isinstance(lane, tuple) and len(lane) == 2:
        return f"{lane[0]}[{lane[1]}]"
    else:
        text = str(lane)
    return text if len(text) <= KEY_TEXT_LIMIT else text[: KEY_TEXT_LIMIT - 1] + "\u2026"


def scaling_report(runtime: ConsumerRuntime, pool: WorkerPool) -> dict[str, Any]:
    """The report as a JSON-ready dict (see the module docstring)."""
    return build_report(
        runtime.snapshot,
        pool.lane_summary(),
        pool.stats(),
        ordering=runtime.ordering.value,
        executor=pool.executor,
        workers=pool.size,
        cpu_cores=pod_cpu_cores(),
        cpu_seconds=pod_cpu_seconds(pool.worker_pids()),
        worker_processes=len(pool.worker_pids()),
    )


def build_report(
    snapshot: RuntimeSnapshot,
    lanes: LaneSummary,
    stats: Sequence[WorkerStats],
    *,
    ordering: str,
    executor: str,
    workers: int,
    cpu_cores: float,
    cpu_seconds: float,
    worker_processes: int,
) -> dict[str, Any]:
    """The report from what a pod knows at one moment: pure, so ``keyorder simulate`` builds its
    simulated pods' reports with exactly this code."""
    held = {(state.id, offset): blocked for state, offset, blocked in lanes.parked_heads}
    partitions = []
    for part in snapshot.partitions:
        head_state = None if part.min_inflight is None else held.get(((part.topic, part.partition), part.min_inflight))
        partitions.append(
            {
                "topic": part.topic,
                "partition": part.partition,
                "lag": part.lag,
                "inflight": part.inflight,
                "minOffsetHeld": None if head_state is None else ("blocked" if head_state else "retrying"),
            }
        )
    busiest = None
    if lanes.longest_lane is not None and lanes.longest_backlog > 0:
        where = getattr(lanes.longest_lane_partition, "id", None)
        busiest = {
            "key": lane_name(lanes.longest_lane),
            "topic": where[0] if where else None,
            "partition": where[1] if where else None,
            "backlog": lanes.longest_backlog,
            "share": round(lanes.longest_backlog_share, 4),
        }
    return {
        "version": REPORT_VERSION,
        "ordering": ordering,
        "workers": workers,
        "workersBusy": sum(1 for worker in stats if worker.busy),
        "handlerCallsTotal": sum(worker.handler_seconds.count for worker in stats),
        "handlerSecondsTotal": round(sum(worker.handler_seconds.total for worker in stats), 6),
        # a batch handler's calls; handlerCallsTotal and handlerSecondsTotal count its messages and split each
        # call's seconds over them, so seconds per call stay a worker's busy seconds per message
        "handlerBatchesTotal": sum(worker.batch_sizes.count for worker in stats),
        "rebalancesTotal": snapshot.rebalances,
        "partitionsRevokedTotal": snapshot.partitions_revoked,
        "rebalanceIdleSecondsTotal": round(snapshot.rebalance_idle_seconds, 3),
        "partitionsAssigned": snapshot.assigned_partitions,
        # seconds since this pod's partitions last changed: the operator times a scale step with it
        "assignmentAgeSeconds": None if snapshot.assignment_age is None else round(snapshot.assignment_age, 3),
        "inflight": snapshot.inflight,
        "lanes": {
            "ready": lanes.ready,
            "running": lanes.running,
            "parked": lanes.parked,
            "blocked": lanes.blocked,
            "queued": lanes.queued,
            "active": lanes.active,
        },
        "busiestLane": busiest,
        "partitions": partitions,
        # the cores the pod may use and has used: a process executor scales up to cpuCores workers;
        # a thread or async one whose CPU use nears one core is GIL-bound (more workers cannot help)
        "executor": executor,
        "cpuCores": round(cpu_cores, 3),
        "cpuSecondsTotal": round(cpu_seconds, 3),
        "workerProcesses": worker_processes,
    }

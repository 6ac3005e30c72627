"""What the pods say about themselves, summed over a group: the policy's view of the bottleneck.

Kafka tells the operator *how much* is behind (lag); only the pods can tell *why* it drains as it
does: how long the handler takes, whether keys wait for a worker (more workers help), whether one
key holds most of the queue (nothing but a faster handler helps), whether a blocked key pins a
partition's commit (no pod can drain that lag). Each pod serves that as JSON on
``GET /admin/scaling`` (``keyorder.adapters.scaling_report``); this module parses those reports
and sums them into one ``PodSignals``. Pure: the HTTP calls are in ``pod_admin``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SUPPORTED_REPORT_VERSION = 1


class BadPodReport(ValueError):
    """A pod answered with something that is not a scaling report this operator understands."""


@dataclass(frozen=True)
class BusiestLane:
    key: str
    """The key as text (or ``topic[partition]`` for a partition lane)."""
    where: str
    """``topic[partition]`` of the lane's head."""
    backlog: int
    partition_inflight: int = 0
    """Messages the same pod holds from that partition (the window the backlog was seen in)."""
    partition_lag: int = 0
    """That partition's lag as the pod sees it."""

    @property
    def estimated_backlog(self) -> int:
        """The key's backlog in the whole partition, assuming the pod's window is representative of
        what is behind it: the pod looks ahead only so far (its in-flight bound), so a hot key is
        usually much longer than the part the pod holds."""
        if self.partition_inflight <= 0 or self.partition_lag <= self.partition_inflight:
            return self.backlog
        return max(self.backlog, round(self.backlog / self.partition_inflight * self.partition_lag))


@dataclass(frozen=True)
class HeldPartition:
    """A partition whose commit is held back by a key waiting for a retry, or blocked for good."""

    where: str
    blocked: bool
    """True: the key exhausted its attempts under ``onExhausted: block`` (only a person can unblock it)."""
    lag: int


@dataclass(frozen=True)
class PodSignals:
    """The group's pods at one poll, summed (totals are since each pod started)."""

    pods: int
    """Pods that answered."""
    workers: int
    """Key workers the pods run (what they report, not what was decided)."""
    busy: int
    lanes_ready: int
    """Keys with a message ready and no free worker: above 0, more workers help."""
    queued: int
    """Messages held in the pods' lanes."""
    inflight: int
    handler_calls_total: int
    handler_seconds_total: float
    rebalances_total: int
    ordering: str
    partitions_assigned: int
    busiest: BusiestLane | None = None
    """The longest lane over all pods."""
    held: tuple[HeldPartition, ...] = ()
    executor: str = "thread"
    """``thread``, ``async`` or ``process`` (``mixed`` while pods differ, e.g. during a rollout)."""
    cpu_cores: float = 0.0
    """Cores the pods may use, summed (0: not reported)."""
    cpu_seconds_total: float = 0.0
    """CPU the pods used since they started (their worker processes included), summed."""
    partitions_revoked_total: int = 0
    """Partitions rebalances took from the pods since they started, summed (0: not reported)."""
    rebalance_idle_seconds_total: float = 0.0
    """Seconds the pods held no partition between a rebalance and their next assignment, summed: what
    eager rebalances cost (cooperative ones leave pods that keep partitions at 0)."""
    assignment_age: float | None = None
    """Seconds since the group's latest change of partitions (the smallest any pod reports; ``None``:
    none reported one): when the last rebalance ended, to time a scale step."""
    most_workers: int = 0
    """The most key workers any one pod runs (0: not known; ``workers`` is their sum): what the pods in
    place keep while a scale step's new pods start (``policy.workers_while_pods_start``)."""
    handler_batches_total: int = 0
    """A batch handler's calls, summed (0: per-message handlers, or pods that do not report it);
    ``handler_calls_total`` counts their messages."""

    @property
    def messages_per_call(self) -> float:
        """Messages a handler call holds on average: 1 for a per-message handler. A batch handler runs at most
        one message of a key per call, so one key's messages take a call each, this many messages' time."""
        if not self.handler_batches_total:
            return 1.0
        return max(self.handler_calls_total / self.handler_batches_total, 1.0)

    @property
    def busiest_share(self) -> float:
        """The longest lane's share of everything queued in the group (0 to 1)."""
        return self.busiest.backlog / self.queued if self.busiest and self.queued else 0.0

    @property
    def blocked_lag(self) -> int:
        """Lag on partitions whose commit a blocked key pins: no amount of pods can drain it."""
        return sum(held.lag for held in self.held if held.blocked)

    @property
    def cores_per_pod(self) -> float:
        return self.cpu_cores / self.pods if self.pods else 0.0

    def totals(self) -> tuple[int, float, int, int, float]:
        """What the policy keeps to turn the next report into interval figures."""
        return (
            self.handler_calls_total,
            self.handler_seconds_total,
            self.rebalances_total,
            self.pods,
            self.cpu_seconds_total,
        )


def _int(report: Mapping[str, Any], name: str) -> int:
    value = report.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BadPodReport(f"field {name!r} must be a non-negative integer, got {value!r}")
    return value


MAX_REPORT_PARTITIONS = 6000
"""Most entries in a report's ``partitions``: more than a real report within the operator's byte limit
can hold (512 KiB at 91 bytes or more per partition: 5,760), so no real report is refused for it; it
bounds what a hostile report makes the operator keep for the poll to what a real one costs."""
PARTITION_FIELDS = ("topic", "partition", "lag", "inflight", "minOffsetHeld")
"""What ``combine`` reads of each entry of a report's ``partitions``: the only fields kept of one."""
HELD_STATES = ("blocked", "retrying")
"""A partition's ``minOffsetHeld`` when a key holds its commit back."""
_SCALARS = (str, int, float, bool, type(None))


def _scalars(value: Any, keep: Sequence[str] | None = None) -> dict[str, Any]:
    """The entries of a JSON object whose values are not containers (of ``keep`` only, when given): the
    object itself when that is all of it (a real report's are), else a new one."""
    if not isinstance(value, dict):
        return {}

    def wanted(name: str, item: Any) -> bool:
        return isinstance(item, _SCALARS) and (keep is None or name in keep)

    if all(wanted(name, item) for name, item in value.items()):
        return value
    return {name: item for name, item in value.items() if wanted(name, item)}


def parse_report(report: Any) -> dict[str, Any]:
    """Check one pod's JSON report; raises ``BadPodReport`` naming the first bad field. Returns what the
    operator reads of it, a new object: the top level's and ``lanes``'s and ``busiestLane``'s plain
    values, and ``PARTITION_FIELDS`` of each partition (entries that are not objects dropped). The reports
    of a group's pods are kept for the whole poll, so a pod cannot make the operator keep more than a
    real report's values: anything else it sends is freed with the parsed JSON."""
    if not isinstance(report, dict):
        raise BadPodReport(f"expected a JSON object, got {type(report).__name__}")
    if report.get("version") != SUPPORTED_REPORT_VERSION:
        raise BadPodReport(
            f"report version {report.get('version')!r}, this operator reads version {SUPPORTED_REPORT_VERSION} "
            "(pods and operator from different releases?)"
        )
    for name in ("workers", "workersBusy", "handlerCallsTotal", "rebalancesTotal", "partitionsAssigned", "inflight"):
        _int(report, name)
    if not isinstance(report.get("handlerSecondsTotal"), int | float):
        raise BadPodReport("field 'handlerSecondsTotal' must be a number")
    lanes = report.get("lanes")
    if not isinstance(lanes, dict):
        raise BadPodReport("field 'lanes' must be an object")
    for name in ("ready", "queued"):
        _int(lanes, name)
    if not isinstance(report.get("partitions"), list):
        raise BadPodReport("field 'partitions' must be a list")
    if len(report["partitions"]) > MAX_REPORT_PARTITIONS:
        raise BadPodReport(
            f"field 'partitions' has {len(report['partitions'])} entries, more than {MAX_REPORT_PARTITIONS}"
        )
    kept = _scalars(report)
    kept["lanes"] = _scalars(lanes)
    if "busiestLane" in report:
        kept["busiestLane"] = _scalars(report["busiestLane"]) if isinstance(report["busiestLane"], dict) else None
    lane = kept.get("busiestLane") or {}
    home = (lane.get("topic"), lane.get("partition"))
    kept["partitions"] = [
        _scalars(part, PARTITION_FIELDS)
        for part in report["partitions"]
        if isinstance(part, dict)
        and (part.get("minOffsetHeld") in HELD_STATES or (part.get("topic"), part.get("partition")) == home)
    ]
    return kept


def _number(report: Mapping[str, Any], name: str) -> float:
    """An optional non-negative number (0 when a pod does not report it)."""
    value = report.get(name)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else 0.0


def _where(topic: Any, partition: Any) -> str:
    return f"{topic}[{partition}]"


def combine(reports: Sequence[Mapping[str, Any]]) -> PodSignals | None:
    """Sum parsed reports into the group's signals (``None`` when no pod answered)."""
    if not reports:
        return None
    busiest: BusiestLane | None = None
    held: list[HeldPartition] = []
    orderings = {str(report.get("ordering")) for report in reports}
    for report in reports:
        lane = report.get("busiestLane")
        if isinstance(lane, dict) and lane.get("backlog", 0) > (busiest.backlog if busiest else 0):
            home: Mapping[str, Any] = next(
                (
                    part
                    for part in report["partitions"]
                    if (part.get("topic"), part.get("partition")) == (lane.get("topic"), lane.get("partition"))
                ),
                {},
            )
            busiest = BusiestLane(
                key=str(lane.get("key")),
                where=_where(lane.get("topic"), lane.get("partition")),
                backlog=lane["backlog"],
                partition_inflight=int(home.get("inflight") or 0),
                partition_lag=int(home.get("lag") or 0),
            )
        for part in report["partitions"]:
            state = part.get("minOffsetHeld")
            if state in HELD_STATES:
                held.append(
                    HeldPartition(
                        where=_where(part.get("topic"), part.get("partition")),
                        blocked=state == "blocked",
                        lag=int(part.get("lag") or 0),
                    )
                )
    executors = {str(report.get("executor") or "thread") for report in reports}
    ages = [
        _number(report, "assignmentAgeSeconds") for report in reports if report.get("assignmentAgeSeconds") is not None
    ]
    return PodSignals(
        assignment_age=min(ages) if ages else None,
        executor=executors.pop() if len(executors) == 1 else "mixed",
        cpu_cores=sum(_number(report, "cpuCores") for report in reports),
        cpu_seconds_total=sum(_number(report, "cpuSecondsTotal") for report in reports),
        partitions_revoked_total=int(sum(_number(report, "partitionsRevokedTotal") for report in reports)),
        rebalance_idle_seconds_total=sum(_number(report, "rebalanceIdleSecondsTotal") for report in reports),
        pods=len(reports),
        workers=sum(report["workers"] for report in reports),
        most_workers=max(report["workers"] for report in reports),
        busy=sum(report["workersBusy"] for report in reports),
        lanes_ready=sum(report["lanes"]["ready"] for report in reports),
        queued=sum(report["lanes"]["queued"] for report in reports),
        inflight=sum(report["inflight"] for report in reports),
        handler_calls_total=sum(report["handlerCallsTotal"] for report in reports),
        handler_batches_total=sum(
            _int(report, "handlerBatchesTotal") for report in reports if "handlerBatchesTotal" in report
        ),
        handler_seconds_total=sum(float(report["handlerSecondsTotal"]) for report in reports),
        rebalances_total=sum(report["rebalancesTotal"] for report in reports),
        ordering=orderings.pop() if len(orderings) == 1 else "mixed",
        partitions_assigned=sum(report["partitionsAssigned"] for report in reports),
        busiest=busiest,
        held=tuple(sorted(held, key=lambda item: item.where)),
    )

"""The simulated consumer group: partitions, pods and their workers, one step of simulated time at a time.

A fluid model (messages are counts, not objects), so hours of a group take well under a second:

- **Partitions** receive arrivals. Each has a normal progress offset (every message below it that
  is not the hot key's is handled), a **hot key** share (its messages run one at a time, and its
  oldest unhandled message holds the partition's commit), and possibly a **blocked key** (a message
  that fails forever under ``onExhausted: block``: the commit stays there). A pod looks ahead at
  most ``inflight_per_pod`` offsets past the commit (split over its partitions), as the pod's flow
  control does, so a hot or blocked key starves the rest of its partition once the window is full.
- **Pods** are created by the Deployment's replicas, become ready after ``start_delay``, and join
  the group: every membership change is a **rebalance**. Eager: every partition stops for
  ``rebalance_pause`` seconds, and the partitions are spread in contiguous ranges (the range
  assignor). Incremental (cooperative-sticky, the pods' default): each pod keeps as many of its
  partitions as an even spread allows, and only the partitions that change owner stop, for
  ``move_pause`` seconds. Both pauses are the figures ``keyorder rebalance-bench`` measured.
  A pod beyond the partition count gets none. The pods of the run's start were consuming before
  it: they do not pause.
- **Workers**: a pod handles at most ``W x dt / (handler time + overhead)`` messages in a step, and
  no more than its CPU allows when the handler costs CPU (one core for threads, the pod's cores for
  processes; contention then shows as a longer handler time, as the GIL does).

The pods' reports are built from this state by the pods' own report code (``build_report``); the
model only supplies what a pod would know. Nothing here reads a clock or uses global randomness.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from keyorder.adapters.scaling_report import build_report
from keyorder.core.lanes import LaneSummary
from keyorder.engine.poll_loop import PartitionSnapshot, RuntimeSnapshot
from keyorder.engine.worker_pools import WorkerStats

TOPIC = "orders"
HOT_KEY = "acct-hot"
BLOCKED_KEY = "acct-poison"


@dataclass(frozen=True)
class Workload:
    """What the pods run (an image): its handler time over time, per-message overhead and CPU cost."""

    name: str
    handler_seconds: Callable[[float], float]
    """Mean handler seconds per message at simulated second ``t`` (from the run's start)."""
    overhead_seconds: float = 0.0002
    """Per message outside the handler (dispatch, commit bookkeeping)."""
    cpu_per_message: float = 0.0
    """CPU seconds per message (0: the handler waits on I/O and costs no CPU)."""
    spread: float = 0.2
    """Relative spread of a step's mean handler time (log-normal)."""


@dataclass(frozen=True)
class GroupSettings:
    partitions: int = 12
    start_delay: float = 30.0
    """Seconds from a pod's creation to ready (image pull, start-up, readiness)."""
    incremental: bool = True
    """Cooperative (incremental) rebalancing, the pods' default: only partitions that change owner stop."""
    rebalance_pause: float = 4.0
    """Eager: seconds every partition stops per rebalance (``keyorder rebalance-bench``: a kept pod
    stopped for up to 4.04 s per step, the whole group for 3.05 s)."""
    move_pause: float = 13.0
    """Incremental: seconds a partition that changes owner waits for its new owner (the bench: up to
    12.99 s on the embedded broker, whose join rounds take about 3 s each; see docs/rebalancing.md)."""
    inflight_per_pod: int = 10_000
    cores_per_pod: float = 1.0
    executor: str = "thread"
    ordering: str = "key"
    keys_per_partition: int = 2_000
    """Distinct keys a partition's window holds (how many lanes can run at once)."""
    thread_per_partition: bool = False
    """A plain consumer (what KEDA scales): each pod runs one handler thread per partition it owns, in
    offset order, so a partition drains at most one worker's rate, a blocked message stops its
    partition, and a pod's workers are its partitions (the operator's worker count does not apply). Checked
    against real processes: ``keyorder dev`` runs such a group (``keyorder run`` in partition ordering, a
    thread per partition) and ``tests/unit/test_demo_replay.py`` holds the simulated drain within 20% of it."""


@dataclass
class SimPartition:
    index: int
    end: float = 0.0
    done: float = 0.0
    """Normal progress: every offset below it that is not the hot key's is handled."""
    hot_share: float = 0.0
    hot_total: float = 0.0
    hot_done: float = 0.0
    blocked_at: float | None = None
    last_commit: float = 0.0
    """The offset the pods last committed (they commit every step, as a pod does every second): what
    Kafka reports, one step behind the pods' own progress."""
    paused_until: float = 0.0
    """No pod consumes the partition before this (a rebalance moved it, or stopped every partition)."""

    @property
    def hot_position(self) -> float:
        """Offset of the hot key's oldest unhandled message (inf when it has none)."""
        if self.hot_share <= 0 or self.hot_done >= self.hot_total - 1e-9:
            return math.inf
        return self.hot_done / self.hot_share

    @property
    def committed(self) -> float:
        committed = min(self.done, self.hot_position, self.end)
        return min(committed, self.blocked_at) if self.blocked_at is not None else committed

    @property
    def lag(self) -> float:
        """End offset minus the last commit: the lag Kafka reports."""
        return max(self.end - self.last_commit, 0.0)


@dataclass
class SimPod:
    name: str
    created: float
    ready_at: float
    workload: str
    workers: int
    partitions: tuple[int, ...] = ()
    joined: bool = False
    rebalances: int = 0
    calls: float = 0.0
    handler_total: float = 0.0
    cpu_seconds: float = 0.0
    busy_share: float = 0.0
    saturated: bool = False
    partitions_changed_at: tuple[float, ...] = ()
    """When this pod's partitions changed (a revoke at once, an assignment after its pause), as the
    pod reports it: the operator times a scale step with the latest that has happened."""


@dataclass(frozen=True)
class _PartitionId:
    """What the pod's report reads from a partition's runtime state: its ``id``."""

    id: tuple[str, int]


@dataclass
class SimulatedGroup:
    """The group: ``step`` advances it, ``reports`` and ``lag_sample`` are what the operator reads."""

    settings: GroupSettings
    workloads: dict[str, Workload]
    workload: str
    rng: random.Random
    replicas: int = 1
    initial_workers: int = 16
    now: float = 0.0
    partitions: list[SimPartition] = field(default_factory=list)
    pods: list[SimPod] = field(default_factory=list)
    rebalances: int = 0
    _names: int = 0

    def __post_init__(self) -> None:
        if not self.partitions:
            self.partitions = [SimPartition(index) for index in range(self.settings.partitions)]
        for _ in range(self.replicas):
            self._create_pod(ready_now=True)
        self._rebalance()
        for partition in self.partitions:  # the group was consuming before the run started
            partition.paused_until = 0.0
        for pod in self.pods:
            pod.partitions_changed_at = (0.0,)

    # -- the Deployment -----------------------------------------------------------------------------
    def _create_pod(self, ready_now: bool = False) -> None:
        self._names += 1
        delay = 0.0 if ready_now else self.settings.start_delay
        self.pods.append(
            SimPod(
                name=f"pod-{self._names:03d}",
                created=self.now,
                ready_at=self.now + delay,
                workload=self.workload,
                workers=self.initial_workers,
            )
        )

    def scale(self, replicas: int) -> None:
        """The Deployment's replicas: new pods start (ready after the delay); removed pods leave at once
        (not-ready and newest first, as a ReplicaSet picks them)."""
        self.replicas = replicas
        current = [pod for pod in self.pods if pod.workload == self.workload]
        while len(current) < replicas:
            self._create_pod()
            current = [pod for pod in self.pods if pod.workload == self.workload]
        if len(current) > replicas:
            doomed = sorted(current, key=lambda pod: (pod.joined, -pod.created))[: len(current) - replicas]
            left_group = any(pod.joined for pod in doomed)
            self.pods = [pod for pod in self.pods if pod not in doomed]
            if left_group:
                self._rebalance()

    def roll_out(self, workload: str) -> None:
        """A new image: pods are replaced one at a time (a new one starts; once ready, an old one leaves)."""
        self.workload = workload

    def push_workers(self, workers: int, reachable: Callable[[SimPod], bool], lower: bool = True) -> None:
        """The operator's worker push reaches the ready pods that answer (live: no restart, no rebalance);
        with ``lower`` False (``Decision.hold_workers``: a scale step has not settled) not those that run
        more workers, as ``pod_admin.needing_push`` picks them."""
        for pod in self.pods:
            if pod.joined and reachable(pod) and (lower or pod.workers <= workers):
                pod.workers = workers

    @property
    def rollout_settled(self) -> bool:
        """Every pod of the Deployment is updated and ready."""
        updated = [pod for pod in self.pods if pod.workload == self.workload]
        return len(updated) == self.replicas == len(self.pods) and all(pod.joined for pod in self.pods)

    # -- the group ----------------------------------------------------------------------------------------
    def _rebalance(self) -> None:
        members = sorted((pod for pod in self.pods if pod.joined or pod.ready_at <= self.now), key=lambda p: p.name)
        self.rebalances += 1
        incremental = self.settings.incremental
        assignment = (sticky_assignment if incremental else range_assignment)(
            [(pod.name, pod.partitions) for pod in members], self.settings.partitions
        )
        pause = self.settings.move_pause if incremental else self.settings.rebalance_pause
        for pod in members:
            assigned = assignment[pod.name]
            kept = set(pod.partitions) if pod.joined else set()
            changes = []
            if not incremental or set(assigned) - kept:
                changes.append(self.now + pause)
            if set(pod.partitions) - set(assigned):
                changes.append(self.now)
            pod.partitions_changed_at = (*pod.partitions_changed_at, *changes)[-4:]
            pod.joined = True
            pod.partitions = assigned
            if self.settings.thread_per_partition:
                pod.workers = len(assigned)
            pod.rebalances += 1
            for index in assigned:
                if not incremental:
                    self.partitions[index].paused_until = self.now + self.settings.rebalance_pause
                elif index not in kept:  # incremental: a partition that stays keeps flowing
                    self.partitions[index].paused_until = self.now + self.settings.move_pause

    def _roll(self) -> None:
        """One step of a rolling update: surge one new pod; when it is ready, retire one old pod."""
        old = [pod for pod in self.pods if pod.workload != self.workload]
        if not old:
            return
        new = [pod for pod in self.pods if pod.workload == self.workload]
        starting = [pod for pod in new if not pod.joined]
        if not starting and len(new) < self.replicas:
            self._create_pod()
        elif not starting and new:
            self.pods.remove(old[0])
            self._rebalance()
        elif not new:
            self._create_pod()

    # -- time -----------------------------------------------------------------------------------------------
    def add_arrivals(self, messages: float, weights: tuple[float, ...] | None = None) -> None:
        """``messages`` produced, spread over the partitions by ``weights`` (even by default)."""
        total = self.settings.partitions
        shares = weights or (1.0,) * total
        norm = sum(shares)
        for partition, share in zip(self.partitions, shares, strict=True):
            arrived = messages * share / norm
            partition.end += arrived
            partition.hot_total += arrived * partition.hot_share

    def true_rate(self, workload: str | None = None) -> float:
        """Messages/s one busy worker handles now (the ground truth the policy estimates)."""
        load = self.workloads[workload or self.workload]
        return 1.0 / (load.handler_seconds(self.now) + load.overhead_seconds)

    def pod_capacity(self, pod: SimPod) -> float:
        """Messages/s the pod can handle when its workers have work (its CPU bound included)."""
        load = self.workloads[pod.workload]
        rate = pod.workers / (load.handler_seconds(self.now) + load.overhead_seconds)
        return min(rate, self._cpu_cap(pod))

    def _cpu_cap(self, pod: SimPod) -> float:
        load = self.workloads[pod.workload]
        if load.cpu_per_message <= 0:
            return math.inf
        cores = self.settings.cores_per_pod
        usable = min(cores, 1.0) if self.settings.executor in ("thread", "async") else min(cores, pod.workers)
        return usable / load.cpu_per_message

    def ready_capacity(self) -> float:
        """Messages/s the joined pods can handle of load spread evenly over the partitions (rebalance
        pauses aside): the pod with the least capacity per partition sets the pace for all."""
        members = [pod for pod in self.pods if pod.joined and pod.partitions]
        if sum(len(pod.partitions) for pod in members) < self.settings.partitions:
            return 0.0
        total = self.settings.partitions
        return min((self.pod_capacity(pod) * total / len(pod.partitions) for pod in members), default=0.0)

    def step(self, dt: float) -> None:
        """Advance ``dt`` seconds: pods start and join, roll, and handle what their windows hold."""
        self.now += dt
        for partition in self.partitions:
            partition.last_commit = partition.committed
        if any(not pod.joined and pod.ready_at <= self.now for pod in self.pods):
            self._rebalance()
        self._roll()
        for pod in self.pods:
            self._handle(pod, dt)

    def _window(self, pod: SimPod) -> float:
        return self.settings.inflight_per_pod / max(len(pod.partitions), 1)

    def _handle(self, pod: SimPod, dt: float) -> None:
        flowing = [index for index in pod.partitions if self.partitions[index].paused_until <= self.now]
        if not pod.joined or not flowing:
            pod.busy_share, pod.saturated = 0.0, False
            return
        load = self.workloads[pod.workload]
        handler = load.handler_seconds(self.now) * math.exp(self.rng.gauss(0.0, load.spread) - load.spread**2 / 2)
        per_worker = dt / (handler + load.overhead_seconds)
        capacity = min(pod.workers * per_worker, self._cpu_cap(pod) * dt)
        if self.settings.thread_per_partition:
            self._handle_in_order(pod, flowing, per_worker, capacity, handler, load, dt)
            return
        window = self._window(pod)
        available: list[tuple[SimPartition, float, float]] = []
        for index in flowing:
            partition = self.partitions[index]
            limit = min(partition.end, partition.committed + window)
            normal = max(limit - partition.done, 0.0) * (1.0 - partition.hot_share)
            hot = 0.0
            if partition.hot_share > 0 and partition.hot_position < limit:
                hot = min((limit - partition.hot_position) * partition.hot_share, per_worker)  # one worker
            available.append((partition, normal, hot))
        wanted = sum(normal + hot for _, normal, hot in available)
        fraction = min(1.0, capacity / wanted) if wanted > 0 else 0.0
        handled = 0.0
        for partition, normal, hot in available:
            take_normal, take_hot = normal * fraction, hot * fraction
            if take_normal > 0:
                partition.done += take_normal / (1.0 - partition.hot_share)
            partition.hot_done += take_hot
            handled += take_normal + take_hot
        pod.calls += handled
        cpu_bound = capacity < pod.workers * per_worker
        busy = min(handled / per_worker, pod.workers) if per_worker > 0 else 0.0
        # a CPU-bound pod's workers wait for the CPU inside their handler: its wall time stretches
        pod.handler_total += busy * dt if cpu_bound else handled * handler
        pod.cpu_seconds += handled * load.cpu_per_message + 0.02 * dt
        pod.busy_share = busy / pod.workers if pod.workers else 0.0
        pod.saturated = wanted > capacity

    def _handle_in_order(
        self,
        pod: SimPod,
        flowing: list[int],
        per_worker: float,
        capacity: float,
        handler: float,
        load: Workload,
        dt: float,
    ) -> None:
        """A plain consumer's step: one thread per partition, each handling its partition's messages in
        offset order (at most one worker's rate; a blocked message stops it), all within the CPU bound."""
        available = []
        for index in flowing:
            partition = self.partitions[index]
            limit = partition.end if partition.blocked_at is None else min(partition.end, partition.blocked_at)
            available.append((partition, min(max(limit - partition.done, 0.0), per_worker)))
        wanted = sum(take for _, take in available)
        fraction = min(1.0, capacity / wanted) if wanted > 0 else 0.0
        handled = 0.0
        for partition, take in available:
            partition.done += take * fraction
            if partition.hot_share > 0:  # the hot key's messages go in offset order with the rest
                partition.hot_done = min(partition.hot_total, partition.done * partition.hot_share)
            handled += take * fraction
        pod.calls += handled
        busy = min(handled / per_worker, pod.workers) if per_worker > 0 else 0.0
        pod.handler_total += handled * handler
        pod.cpu_seconds += handled * load.cpu_per_message + 0.02 * dt
        pod.busy_share = busy / pod.workers if pod.workers else 0.0
        pod.saturated = wanted > capacity

    # -- what the operator reads ------------------------------------------------------------------------------
    def lag(self) -> float:
        return sum(partition.lag for partition in self.partitions)

    def report(self, pod: SimPod) -> dict[str, Any]:
        """The pod's ``GET /admin/scaling`` answer, built by the pods' own report code."""
        window = self._window(pod)
        snapshots, parked = [], []
        queued = inflight_total = 0
        runnable_keys = 0
        busiest: tuple[float, str, int] | None = None
        for index in pod.partitions:
            partition = self.partitions[index]
            committed = int(partition.committed)
            limit = min(partition.end, partition.committed + window)
            normal = max(limit - partition.done, 0.0) * (1.0 - partition.hot_share)
            hot = max(limit - partition.hot_position, 0.0) * partition.hot_share if partition.hot_share else 0.0
            inflight = max(int(limit) - committed, 0)
            queued += int(normal + hot)
            inflight_total += inflight
            runnable_keys += min(self.settings.keys_per_partition, int(normal)) + (1 if hot >= 1 else 0)
            if hot >= 1 and (busiest is None or hot > busiest[0]):
                busiest = (hot, HOT_KEY, index)
            blocked = partition.blocked_at is not None and committed >= int(partition.blocked_at)
            if blocked:
                parked.append((_PartitionId((TOPIC, index)), committed, True))
                runnable_keys = max(runnable_keys - 1, 0)
            snapshots.append(
                PartitionSnapshot(
                    topic=TOPIC,
                    partition=index,
                    committed=int(partition.last_commit),
                    high_watermark=int(partition.end),
                    min_inflight=committed if inflight > 0 else None,
                    oldest_inflight_age=0.0,
                    inflight=inflight,
                    uncommitted=inflight,
                    paused=inflight >= window,
                    completed=int(partition.done),
                )
            )
        if busiest is None and queued > 0 and pod.partitions:
            per_key = max(1, math.ceil(queued / max(runnable_keys, 1)))
            busiest = (per_key, "acct-1", pod.partitions[0])
        workers = pod.workers
        busy = min(workers, round(pod.busy_share * workers))
        ready = max(runnable_keys - workers, 0) if pod.saturated else 0
        lanes = LaneSummary(
            ready=ready,
            running=busy,
            parked=len(parked),
            blocked=len(parked),
            queued=queued,
            longest_backlog=int(busiest[0]) if busiest else 0,
            active=runnable_keys,
            parked_heads=frozenset(parked),
            longest_lane=busiest[1] if busiest else None,
            longest_lane_partition=_PartitionId((TOPIC, busiest[2])) if busiest else None,
        )
        stats = [WorkerStats() for _ in range(max(workers, 1))]
        stats[0].handler_seconds.count = int(pod.calls)
        stats[0].handler_seconds.total = pod.handler_total
        for worker in stats[:busy]:
            worker.busy = True
        snapshot = RuntimeSnapshot(
            partitions=tuple(snapshots),
            inflight=inflight_total,
            workers=workers,
            rebalances=pod.rebalances,
            # a partition on its way to this pod (paused by the rebalance) is not assigned yet
            assigned_partitions=sum(1 for index in pod.partitions if self.partitions[index].paused_until <= self.now),
            assignment_age=min((self.now - at for at in pod.partitions_changed_at if at <= self.now), default=None),
        )
        return build_report(
            snapshot,
            lanes,
            stats,
            ordering=self.settings.ordering,
            executor=self.settings.executor,
            workers=workers,
            cpu_cores=self.settings.cores_per_pod,
            cpu_seconds=pod.cpu_seconds,
            worker_processes=workers if self.settings.executor == "process" else 0,
        )


def range_assignment(members: list[tuple[str, tuple[int, ...]]], partitions: int) -> dict[str, tuple[int, ...]]:
    """The range assignor (eager): contiguous blocks in member order, the first ones one larger."""
    count, start, assignment = len(members), 0, {}
    for position, (name, _) in enumerate(members):
        size = partitions // count + (1 if position < partitions % count else 0)
        assignment[name] = tuple(range(start, start + size))
        start += size
    return assignment


def sticky_assignment(members: list[tuple[str, tuple[int, ...]]], partitions: int) -> dict[str, tuple[int, ...]]:
    """The cooperative-sticky assignor: as even a spread as the range one, moving the fewest partitions
    (the members holding the most keep the larger shares; each keeps its lowest partitions up to its
    share; what is left over goes, lowest first, to the members below theirs)."""
    count = len(members)
    if not count:
        return {}
    base, extra = divmod(partitions, count)
    by_holding = sorted(members, key=lambda member: (-len(member[1]), member[0]))
    share = {name: base + (1 if rank < extra else 0) for rank, (name, _) in enumerate(by_holding)}
    kept = {name: sorted(p for p in held if p < partitions)[: share[name]] for name, held in members}
    taken = {p for held in kept.values() for p in held}
    free = [p for p in range(partitions) if p not in taken]
    for name, _ in members:
        while len(kept[name]) < share[name]:
            kept[name].append(free.pop(0))
    return {name: tuple(sorted(held)) for name, held in kept.items()}

"""Steps 7 to 9: how a number of workers becomes a size.

Pods first, each with the initial worker count, up to min(max replicas, partitions); only at that cap
do workers per pod grow, and shrinking walks back the same path (``shape``). A size is fitted within a
bound (``fitted``, ``bounded_size``), kept on the current pods when only their workers may change
(``on_current_pods``), held at the activation size below ``activation_lag`` (``activation_size``), and
left unmade when the change is within the tolerance (``within_tolerance``).
"""

from __future__ import annotations

import math

from keyorder_operator.policy.lag import is_marker_residue
from keyorder_operator.policy.model import Bound, Observation, ScalingLimits, Size


def replica_cap(limits: ScalingLimits, partitions: int) -> int:
    """The most pods that can hold a partition: min(max replicas, partitions), at least the minimum."""
    cap = min(limits.max_replicas or partitions, partitions)
    return max(cap, limits.min_replicas, 1)


def workers_for(capacity: int, replicas: int, partitions: int) -> int:
    """Workers per pod so that the busiest pod (the one with the most partitions) keeps up with its
    partitions' share of ``capacity`` workers: the group is only as fast as that pod."""
    if replicas <= 0:
        return 0
    if partitions <= 0:
        return math.ceil(capacity / replicas)
    busiest = math.ceil(partitions / min(replicas, partitions))
    return math.ceil(capacity * busiest / partitions)


def drain_capacity(size: Size, partitions: int, workers_per_pod: int | None = None) -> float:
    """Workers' worth of drain ``size`` gives a backlog spread over ``partitions``: the busiest pod (the
    one with the most partitions) sets the pace at its workers per partition, within the CPU's bound on
    workers per pod. 5 pods x 14 workers on 8 partitions drain as fast as 8 x 7: 56 either way."""
    if size.replicas <= 0:
        return 0.0
    workers = min(size.workers, workers_per_pod) if workers_per_pod is not None else size.workers
    if partitions <= 0:
        return float(size.replicas * workers)
    busiest = math.ceil(partitions / min(size.replicas, partitions))
    return workers * partitions / busiest


def on_current_pods(target: Size, current: Size, bound: Bound, limits: ScalingLimits, partitions: int) -> Size:
    """``target``'s drain capacity on the pods in place: a live resize of their workers, no rebalance
    (never fewer workers than they have), within the bounds."""
    drain = math.ceil(drain_capacity(target, partitions, bound.workers_per_pod))
    workers = max(workers_for(drain, current.replicas, partitions), current.workers)
    return fitted(Size(current.replicas, workers), bound, limits, partitions)


def shape(
    capacity: int,
    limits: ScalingLimits,
    partitions: int,
    max_replicas: int | None = None,
    max_workers_per_pod: int | None = None,
) -> Size:
    """Pods first (with the initial workers), up to the partition cap; then workers per pod. The
    pods spread the partitions evenly: 11 pods on 12 partitions leave one pod with two, which then
    needs twice the workers of the others (the group drains only as fast as that pod), so the same
    work takes 6 pods with two partitions each, or 12 with one (like KEDA's
    ``ensureEvenDistributionOfPartitions``)."""
    cap = replica_cap(limits, partitions)
    if max_replicas is not None:
        cap = max(min(cap, max_replicas), limits.min_replicas, 1)
    most_workers = limits.max_workers
    if max_workers_per_pod is not None:
        most_workers = max(min(most_workers, max_workers_per_pod), limits.min_workers)
    initial = min(max(limits.initial_workers, limits.min_workers), most_workers)
    wanted = min(max(math.ceil(capacity / initial), limits.min_replicas), cap)
    if wanted <= 0:
        return Size(0, initial)
    if partitions <= 0:
        return Size(wanted, min(max(math.ceil(capacity / wanted), initial), most_workers))
    # the fewest pods that give the busiest pod as few partitions as ``wanted`` pods would (or fewer)
    busiest = math.ceil(partitions / wanted)
    while True:
        replicas = min(max(math.ceil(partitions / busiest), limits.min_replicas), cap)
        workers = max(workers_for(capacity, replicas, partitions), initial)
        if workers <= most_workers or replicas >= cap:
            return Size(replicas, min(workers, most_workers))
        busiest -= 1  # more workers per pod than allowed: spread over more pods


# -- steps 8 and 9: the size ---------------------------------------------------------------------------
def activation_size(
    observation: Observation, limits: ScalingLimits, per_worker_rate: float | None, arrivals: float, partitions: int
) -> Size:
    """Below the activation lag: what keeps up with arrivals, at least one pod while any lag or
    arrival is pending, and zero (with ``scale_to_zero``) once nothing is left or arriving."""
    nothing_left = observation.lag == 0 or is_marker_residue(observation)  # a blocked key's lag stays
    arriving = (observation.arrival_rate or 0.0) > 0 or arrivals > 0
    if limits.scale_to_zero and nothing_left and not arriving:
        return Size(0, limits.initial_workers)
    keep_up = math.ceil(arrivals / limits.target_utilization / per_worker_rate) if per_worker_rate else 0
    pending = not nothing_left or arriving  # a blocked key's lag needs its pod too
    size = shape(max(keep_up, 1 if pending else 0), limits, partitions)
    if pending and size.replicas == 0:
        return Size(1, size.workers)  # never strand a message below the activation lag
    return size


def fitted(size: Size, bound: Bound, limits: ScalingLimits, partitions: int) -> Size:
    """``size`` within what can help: the replica cap and bound, the workers' range, the CPU's bound
    on workers per pod, and with ``ordering: partition`` no more workers than the pod's partitions."""
    cap = replica_cap(limits, partitions)
    if bound.replicas is not None:
        cap = max(min(cap, bound.replicas), limits.min_replicas, 1)
    replicas = min(size.replicas, cap)
    most = limits.max_workers
    if bound.workers_per_pod is not None:
        most = max(min(most, bound.workers_per_pod), limits.min_workers)
    if limits.partition_ordering and replicas:
        most = max(min(most, math.ceil(partitions / replicas)), limits.min_workers)
    return Size(replicas, min(max(size.workers, limits.min_workers), most))


def bounded_size(needed: int, bound: Bound, limits: ScalingLimits, partitions: int) -> Size:
    """The shape of ``needed`` workers within ``bound``."""
    if bound.capacity is not None:
        needed = min(needed, bound.capacity)
    size = shape(needed, limits, partitions, max_replicas=bound.replicas, max_workers_per_pod=bound.workers_per_pod)
    return fitted(size, bound, limits, partitions)


def within_tolerance(needed: int, current: Size, bound: Bound, limits: ScalingLimits, partitions: int) -> bool:
    """The needed workers differ from the current ones by no more than the tolerance, and the current
    size is one the bounds allow: keep it (HPA's tolerance)."""
    if current.replicas == 0 or current.capacity == 0 or needed <= 0:
        return False
    if fitted(current, bound, limits, partitions) != current or current.replicas < limits.min_replicas:
        return False
    natural = shape(
        current.capacity, limits, partitions, max_replicas=bound.replicas, max_workers_per_pod=bound.workers_per_pod
    )
    if natural.replicas != current.replicas:
        return False  # a rate-limited step (workers standing in for pods held back): grow into the shape
    return abs(needed / current.capacity - 1) <= limits.tolerance

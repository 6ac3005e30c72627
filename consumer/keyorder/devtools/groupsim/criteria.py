"""What a simulated run must satisfy, measured from its timeline against the simulation's ground truth.

The figures an SRE judges an autoscaler by: how long until the backlog drains within the target,
how far the size overshot what was needed, how many minutes it stayed below the arrivals while the
lag grew, how often it changed the replicas (each change is a rebalance) while the load was steady,
whether it ever scaled down while the lag grew, and whether the policy ever raised. ``Measured``
holds them for one run; ``failures`` compares them with the scenario's thresholds and its checks.
"""

from __future__ import annotations

import math

from keyorder.devtools.groupsim.definitions import Measured, Run
from keyorder_operator.policy import in_flight_lag, shape
from keyorder_operator.spec import parse_spec
from keyorder_operator.status import limits_from_spec

GROWTH_SHARE = 0.05
"""The lag grows when it rose over a poll interval by more than this share of what arrived in it
(plus the activation lag): a scale-down then is a failure."""


def measure(run: Run) -> Measured:
    scenario = run.scenario
    spec = parse_spec(scenario.spec_at(scenario.disturbance))
    limits = limits_from_spec(spec)
    target = limits.target_drain_seconds
    points = [p for p in run.points if p.t >= scenario.disturbance]
    interval = spec.scaling.poll_interval_seconds

    within: float | None = 0.0  # until the backlog is within the target for good
    for point in points:
        arrivals = scenario.arrivals(point.t)
        in_flight = in_flight_lag(arrivals, limits)
        net = point.capacity - arrivals
        if not (point.lag <= in_flight or (net > 0 and point.lag / net <= target)):
            within = point.t - scenario.disturbance + scenario.step_seconds
    if points and within is not None and within >= points[-1].t - scenario.disturbance:
        within = None  # still not within the target when the run ended

    needed = 0
    for point in points:
        if point.lag_unknown:
            continue
        rate = point.per_worker_rate
        want = math.ceil((point.lag / target + scenario.arrivals(point.t)) / rate) if rate else 0
        needed = max(needed, want)
    partitions = scenario.group.partitions
    needed_size = shape(max(needed, 1), limits, partitions)
    needed_shaped = needed_size.capacity if needed else 0
    polls = [p for p in run.polls if p.t >= scenario.disturbance]
    peak = max((p.target.capacity for p in polls), default=0)
    peak_replicas = max((p.target.replicas for p in polls), default=0)
    smallest = shape(0, limits, partitions)
    overshoot = peak / max(needed_shaped, smallest.capacity) if needed_shaped else None
    needed_replicas = max(needed_size.replicas, smallest.replicas, 1) if needed else 0
    replica_overshoot = peak_replicas / needed_replicas if needed_replicas else None

    by_time = {round(p.t, 6): p for p in run.points}
    under = 0.0
    for point in points:
        before = by_time.get(round(point.t - interval, 6))
        growing = before is not None and point.lag > before.lag
        decided = point.replicas * point.workers * point.per_worker_rate
        if growing and decided < scenario.arrivals(point.t) and not point.paused and not point.lag_unknown:
            under += scenario.step_seconds / 60

    changes = None
    if scenario.criteria.steady is not None:
        window = scenario.criteria.steady
        count = sum(1 for p in run.polls if window.holds(p.t) and p.target.replicas != p.before.replicas)
        hours = (min(window.end, scenario.duration) - window.start) / 3600
        changes = count / hours if hours > 0 else None

    shrinks = []
    for poll in run.polls:
        if not (poll.target.replicas < poll.before.replicas or poll.target.capacity < poll.before.capacity):
            continue
        now, before = by_time.get(round(poll.t, 6)), by_time.get(round(poll.t - interval, 6))
        if now is None or before is None:
            continue
        arrived = sum(p.arrival_rate for p in run.points if before.t < p.t <= now.t) * scenario.step_seconds
        if now.lag - before.lag > GROWTH_SHARE * arrived + limits.activation_lag:
            shrinks.append(f"t={poll.t:.0f} s: {poll.reason}")

    return Measured(
        run=run,
        seconds_to_within_target=within,
        overshoot=overshoot,
        peak_workers=peak,
        needed_workers=needed_shaped,
        replica_overshoot=replica_overshoot,
        peak_replicas=peak_replicas,
        needed_replicas=needed_replicas,
        underprovisioned_minutes=under,
        replica_changes_per_hour=changes,
        scale_downs_while_growing=shrinks,
        exceptions=[f"t={p.t:.0f} s: {p.exception}" for p in run.polls if p.exception],
    )


def failures(measured: Measured) -> list[str]:
    """Every threshold the run missed, and every check that failed, with the numbers (empty: it passed)."""
    criteria = measured.run.scenario.criteria
    found = [f"exception {text}" for text in measured.exceptions]
    found += [f"scaled down while the lag grew ({text})" for text in measured.scale_downs_while_growing[:3]]
    if criteria.within_target_seconds is not None:
        took = measured.seconds_to_within_target
        if took is None or took > criteria.within_target_seconds:
            shown = "never" if took is None else f"{took:.0f} s"
            found.append(f"backlog within target after {shown} (at most {criteria.within_target_seconds:.0f} s)")
    overshoot, most = measured.overshoot, criteria.max_overshoot
    if overshoot is not None and most is not None and overshoot > most:
        found.append(
            f"overshoot {overshoot:.2f}x ({measured.peak_workers} workers where {measured.needed_workers} "
            f"were needed; at most {most}x)"
        )
    under = criteria.max_underprovisioned_minutes
    if under is not None and measured.underprovisioned_minutes > under:
        found.append(
            f"under-provisioned while the lag grew for {measured.underprovisioned_minutes:.1f} min (at most {under})"
        )
    changes, allowed = measured.replica_changes_per_hour, criteria.max_replica_changes_per_hour
    if changes is not None and allowed is not None and changes > allowed:
        found.append(f"{changes:.1f} replica changes per hour at steady load (at most {allowed})")
    for check in measured.run.scenario.checks:
        problem = check(measured)
        if problem is not None:
            found.append(problem)
    return found

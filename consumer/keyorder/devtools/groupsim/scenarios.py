"""The named scenarios of ``keyorder simulate``: a workload over time, the resource's spec, what goes
wrong, and the thresholds its run must meet.

A scenario is data: arrivals as a function of time (plus noise and bursts), the OrderedConsumer spec
as a user writes it (camelCase, parsed by the operator's own parser), the images' handler times,
the group's mechanics (start delay, rebalance pause, eager or incremental), and windows in which
pods go silent, the lag cannot be read or the resource is paused. Its ``Criteria`` hold the
thresholds; ``checks`` add what only that scenario can show. To add one, append to ``SCENARIOS``.
The types (``Scenario``, ``Criteria``, ``Window``, ``Silence``, ``Check``) live in ``definitions``, below
the driver and the judge that use them; this module is the catalogue.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

from keyorder.devtools.groupsim.definitions import (
    Check,
    Criteria,
    Measured,
    Scenario,
    Silence,
    Window,
    _merge,
)
from keyorder.devtools.groupsim.model import GroupSettings, Workload
from keyorder_operator.policy import in_flight_lag, shape
from keyorder_operator.spec import parse_spec
from keyorder_operator.status import limits_from_spec


# -- the building blocks -------------------------------------------------------------------------------------
def constant(ms: float) -> Callable[[float], float]:
    return lambda t: ms


def steps(*points: tuple[float, float]) -> Callable[[float], float]:
    """A piecewise-constant function: ``(from t, value)`` pairs in time order."""

    def value(t: float) -> float:
        current = points[0][1]
        for at, level in points:
            if t >= at:
                current = level
        return current

    return value


def ramp(start: float, end: float, low: float, high: float) -> Callable[[float], float]:
    def value(t: float) -> float:
        if t <= start:
            return low
        if t >= end:
            return high
        return low + (high - low) * (t - start) / (end - start)

    return value


def square_wave(high: float, low: float, period: float) -> Callable[[float], float]:
    """``high`` for the first half of every ``period`` seconds, ``low`` for the second: a periodic producer."""
    return lambda t: high if t % period < period / 2 else low


APP = "registry.example/orders:1.0"
APP_SLOWER = "registry.example/orders:1.1"
TEN_MS = {APP: Workload(APP, constant(0.010))}


def spec(**changes: Any) -> dict[str, Any]:
    """The OrderedConsumer spec most scenarios use (operator defaults but a few), changed by ``changes``."""
    base: dict[str, Any] = {
        "kafka": {"bootstrapServers": "kafka.simulated:9092", "topics": ["orders"], "groupId": "orders"},
        "handler": {"image": APP, "handler": "orders.handlers:handle"},
        "workers": {"min": 1, "initial": 16, "max": 256},
        "scaling": {"pollIntervalSeconds": 15, "targetDrainSeconds": 300},
    }
    _merge(base, changes)
    return base


# -- scenario-specific checks ------------------------------------------------------------------------------------
def limited_by(kind: str) -> Check:
    def check(measured: Measured) -> str | None:
        kinds = {poll.limited for poll in measured.run.polls}
        return (
            None
            if kind in kinds
            else f"never said scaling is limited by {kind} (saw {sorted(k or '-' for k in kinds)})"
        )

    return check


def no_change_during(windows_of: Callable[[Scenario], tuple[Window, ...]], what: str) -> Check:
    def check(measured: Measured) -> str | None:
        windows = windows_of(measured.run.scenario)
        changed = [p for p in measured.run.polls if any(w.holds(p.t) for w in windows) and p.target != p.before]
        return None if not changed else f"changed the size {what} at t={changed[0].t:.0f} s ({changed[0].reason})"

    return check


def replicas_at(t: float, wanted: int, how: str = "==") -> Check:
    def check(measured: Measured) -> str | None:
        point = next((p for p in measured.run.points if p.t >= t), None)
        if point is None:
            return f"the run ended before t={t:.0f} s"
        ok = point.replicas == wanted if how == "==" else point.replicas >= wanted
        return None if ok else f"replicas at t={t:.0f} s: {point.replicas}, expected {how} {wanted}"

    return check


def workers_per_pod_at_most(most: int, after: float) -> Check:
    def check(measured: Measured) -> str | None:
        over = [p for p in measured.run.polls if p.t >= after and p.target.workers > most]
        return None if not over else f"{over[0].target.workers} workers per pod at t={over[0].t:.0f} s (bound {most})"

    return check


def decided_capacity_at_most(most: int) -> Check:
    def check(measured: Measured) -> str | None:
        peak = max((p.target.capacity for p in measured.run.polls), default=0)
        return None if peak <= most else f"peak {peak} workers, expected at most {most}"

    return check


def caveat_said(reason: str) -> Check:
    def check(measured: Measured) -> str | None:
        said = any(poll.caveat == reason for poll in measured.run.polls)
        return None if said else f"never said {reason}"

    return check


def most_replicas_while_draining(most: int) -> Check:
    """At most ``most`` pods until the backlog is gone (more pods that drain no faster only move partitions)."""

    def check(measured: Measured) -> str | None:
        scenario = measured.run.scenario
        drained = next((p.t for p in measured.run.points if p.t > scenario.disturbance and p.lag <= 5_000), None)
        draining = [p for p in measured.run.polls if scenario.disturbance < p.t < (drained or math.inf)]
        over = [p for p in draining if p.target.replicas > most]
        return None if not over else f"{over[0].target.replicas} pods at t={over[0].t:.0f} s ({over[0].reason})"

    return check


def no_flap_within(seconds: float) -> Check:
    """No replica change undone within ``seconds`` (each is a rebalance)."""

    def check(measured: Measured) -> str | None:
        changes = [
            (p.t, p.before.replicas, p.target.replicas)
            for p in measured.run.polls
            if p.target.replicas != p.before.replicas
        ]
        for (t1, a, b), (t2, c, d) in itertools.pairwise(changes):
            if t2 - t1 <= seconds and (b - a) * (d - c) < 0:
                return f"replicas {a}->{b} at t={t1:.0f} s and {c}->{d} at t={t2:.0f} s"
        return None

    return check


def peak_within_need_after(end: float, most: float) -> Check:
    """Peak decided workers at most ``most`` x the workers the burst leaves to do once it ended at ``end``:
    its volume above the rate after it (from the scenario, not from the run, so a policy that lets more
    backlog build does not raise its own allowance) drained within the target, plus the arrivals after it,
    at the true per-worker rate; shaped as the policy shapes them. A burst that is over is a backlog to
    drain, not a rate to keep up with."""

    def check(measured: Measured) -> str | None:
        scenario = measured.run.scenario
        limits = limits_from_spec(parse_spec(scenario.spec_at(end)))
        after = scenario.arrivals(end)
        step = scenario.step_seconds
        volume = sum(
            max(scenario.arrivals(scenario.disturbance + i * step) - after, 0.0) * step
            for i in range(math.ceil((end - scenario.disturbance) / step))
        )
        true_rate = next((p.per_worker_rate for p in measured.run.points if p.t >= end and p.per_worker_rate), None)
        if not true_rate:
            return "no per-worker rate after the burst"
        needed = max(math.ceil((volume / limits.target_drain_seconds + after) / true_rate), 1)
        shaped = shape(needed, limits, scenario.group.partitions).capacity
        peak = max((p.target.capacity for p in measured.run.polls if p.t >= scenario.disturbance), default=0)
        return (
            None
            if peak <= most * shaped
            else f"peak {peak} workers, {peak / shaped:.1f}x the {shaped} needed after the burst ended "
            f"(at most {most}x)"
        )

    return check


def shrinks_once_quiet(window: float, slack: float) -> Check:
    """Once the lag has been within what is in flight (``policy.in_flight_lag``) for ``window`` seconds after
    the disturbance, the replicas are below their peak within ``slack`` seconds more: a pod that does not
    report does not hold the group at its peak."""

    def check(measured: Measured) -> str | None:
        scenario = measured.run.scenario
        limits = limits_from_spec(parse_spec(scenario.spec_at(scenario.disturbance)))
        points = [p for p in measured.run.points if p.t >= scenario.disturbance]
        peak = max((p.replicas for p in points), default=0)
        quiet_since: float | None = None
        for point in points:
            in_flight = in_flight_lag(scenario.arrivals(point.t), limits)
            if point.lag > in_flight:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = point.t
            if quiet_since is not None and point.t >= quiet_since + window + slack:
                if point.replicas < peak:
                    return None
                return (
                    f"lag within what is in flight since t={quiet_since:.0f} s, still {point.replicas} replicas "
                    f"(the peak) at t={point.t:.0f} s"
                )
        return "the lag never stayed within what is in flight for the window"

    return check


# -- the scenarios -----------------------------------------------------------------------------------------------
HOUR = 3600.0

SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        name="spike",
        summary="1,000/s steady, then 1.8 M messages arrive within a minute: scale out once, drain, scale back in",
        spec=spec(),
        duration=1.5 * HOUR,
        arrivals=steps((0, 1_000), (600, 31_000), (660, 1_000)),
        disturbance=600,
        workloads=TEN_MS,
        criteria=Criteria(within_target_seconds=540, max_overshoot=1.6, max_underprovisioned_minutes=2),
        checks=(no_flap_within(300),),
    ),
    Scenario(
        name="spike-eager",
        summary="the spike with eager rebalances (range): every partition pauses on every membership change",
        spec=spec(),
        duration=1.5 * HOUR,
        arrivals=steps((0, 1_000), (600, 31_000), (660, 1_000)),
        disturbance=600,
        workloads=TEN_MS,
        group=GroupSettings(incremental=False),
        criteria=Criteria(within_target_seconds=540, max_overshoot=1.6, max_underprovisioned_minutes=2),
    ),
    Scenario(
        name="burst",
        summary="1 M messages land within one poll on top of 500/s: counted once (in the lag), not also as arrivals",
        spec=spec(),
        duration=1.0 * HOUR,
        arrivals=constant(500),
        bursts=((600.5, 1_000_000),),
        disturbance=600,
        workloads=TEN_MS,
        criteria=Criteria(within_target_seconds=480, max_overshoot=1.6, max_underprovisioned_minutes=1),
    ),
    Scenario(
        name="big-burst",
        summary="4 M messages within one poll on top of 500/s: the first step is rate-limited to 5 pods, whose "
        "workers carry the burst; no second step that would drain no faster",
        spec=spec(),
        duration=1.0 * HOUR,
        arrivals=constant(500),
        bursts=((600.5, 4_000_000),),
        disturbance=600,
        workloads=TEN_MS,
        criteria=Criteria(within_target_seconds=480, max_overshoot=1.6, max_underprovisioned_minutes=1),
        checks=(most_replicas_while_draining(5),),
    ),
    Scenario(
        name="slow-ramp",
        summary="arrivals ramp from 500/s to 12,000/s over an hour, then hold: the size follows without falling behind",
        spec=spec(),
        duration=2.0 * HOUR,
        arrivals=ramp(600, 600 + HOUR, 500, 12_000),
        disturbance=600,
        noise=0.05,
        workloads=TEN_MS,
        criteria=Criteria(
            within_target_seconds=600,
            max_overshoot=1.6,
            max_underprovisioned_minutes=3,
            max_replica_changes_per_hour=2,
            steady=Window(600 + HOUR + 900, 2.0 * HOUR),
        ),
    ),
    Scenario(
        name="noisy-steady",
        summary="4,400/s +-10% for 2 h where 3 pods handle 4,800/s: a stable size, at most 2 replica changes an hour",
        spec=spec(),
        duration=2.0 * HOUR,
        arrivals=constant(4_400),
        noise=0.10,
        initial_replicas=3,
        workloads=TEN_MS,
        criteria=Criteria(
            max_underprovisioned_minutes=1,
            max_replica_changes_per_hour=2,
            steady=Window(1800, 2.0 * HOUR),
            max_overshoot=2.0,
        ),
    ),
    Scenario(
        name="noisy-boundary",
        summary="3,700/s +-10% where 80% of 3 pods is 3,840/s: noise right at a capacity boundary does not flap",
        spec=spec(),
        duration=2.0 * HOUR,
        arrivals=constant(3_700),
        noise=0.10,
        initial_replicas=3,
        workloads=TEN_MS,
        criteria=Criteria(max_replica_changes_per_hour=2, steady=Window(1800, 2.0 * HOUR), max_overshoot=2.0),
    ),
    Scenario(
        name="handler-slowdown",
        summary="20,000/s falls to 2,000/s, and while 12 pods are still up the handler slows 10 -> 100 ms for 30 min",
        spec=spec(),
        duration=1.5 * HOUR,
        arrivals=steps((0, 20_000), (1100, 2_000)),
        initial_replicas=12,
        disturbance=1200,
        workloads={APP: Workload(APP, steps((0, 0.010), (1200, 0.100), (3000, 0.010)))},
        criteria=Criteria(within_target_seconds=300, max_underprovisioned_minutes=1, max_overshoot=1.6),
        checks=(replicas_at(1500, 12),),
    ),
    Scenario(
        name="handler-slowdown-needs-more",
        summary="3 pods keep up with 3,000/s until the handler slows 10 -> 100 ms: grow to the new need at once",
        spec=spec(),
        duration=1.5 * HOUR,
        arrivals=constant(3_000),
        initial_replicas=3,
        disturbance=1200,
        workloads={APP: Workload(APP, steps((0, 0.010), (1200, 0.100), (3000, 0.010)))},
        criteria=Criteria(within_target_seconds=300, max_underprovisioned_minutes=2, max_overshoot=1.6),
    ),
    Scenario(
        name="one-silent-pod",
        summary="one of 2 pods stops answering its report (CPU-starved) as arrivals go from 2,000 to 12,000/s",
        spec=spec(),
        duration=1.5 * HOUR,
        arrivals=steps((0, 2_000), (600, 12_000)),
        initial_replicas=2,
        disturbance=600,
        silences=(Silence(Window(300)),),
        workloads=TEN_MS,
        criteria=Criteria(within_target_seconds=420, max_underprovisioned_minutes=2, max_overshoot=1.6),
        checks=(caveat_said("PodsNotReporting"),),
    ),
    Scenario(
        name="all-pods-silent",
        summary="no pod answers its report from t=5 min as arrivals go 2,000 -> 8,000/s: scale on Kafka's lag alone",
        spec=spec(),
        duration=1.5 * HOUR,
        arrivals=steps((0, 2_000), (600, 8_000)),
        initial_replicas=2,
        disturbance=600,
        silences=(Silence(Window(300), pods=None),),
        workloads=TEN_MS,
        # max_overshoot: with nobody to push the worker count to, the drain per decided worker fell and
        # an earlier policy ratcheted to 12 x 256 (32x the need)
        criteria=Criteria(within_target_seconds=600, max_underprovisioned_minutes=3, max_overshoot=2.0),
        checks=(caveat_said("PodsNotReporting"),),
    ),
    Scenario(
        name="lag-unknown",
        summary="Kafka's offsets cannot be read for 10 min while a backlog arrives: keep the size, then catch up",
        spec=spec(),
        duration=1.5 * HOUR,
        arrivals=steps((0, 2_000), (700, 20_000), (760, 2_000)),
        disturbance=1200,
        lag_unknown=(Window(600, 1200),),
        workloads=TEN_MS,
        criteria=Criteria(within_target_seconds=540, max_overshoot=1.6),
        checks=(no_change_during(lambda s: s.lag_unknown, "while the lag was unknown"),),
    ),
    Scenario(
        name="hot-key",
        summary="a 1.2 M backlog, one key holds 90% of a partition: size the rest for that key's time, say HotKey",
        spec=spec(),
        duration=1.5 * HOUR,
        arrivals=constant(500),
        initial_backlog=1_200_000,
        hot_keys=((0, 0.9),),
        workloads=TEN_MS,
        checks=(limited_by("hot_key"), decided_capacity_at_most(64)),
    ),
    Scenario(
        name="blocked-key",
        summary="a key fails forever (onExhausted: block) on one partition: its pinned lag never scales the group",
        spec=spec(retry={"onExhausted": "block"}),
        duration=1.0 * HOUR,
        arrivals=constant(2_000),
        initial_replicas=2,
        disturbance=300,
        blocked_keys=((3, 300.0),),
        workloads=TEN_MS,
        checks=(limited_by("blocked_key"), decided_capacity_at_most(48)),
    ),
    Scenario(
        name="lag-on-few-partitions",
        summary="limitToPartitionsWithLag, 12 pods busy; for one poll only 3 partitions have lag: no 12->3->12",
        spec=spec(scaling={"limitToPartitionsWithLag": True}),
        duration=1.0 * HOUR,
        arrivals=constant(20_000),
        weights=lambda t: (1.0,) * 3 + (0.0,) * 9 if 1200 <= t < 1215 or 2400 <= t < 2415 else None,
        initial_replicas=12,
        workloads=TEN_MS,
        criteria=Criteria(max_replica_changes_per_hour=2, steady=Window(900, 1.0 * HOUR), max_overshoot=2.0),
        checks=(no_flap_within(300), replicas_at(1300, 12), replicas_at(2500, 12)),
    ),
    Scenario(
        name="scale-to-zero",
        summary="a backlog drains, nothing arrives: down to zero pods; then 100/s arrive: wake within a poll or two",
        spec=spec(replicas={"min": 0}, scaling={"scaleToZero": True, "activationLag": 0}),
        duration=1.0 * HOUR,
        arrivals=steps((0, 0), (1800, 100)),
        initial_backlog=20_000,
        workloads=TEN_MS,
        checks=(replicas_at(1500, 0), replicas_at(1850, 1, ">=")),
    ),
    Scenario(
        name="pause-during-spike",
        summary="paused (the lag unreadable for a while) while a spike lands: nothing changes, not even the fallback",
        spec=spec(scaling={"fallback": {"failureThreshold": 3, "replicas": 6}}),
        duration=1.5 * HOUR,
        arrivals=steps((0, 1_000), (600, 31_000), (660, 1_000)),
        disturbance=1500,
        paused=(Window(500, 1500),),
        lag_unknown=(Window(900, 1200),),
        workloads=TEN_MS,
        criteria=Criteria(within_target_seconds=480, max_overshoot=1.6),
        checks=(no_change_during(lambda s: s.paused, "while paused"),),
    ),
    Scenario(
        name="fallback",
        summary="the lag cannot be read for 10 min: after 3 failed polls the group goes to fallback.replicas",
        spec=spec(scaling={"fallback": {"failureThreshold": 3, "replicas": 4}}),
        duration=1.0 * HOUR,
        arrivals=constant(2_000),
        initial_replicas=2,
        lag_unknown=(Window(600, 1200),),
        workloads=TEN_MS,
        checks=(replicas_at(700, 4),),
    ),
    Scenario(
        name="new-image-mid-drain",
        summary="a new image with a 3x slower handler rolls out mid-drain: learn it again, never shrink into it",
        spec=spec(),
        duration=1.5 * HOUR,
        arrivals=steps((0, 1_000), (300, 21_000), (360, 1_000)),
        disturbance=300,
        spec_changes=((600, {"handler": {"image": APP_SLOWER}}),),
        workloads={APP: Workload(APP, constant(0.010)), APP_SLOWER: Workload(APP_SLOWER, constant(0.030))},
        criteria=Criteria(within_target_seconds=900, max_underprovisioned_minutes=3, max_overshoot=2.0),
    ),
    Scenario(
        name="cpu-bound-process",
        summary="a CPU-bound handler on the process executor, 2 cores per pod: never more workers per pod than cores",
        spec=spec(handler={"executor": "process"}, workers={"initial": 1, "max": 64}),
        duration=1.0 * HOUR,
        arrivals=steps((0, 100), (600, 600), (700, 100)),
        disturbance=600,
        group=GroupSettings(executor="process", cores_per_pod=2.0),
        workloads={APP: Workload(APP, constant(0.005), cpu_per_message=0.005)},
        criteria=Criteria(within_target_seconds=600),
        checks=(workers_per_pod_at_most(2, after=20),),
    ),
    Scenario(
        name="burst-ends",
        summary="40,000/s for 45 s on top of 800/s, over before new pods could help: size for its backlog, "
        "not its rate (peak workers at most 3x the need once it ended)",
        spec=spec(),
        duration=1.0 * HOUR,
        arrivals=steps((0, 800), (600, 40_000), (645, 800)),
        disturbance=600,
        workloads=TEN_MS,
        criteria=Criteria(within_target_seconds=480, max_underprovisioned_minutes=2),
        checks=(peak_within_need_after(645, 3.0),),
    ),
    Scenario(
        name="silent-pod-idle",
        summary="one pod stops answering its report, a spike comes and drains: once the lag has been 0 for the "
        "scale-down window, the group scales in anyway",
        spec=spec(),
        duration=1.0 * HOUR,
        arrivals=steps((0, 1_000), (600, 31_000), (660, 1_000)),
        disturbance=600,
        silences=(Silence(Window(300)),),
        workloads=TEN_MS,
        criteria=Criteria(within_target_seconds=540, max_overshoot=1.6),
        checks=(caveat_said("PodsNotReporting"), shrinks_once_quiet(300, 120)),
    ),
    Scenario(
        name="periodic-producer",
        summary="4,000/s and 2,000/s in turns of 15 s (a batch producer): one uneven level, sized for it, "
        "not for the lower half",
        spec=spec(),
        duration=1.0 * HOUR,
        arrivals=square_wave(4_000, 2_000, 30),
        disturbance=600,
        workloads=TEN_MS,
        criteria=Criteria(within_target_seconds=540, max_underprovisioned_minutes=2),
    ),
    Scenario(
        name="on-off-producer",
        summary="6,000/s for 15 s, then nothing for 15 s, all hour: sized for the level it sends at, never "
        "for the silent half",
        spec=spec(),
        duration=1.0 * HOUR,
        arrivals=square_wave(6_000, 0, 30),
        disturbance=600,
        workloads=TEN_MS,
        criteria=Criteria(within_target_seconds=540, max_underprovisioned_minutes=2),
    ),
    Scenario(
        name="fast-ramp",
        summary="arrivals ramp from 500/s to 20,000/s over 10 min, then hold: a rise that lasts is followed, "
        "not held back as a burst",
        spec=spec(),
        duration=1.0 * HOUR,
        arrivals=ramp(600, 1200, 500, 20_000),
        disturbance=600,
        workloads=TEN_MS,
        criteria=Criteria(within_target_seconds=600, max_underprovisioned_minutes=3),
    ),
)
"""Every scenario ``keyorder simulate`` knows, in the order ``--list`` shows them."""


def by_name(name: str) -> Scenario:
    for scenario in SCENARIOS:
        if scenario.name == name:
            return scenario
    raise KeyError(name)

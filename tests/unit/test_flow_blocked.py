"""FlowControl with partitions that cannot drain (issue 36, defect 2): a blocked key under
``onExhausted: block``, a long retry, a slow lane. They used to hold the pod at its bound, which
paused every partition until the pod drained: never, so the healthy partitions, and those
assigned later, were never read again.

Pure: explicit loads and times. A partition's in-flight messages are part of its uncommitted ones."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keyorder.core.flow import CEILING, FlowControl, FlowLimits, Load

# Per partition (2 assigned): 50 in flight, 200 uncommitted; pod: 100 and 400.
TWO = FlowLimits(max_inflight=100, max_inflight_per_partition=100, max_uncommitted=400, pause_after=0.5)


def pod(loads: dict[str, Load], revoked_inflight: int = 0) -> Load:
    return Load(
        sum(load.inflight for load in loads.values()) + revoked_inflight,
        sum(load.uncommitted for load in loads.values()),
    )


def test_a_partition_blocked_at_its_uncommitted_bound_does_not_keep_the_other_paused() -> None:
    """2 partitions, resume ratio 0.5: the blocked one holds half the pod bound for good."""
    flow = FlowControl(TWO)
    loads = {"blocked": Load(1, 200), "healthy": Load(10, 200)}  # both at their bounds: the pod at its own
    decision = flow.decide(loads, pod(loads), 0.0)
    assert sorted(decision.to_pause) == ["blocked", "healthy"]
    loads = {"blocked": Load(1, 200), "healthy": Load(0, 100)}  # healthy committed to its low-water mark
    decision = flow.decide(loads, pod(loads), 1.0)
    assert decision.to_resume == ["healthy"] and decision.hold is None
    assert flow.paused == {"blocked"}
    assert flow.capacity(pod(loads)) == 99, "the pod's headroom (99 in flight)"


def test_a_partition_blocked_at_its_inflight_bound_does_not_keep_the_other_paused() -> None:
    flow = FlowControl(TWO)
    loads = {"slow": Load(50, 50), "healthy": Load(50, 50)}
    decision = flow.decide(loads, pod(loads), 0.0)
    assert decision.to_pause == [] and decision.hold == pytest.approx(0.5)
    decision = flow.decide(loads, pod(loads), 0.5)
    assert sorted(decision.to_pause) == ["healthy", "slow"], "both outlasted their holds"
    loads = {"slow": Load(50, 50), "healthy": Load(25, 25)}
    decision = flow.decide(loads, pod(loads), 1.0)
    assert decision.to_resume == ["healthy"] and decision.hold is None
    assert flow.capacity(pod(loads)) == 25


def test_a_partition_assigned_after_a_blocked_one_filled_the_pod_is_read() -> None:
    """Alone, the blocked partition's bound was the whole pod's; its fair share shrinks as others come."""
    flow = FlowControl(FlowLimits(max_inflight=400, max_inflight_per_partition=400, max_uncommitted=400))
    loads = {"blocked": Load(1, 400)}
    assert flow.decide(loads, pod(loads), 0.0).to_pause == ["blocked"]
    loads = {"blocked": Load(1, 400), "new": Load(0, 0)}
    decision = flow.decide(loads, pod(loads), 1.0)
    assert decision.to_pause == [] and decision.hold is None and flow.paused == {"blocked"}
    assert flow.capacity(pod(loads)) == 200, "blocked counts only up to its bound now (200 of 400)"
    loads = {"blocked": Load(1, 400), "new": Load(0, 0), "newer": Load(0, 0)}
    decision = flow.decide(loads, pod(loads), 2.0)
    assert flow.paused == {"blocked"} and decision.hold is None
    assert flow.capacity(pod(loads)) == 133, "one partition bound: 400 / 3"


def test_a_partition_assigned_after_a_slow_one_filled_the_pod_in_flight_is_read_within_pause_after() -> None:
    flow = FlowControl(TWO)
    loads = {"slow": Load(100, 100)}
    assert flow.decide(loads, pod(loads), 0.0).hold == pytest.approx(0.5)
    loads = {"slow": Load(100, 100), "new": Load(0, 0)}
    decision = flow.decide(loads, pod(loads), 0.2)
    assert decision.to_pause == [] and decision.hold == pytest.approx(0.3), "slow's hold goes on"
    decision = flow.decide(loads, pod(loads), 0.5)
    assert decision.to_pause == ["slow"] and decision.hold is None
    assert flow.capacity(pod(loads)) == 50, "one partition bound"


def test_handlers_still_running_for_revoked_partitions_do_not_stop_the_reading() -> None:
    flow = FlowControl(TWO)
    loads = {"p0": Load(49, 49), "p1": Load(40, 40)}  # under their bounds; 11 handlers of a revoked partition
    decision = flow.decide(loads, pod(loads, revoked_inflight=11), 0.0)
    assert flow.paused == set() and decision.hold is None
    assert flow.capacity(pod(loads, revoked_inflight=11)) == 11


# -- properties ------------------------------------------------------------------------------------


@dataclass
class SimulatedPod:
    """Partitions read by the rule's answers, some of them blocked (never finish, never commit)."""

    flow: FlowControl[str]
    inflight: dict[str, int] = field(default_factory=dict)
    uncommitted: dict[str, int] = field(default_factory=dict)
    blocked: set[str] = field(default_factory=set)
    read_under: dict[str, Load] = field(default_factory=dict)
    """Each partition's bounds when it was last read."""
    now: float = 0.0

    def loads(self) -> dict[str, Load]:
        return {name: Load(self.inflight[name], self.uncommitted[name]) for name in self.inflight}

    def total(self) -> Load:
        return Load(sum(self.inflight.values()), sum(self.uncommitted.values()))

    def memory_bound(self) -> Load:
        """The module docstring's: B + 2 * (the bounds each partition was last read under), and never
        past the ceiling (CEILING * B)."""
        limits = self.flow.limits
        return Load(
            min(
                limits.max_inflight + 2 * sum(bound.inflight for bound in self.read_under.values()),
                CEILING * limits.max_inflight,
            ),
            min(
                limits.max_uncommitted + 2 * sum(bound.uncommitted for bound in self.read_under.values()),
                CEILING * limits.max_uncommitted,
            ),
        )


def actions(partitions: int) -> st.SearchStrategy[tuple]:
    """What happens to partitions p0 .. p<partitions - 1>, and to time."""
    index = st.integers(0, partitions - 1)
    return st.one_of(
        st.tuples(st.just("assign"), index),
        st.tuples(st.just("revoke"), index),
        st.tuples(st.just("block"), index),
        st.tuples(st.just("finish"), index, st.integers(1, 30)),
        st.tuples(st.just("commit"), index),
        st.tuples(st.just("tick"), st.sampled_from([0.125, 0.375, 0.625, 1.5])),  # exact in binary: holds end exactly
        *[st.tuples(st.just("read"), st.lists(index, min_size=1, max_size=3))] * 3,  # reads, mostly
    )


LIMITS = st.builds(
    FlowLimits,
    max_inflight=st.integers(5, 40),
    max_inflight_per_partition=st.integers(1, 40),
    max_uncommitted=st.integers(40, 120),
    resume_ratio=st.sampled_from([0.2, 0.5, 0.8]),
    pause_after=st.sampled_from([0.0, 0.5]),
)


def run(limits: FlowLimits, steps: list[tuple], assignments: bool) -> None:
    """Play ``steps``; after each decision check that every partition under its bounds may be read
    within ``pause_after`` unless the pod is at its ceiling, and after each read the memory bound.
    ``assignments``: assign and revoke act (else the first three partitions stay assigned throughout)."""
    sim = SimulatedPod(FlowControl(limits))
    for name in ("p0", "p1", "p2"):
        sim.inflight[name] = sim.uncommitted[name] = 0
    for action in steps:
        kind, name = action[0], f"p{action[1]}" if action[0] != "tick" else ""
        if kind == "tick":
            sim.now += action[1]
        elif kind == "assign" and assignments and name not in sim.inflight:
            sim.inflight[name] = sim.uncommitted[name] = 0
        elif kind == "revoke" and assignments and name in sim.inflight:
            del sim.inflight[name], sim.uncommitted[name]
            sim.blocked.discard(name)
            sim.read_under.pop(name, None)
        elif kind == "block" and name in sim.inflight:
            sim.blocked.add(name)
        elif kind == "finish" and name in sim.inflight and name not in sim.blocked:
            sim.inflight[name] = max(sim.inflight[name] - action[2], 0)
        elif kind == "commit" and name in sim.inflight and name not in sim.blocked:
            sim.uncommitted[name] = sim.inflight[name]  # everything finished is committed
        elif kind == "read":
            read(sim, [f"p{index}" for index in action[1]], fixed_assignment=not assignments)


def read(sim: SimulatedPod, targets: list[str], fixed_assignment: bool) -> None:
    """Decide, check liveness, then read all the capacity into ``targets`` (those that may be read),
    and check the memory bound."""
    flow, limits = sim.flow, sim.flow.limits
    loads = sim.loads()
    decision = flow.decide(loads, sim.total(), sim.now)
    bound = flow.partition_bound(len(loads))
    if flow.at_ceiling:
        assert flow.paused == set(loads), f"at the ceiling with {sim.total()}, but {flow.paused} paused of {loads}"
    for name, load in loads.items():
        if (
            load.inflight < bound.inflight * limits.resume_ratio
            and load.uncommitted < bound.uncommitted * limits.resume_ratio
            and not flow.at_ceiling
        ):
            assert name not in flow.paused, f"{name} at {load} is under its low-water marks but paused"
    assert decision.hold is None or 0 < decision.hold <= limits.pause_after
    readable = [name for name in targets if name in loads and name not in flow.paused]
    if decision.hold is not None or not readable:
        return
    capacity = flow.capacity(sim.total())
    assert capacity >= 1, f"{readable} may be read, but the pod takes nothing"
    for index in range(capacity):
        name = readable[index % len(readable)]
        sim.inflight[name] += 1
        sim.uncommitted[name] += 1
        sim.read_under[name] = bound
    total, memory_bound = sim.total(), sim.memory_bound()
    assert total.inflight <= memory_bound.inflight and total.uncommitted <= memory_bound.uncommitted, (
        f"{total} past the memory bound {memory_bound}"
    )
    if fixed_assignment and len(loads) <= limits.max_inflight:
        fixed = 3 * limits.max_inflight, 3 * limits.max_uncommitted
        assert total.inflight < fixed[0] and total.uncommitted < fixed[1], f"{total} at or past 3 * the pod bounds"
        assert not flow.at_ceiling, "a fixed assignment never reaches the ceiling"


@settings(max_examples=150)
@given(limits=LIMITS, steps=st.lists(actions(3), min_size=20, max_size=80))
def test_reading_keeps_within_the_memory_bound_and_reaches_every_partition_under_its_bounds(
    limits: FlowLimits, steps: list[tuple]
) -> None:
    """A fixed assignment: the pod holds under 3 * its bounds (its ceiling is never reached), and no
    partition under its low-water marks is paused, however many partitions are blocked at their bounds."""
    run(limits, steps, assignments=False)


@settings(max_examples=300)
@given(limits=LIMITS, steps=st.lists(actions(12), min_size=40, max_size=120))
def test_partitions_assigned_and_revoked_while_others_are_blocked_keep_within_the_memory_bound(
    limits: FlowLimits, steps: list[tuple]
) -> None:
    """Up to 12 partitions, assigned one at a time beside blocked ones: never past the ceiling, and
    every partition is paused while the pod is at it."""
    run(limits, steps, assignments=True)


@settings(max_examples=150)
@given(
    pause_after=st.sampled_from([0.0, 0.5]),
    steps=st.lists(
        st.dictionaries(
            st.sampled_from(["p0", "p1", "p2", "p3"]),
            st.one_of(st.just(Load(0, 0)), st.builds(Load, st.integers(0, 60), st.integers(60, 200))),
            min_size=1,
        ),
        max_size=30,
    ),
)
def test_a_partition_with_nothing_in_it_is_never_paused_whatever_the_others_hold(
    pause_after: float, steps: list[dict[str, Load]]
) -> None:
    """Random loads, one decision per 0.2 s: an empty partition is never paused while the pod is
    under its ceiling (3 * 60 in flight, 3 * 200 uncommitted), and when nothing holds the reading,
    the pod takes at least one message."""
    flow = FlowControl(
        FlowLimits(max_inflight=60, max_inflight_per_partition=40, max_uncommitted=200, pause_after=pause_after)
    )
    for index, loads in enumerate(steps):
        pod_load = pod(loads)
        decision = flow.decide(loads, pod_load, index * 0.2)
        for name, load in loads.items():
            if load == Load(0, 0) and not flow.at_ceiling:
                assert name not in flow.paused, f"step {index}: empty {name} paused, loads {loads}"
        if decision.hold is None and not flow.all_paused(len(loads)):
            assert flow.capacity(pod_load) >= 1, f"step {index}: nothing to read, loads {loads}"

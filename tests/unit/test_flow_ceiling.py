"""FlowControl's ceiling: the pod never holds more than ``CEILING`` (3) times its bounds.

Without it, partitions assigned one at a time while the others were blocked each added up to two
partition bounds of a shrinking share, B * (1 + 1/2 + 1/3 + ...) in all: 4.26 * B with 40 partitions.

Pure: explicit loads and times. Blocked partitions never finish or commit; a partition's in-flight
messages are part of its uncommitted ones."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from keyorder.core.flow import CEILING, FlowControl, FlowLimits, Load

B = 1_000
BLOCKING = FlowLimits(max_inflight=B, max_inflight_per_partition=B, max_uncommitted=50 * B, pause_after=0.0)


def total(loads: dict[str, int]) -> Load:
    return Load(sum(loads.values()), sum(loads.values()))


def as_loads(loads: dict[str, int]) -> dict[str, Load]:
    return {name: Load(count, count) for name, count in loads.items()}


def read_all_it_allows(flow: FlowControl[str], loads: dict[str, int], now: float, batch: int = 500) -> int:
    """Decide, then read up to ``batch`` into the first partition that may be read; the count read."""
    decision = flow.decide(as_loads(loads), total(loads), now)
    readable = [name for name in loads if name not in flow.paused]
    if decision.hold is not None or not readable:
        return 0
    taken = min(batch, flow.capacity(total(loads)))
    loads[readable[0]] += taken
    return taken


def test_partitions_assigned_one_at_a_time_beside_blocked_ones_stop_at_the_ceiling() -> None:
    """Every partition blocked (a dependency down under ``onExhausted: block``): each one assigned
    is read until its bound, and the pod stops at 3 * B in flight, with every partition paused."""
    flow = FlowControl[str](BLOCKING)
    loads: dict[str, int] = {}
    now = 0.0
    for index in range(40):
        loads[f"p{index}"] = 0
        for _ in range(50):
            read_all_it_allows(flow, loads, now)
            now += 0.01
            assert total(loads).inflight <= CEILING * B, f"{index + 1} partitions: {total(loads)} past the ceiling"
    assert total(loads).inflight == CEILING * B, "read up to the ceiling, not short of it"
    assert flow.at_ceiling and flow.paused == set(loads), "at the ceiling every partition is paused"
    assert flow.all_paused(len(loads))


def test_at_the_ceiling_every_partition_waits_until_the_pod_is_a_partition_bound_below_it() -> None:
    """Three blocked partitions fill the ceiling; a healthy one waits, then is read again."""
    flow = FlowControl[str](FlowLimits(max_inflight=100, max_inflight_per_partition=100, max_uncommitted=5_000))
    loads = {"blocked0": 100, "blocked1": 95, "blocked2": 95, "healthy": 10}  # bounds 25 each: 300 = the ceiling
    decision = flow.decide(as_loads(loads), total(loads), 0.0)
    assert flow.at_ceiling and sorted(decision.to_pause) == sorted(loads)
    assert decision.hold is None and decision.release_after == 25, "300 - 25 handled: a partition bound below"
    loads["healthy"] = 0  # 290: under the ceiling, but not a partition bound below it
    decision = flow.decide(as_loads(loads), total(loads), 1.0)
    assert flow.at_ceiling and decision.to_resume == [] and flow.all_paused(4)
    assert decision.release_after == 15
    loads["blocked1"] = 80  # a blocked key's retry went through: 275
    decision = flow.decide(as_loads(loads), total(loads), 2.0)
    assert not flow.at_ceiling and decision.to_resume == ["healthy"], "the blocked ones stay paused on their bounds"
    assert flow.capacity(total(loads)) == 25, "one partition bound (and the ceiling's room)"


def test_the_uncommitted_count_has_its_ceiling_too() -> None:
    """A blocked head offset: little in flight, much finished behind it and not committable."""
    flow = FlowControl[str](FlowLimits(max_inflight=200, max_inflight_per_partition=200, max_uncommitted=400))
    partitions = {"blocked0": Load(1, 600), "blocked1": Load(1, 600), "healthy": Load(0, 0)}
    pod = Load(2, 1_200)  # 3 * 400
    flow.decide(partitions, pod, 0.0)
    assert flow.at_ceiling and flow.paused == set(partitions)
    partitions = {"blocked0": Load(1, 600), "blocked1": Load(1, 460), "healthy": Load(0, 0)}
    flow.decide(partitions, Load(2, 1_060), 1.0)
    assert not flow.at_ceiling and flow.paused == {"blocked0", "blocked1"}, "133 below the ceiling: released"
    assert flow.capacity(Load(2, 1_060)) == 133, "one partition bound"


def test_handlers_of_revoked_partitions_count_towards_the_ceiling() -> None:
    flow = FlowControl[str](FlowLimits(max_inflight=10, max_inflight_per_partition=10, max_uncommitted=1_000))
    partitions = {"blocked": Load(18, 18), "new": Load(0, 0)}  # read alone, bound 10
    pod = Load(30, 18)  # 12 handlers still running for revoked partitions
    flow.decide(partitions, pod, 0.0)
    assert flow.at_ceiling and flow.paused == {"blocked", "new"}


def test_a_fixed_assignment_never_reaches_the_ceiling_however_many_partitions_are_blocked() -> None:
    """The worst case the module docstring derives: one blocked partition takes the pod bound in one
    read, each other blocked one fills to under twice its bound; the healthy one is still read."""
    flow = FlowControl[str](
        FlowLimits(max_inflight=100, max_inflight_per_partition=100, max_uncommitted=5_000, pause_after=0.0)
    )
    loads = {f"blocked{index}": 0 for index in range(9)} | {"healthy": 0}  # bounds 10 each
    read_all_it_allows(flow, loads, 0.0, batch=100)  # all to blocked0
    assert loads["blocked0"] == 100
    now = 1.0
    for index in range(1, 9):  # each blocked one: 9 read, then a read of its bound (10)
        name = f"blocked{index}"
        flow.decide(as_loads(loads), total(loads), now)
        loads[name] += min(9, flow.capacity(total(loads)))
        flow.decide(as_loads(loads), total(loads), now + 0.1)
        loads[name] += flow.capacity(total(loads))
        now += 1.0
    assert total(loads).inflight == 100 + 8 * 19
    for _ in range(100):  # the healthy partition: read, handled, read again
        taken = read_all_it_allows(flow, loads, now)
        assert taken >= 1 and not flow.at_ceiling
        loads["healthy"] = 0
        now += 0.1


# -- property: blocked partitions assigned and revoked in any order ----------------------------------

STEPS = st.one_of(
    st.just(("assign",)),
    st.tuples(st.just("revoke"), st.integers(0, 20)),
    st.tuples(st.just("tick"), st.sampled_from([0.25, 1.0])),
    *[st.tuples(st.just("read"), st.integers(1, 60))] * 3,
)


@settings(max_examples=100)
@given(
    limits=st.builds(
        FlowLimits,
        max_inflight=st.integers(5, 40),
        max_inflight_per_partition=st.integers(1, 40),
        max_uncommitted=st.integers(40, 120),
        pause_after=st.sampled_from([0.0, 0.5]),
    ),
    steps=st.lists(STEPS, min_size=40, max_size=100),
)
def test_blocked_partitions_assigned_and_revoked_in_any_order_never_take_the_pod_past_its_ceiling(
    limits: FlowLimits, steps: list[tuple]
) -> None:
    """Nothing finishes; a revoked partition's messages stay in flight in its handlers. After every
    decision and read: the pod is within its ceiling in both counts, every partition is paused while
    it is at the ceiling, and an empty partition is paused only then."""
    flow = FlowControl[str](limits)
    loads: dict[str, Load] = {}
    revoked_inflight, assigned, now = 0, 0, 0.0
    for step in steps:
        if step[0] == "assign":
            loads[f"p{assigned}"], assigned = Load(0, 0), assigned + 1
        elif step[0] == "revoke" and f"p{step[1]}" in loads:
            revoked_inflight += loads.pop(f"p{step[1]}").inflight
        elif step[0] == "tick":
            now += step[1]
        elif step[0] == "read":
            pod = Load(
                sum(load.inflight for load in loads.values()) + revoked_inflight,
                sum(load.uncommitted for load in loads.values()),
            )
            decision = flow.decide(loads, pod, now)
            if flow.at_ceiling:
                assert flow.paused == set(loads), f"at the ceiling with {pod}: {flow.paused} paused of {loads}"
            for name, load in loads.items():
                assert load != Load(0, 0) or flow.at_ceiling or name not in flow.paused, f"empty {name} paused"
            readable = [name for name in loads if name not in flow.paused]
            if decision.hold is not None or not readable:
                continue
            for index in range(min(step[1], flow.capacity(pod))):
                name = readable[index % len(readable)]
                loads[name] = Load(loads[name].inflight + 1, loads[name].uncommitted + 1)
            inflight = sum(load.inflight for load in loads.values()) + revoked_inflight
            uncommitted = sum(load.uncommitted for load in loads.values())
            assert inflight <= flow.ceiling.inflight and uncommitted <= flow.ceiling.uncommitted, (
                f"{inflight} in flight, {uncommitted} uncommitted: past the ceiling {flow.ceiling}"
            )

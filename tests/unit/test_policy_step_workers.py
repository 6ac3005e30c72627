"""A step up never lowers the running pods' workers before it has settled.

Adding pods often lowers the workers per pod (the same capacity over more pods: 6 x 29 -> 12 x 17 on 12
partitions). The new pods take a while to start (30 s in ``keyorder simulate``) and to take over their
partitions; lowered at once, the pods in place would run 6 x 17 workers for that while, less than kept up
with the arrivals before the step. The decision keeps the decided size and says to hold
(``Decision.hold_workers``); the operator's push (``pod_admin.needing_push``) then leaves the pods running
more alone until every decided pod is ready and reports and every partition has an owner.
"""

from __future__ import annotations

from dataclasses import replace

from keyorder_operator.pod_admin import ADDRESS, needing_push
from keyorder_operator.policy import (
    LONGEST_STEP_SECONDS,
    Cause,
    Observation,
    RateKind,
    RateLimit,
    ScalingState,
    Size,
    decide,
)
from tests.unit.policy_fixtures import LIMITS
from tests.unit.test_policy_signals import pods

ARRIVALS = 14_000.0
"""At 10 ms per message (90 msg/s per worker), 14,000/s at 80% utilization need 195 workers: more than
6 pods of 29 (174) within the tolerance, so 12 pods of 17."""


def observation(
    running: list[int], arrivals: float = ARRIVALS, *, ready: int | None = None, assigned: int = 12
) -> Observation:
    """The pods that report run ``running`` workers each (``ready`` pods are ready: by default those) and
    own ``assigned`` of the 12 partitions; ``arrivals`` arrive and drain, 12,000 in flight."""
    signals = replace(
        pods(len(running), 0),
        workers=sum(running),
        most_workers=max(running),
        busy=sum(running),
        partitions_assigned=assigned,
    )
    return Observation(
        lag=12_000,
        partitions=12,
        drain_rate=arrivals,
        arrival_rate=arrivals,
        pods=signals,
        pods_expected=len(running) if ready is None else ready,
    )


def pushed(decision, running: list[int]) -> list[int]:
    """The pods' workers after the operator applied ``decision``: the count goes to the pods
    ``needing_push`` picks, as ``Poll.explain`` does."""
    addresses = [f"10.0.0.{index}" for index in range(len(running))]
    reports = [{ADDRESS: address, "workers": workers} for address, workers in zip(addresses, running, strict=True)]
    lower = not decision.hold_workers
    chosen = set(needing_push(addresses, reports, decision.target.workers, lower=lower))
    return [decision.target.workers if address in chosen else w for address, w in zip(addresses, running, strict=True)]


def steady_state() -> ScalingState:
    return ScalingState(Size(6, 29), arrival_samples=(ARRIVALS,) * 5, drainable_lag=12_000, polled_at=-15.0)


def test_a_step_up_keeps_the_running_pods_workers_until_it_has_settled():
    running = [29] * 6
    step = decide(observation(running), LIMITS, steady_state(), 0.0)
    assert (step.before, step.target, step.cause) == (Size(6, 29), Size(12, 17), Cause.SCALE_UP)
    assert pushed(step, running) == [29] * 6, "the pods in place lost workers as the step started"
    assert "adding 6 pods; the running pods keep up to 29 workers per pod until the step settles (then 17)" in (
        step.reason
    )

    # 15 s on: the new pods still start; the decided size stays 12 x 17, the pods in place keep 29
    starting = decide(observation(running), LIMITS, step.state, 15.0)
    assert starting.target == Size(12, 17)
    assert pushed(starting, running) == [29] * 6, "the pods in place lost workers while the new ones started"
    assert "6 of 12 pods starting; the ready pods keep up to 29 workers per pod until the step settles" in (
        starting.reason
    )

    # three of them ready: they get the decided count, the pods in place still keep theirs
    some = [29] * 6 + [16] * 3
    partly = decide(observation(some), LIMITS, starting.state, 30.0)
    assert pushed(partly, some) == [29] * 6 + [17] * 3

    # all twelve ready, but the partitions still move (/readyz only says a broker answered): still held
    ready = [29] * 6 + [17] * 3 + [16] * 3
    moving = decide(observation(ready, assigned=8), LIMITS, partly.state, 45.0)
    assert moving.hold_workers, "the hold ended before the new pods owned their partitions"
    assert pushed(moving, ready) == [29] * 6 + [17] * 6
    assert "the step's pods take over their partitions; the pods keep up to 29 workers per pod" in moving.reason

    # every partition has an owner: every pod gets the decided count, whatever the decision's path
    done = decide(observation(ready), LIMITS, moving.state, 60.0)
    assert not done.hold_workers
    assert pushed(done, ready) == [17] * 12


def test_a_second_step_while_the_first_ones_pods_start_keeps_the_workers_the_pods_run():
    """2 pods of 32, at most 100% more pods per 15 s: 4,500/s step to 4 x 16, then 9,000/s, 15 s later and
    before the first step's pods are ready, to 6 x 21. The 2 pods in place run 32 (the first step held
    them), not the 16 decided: they keep 32 through the second step too."""
    limits = replace(LIMITS, scale_up_rates=(RateLimit(RateKind.PERCENT, 100, 15.0),))
    running = [32, 32]
    state = ScalingState(Size(2, 32), arrival_samples=(4_500.0,) * 5, drainable_lag=12_000, polled_at=-15.0)
    first = decide(observation(running, 4_500.0), limits, state, 0.0)
    assert (first.before, first.target, first.hold_workers) == (Size(2, 32), Size(4, 16), True)
    assert pushed(first, running) == [32, 32]
    faster = replace(first.state, arrival_samples=(9_000.0,) * 5)
    second = decide(observation(running, 9_000.0), limits, faster, 15.0)
    assert (second.before, second.target) == (Size(4, 16), Size(6, 21))
    assert second.hold_workers, "the second step released the first one's hold"
    assert pushed(second, running) == [32, 32], "the pods in place lost workers while 4 pods started"
    assert "adding 2 pods; the running pods keep up to 32 workers per pod until the step settles (then 21)" in (
        second.reason
    )


def test_the_hold_counts_the_pod_running_the_most_not_the_mean():
    """2 pods in place at 29 and 9 new ones still at 2 (11 of 12 ready): their mean (7) is below the decided
    17, yet the two run more and keep them; the text names the 29 they keep."""
    step = decide(observation([29] * 6), LIMITS, steady_state(), 0.0)
    mixed = [29] * 2 + [2] * 9
    partly = decide(observation(mixed), LIMITS, step.state, 15.0)
    assert partly.hold_workers, "a mean below the count let the pods in place lose workers"
    assert pushed(partly, mixed) == [29] * 2 + [17] * 9
    assert "1 of 12 pods starting; the ready pods keep up to 29 workers per pod" in partly.reason


def test_a_step_whose_pods_never_settle_keeps_the_workers_and_says_so():
    """A pod left Pending: the pods in place keep their workers (never more than they ran before the step),
    past ``LONGEST_STEP_SECONDS`` too, and the reason says how long the step has not settled; a crash-looping
    pod that is ready for a poll without reporting ends nothing either."""
    running = [29] * 6
    step = decide(observation(running), LIMITS, steady_state(), 0.0)
    assert step.hold_workers
    later = decide(observation(running), LIMITS, step.state, LONGEST_STEP_SECONDS + 15.0)
    assert later.hold_workers, "the pods in place lost workers while the new pods stayed Pending"
    assert pushed(later, running) == [29] * 6
    assert "the step has not settled in 10.2 min" in later.reason
    flapping = decide(observation([29] * 6 + [17] * 5, ready=12), LIMITS, later.state, LONGEST_STEP_SECONDS + 30.0)
    assert flapping.hold_workers, "a pod ready for one poll without reporting ended the hold"
    assert pushed(flapping, [29] * 6 + [17] * 5) == [29] * 6 + [17] * 5


def test_a_step_that_does_not_lower_the_workers_holds_nothing():
    """From 2 pods of 16 to more pods of 16 or more: nothing to keep (no reason text about it either)."""
    running = [16] * 2
    state = ScalingState(Size(2, 16), arrival_samples=(ARRIVALS,) * 5, drainable_lag=12_000, polled_at=-15.0)
    step = decide(observation(running), LIMITS, state, 0.0)
    assert step.target.replicas > 2 and step.target.workers >= 16
    assert not step.hold_workers
    assert "until the step settles" not in step.reason

"""A step up never lowers the running pods' workers before its new pods are ready.

Adding pods often lowers the workers per pod (the same capacity over more pods: 6 x 29 -> 12 x 17 on 12
partitions). The new pods take a while to start (30 s in ``keyorder simulate``); lowered at once, the
pods in place would run 6 x 17 workers for that while, less than kept up with the arrivals before the
step. The decision keeps the decided size and says to hold (``Decision.hold_workers``); the operator's
push (``pod_admin.needing_push``) then only raises pods running fewer, until the decided pods are ready.
"""

from __future__ import annotations

from dataclasses import replace

from keyorder_operator.pod_admin import ADDRESS, needing_push
from keyorder_operator.policy import LONGEST_STEP_SECONDS, Cause, Observation, ScalingState, Size, decide
from tests.unit.policy_fixtures import LIMITS
from tests.unit.test_policy_signals import pods

ARRIVALS = 14_000.0
"""At 10 ms per message (90 msg/s per worker), 14,000/s at 80% utilization need 195 workers: more than
6 pods of 29 (174) within the tolerance, so 12 pods of 17."""


def observation(running: list[int]) -> Observation:
    """The ready pods run ``running`` workers each; 14,000/s arrive and drain, 12,000 in flight."""
    signals = replace(pods(len(running), 0), workers=sum(running), busy=sum(running))
    return Observation(
        lag=12_000,
        partitions=12,
        drain_rate=ARRIVALS,
        arrival_rate=ARRIVALS,
        pods=signals,
        pods_expected=len(running),
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


def test_a_step_up_keeps_the_running_pods_workers_until_the_new_pods_are_ready():
    running = [29] * 6
    step = decide(observation(running), LIMITS, steady_state(), 0.0)
    assert (step.before, step.target, step.cause) == (Size(6, 29), Size(12, 17), Cause.SCALE_UP)
    assert pushed(step, running) == [29] * 6, "the pods in place lost workers as the step started"
    assert "adding 6 pods; workers per pod stay 29 until they are ready (then 17)" in step.reason

    # 15 s on: the new pods still start; the decided size stays 12 x 17, the pods in place keep 29
    starting = decide(observation(running), LIMITS, step.state, 15.0)
    assert starting.target == Size(12, 17)
    assert pushed(starting, running) == [29] * 6, "the pods in place lost workers while the new ones started"
    assert "6 of 12 pods starting; the 6 ready pods keep their 29 workers per pod" in starting.reason

    # three of them ready: they get the decided count, the pods in place still keep theirs
    some = [29] * 6 + [16] * 3
    partly = decide(observation(some), LIMITS, starting.state, 30.0)
    assert pushed(partly, some) == [29] * 6 + [17] * 3

    # all twelve ready: every pod gets the decided count, whatever the decision's path (here a rebalance hold)
    ready = [29] * 6 + [17] * 3 + [16] * 3
    done = decide(observation(ready), LIMITS, partly.state, 45.0)
    assert not done.hold_workers
    assert pushed(done, ready) == [17] * 12


def test_a_step_whose_pods_never_become_ready_holds_nothing_after_the_longest_step():
    """A pod left Pending: the pods in place keep their workers no longer than a step is ever timed."""
    running = [29] * 6
    step = decide(observation(running), LIMITS, steady_state(), 0.0)
    assert step.hold_workers
    later = decide(observation(running), LIMITS, step.state, LONGEST_STEP_SECONDS + 15.0)
    assert not later.hold_workers
    assert pushed(later, running) == [later.target.workers] * 6


def test_a_step_that_does_not_lower_the_workers_holds_nothing():
    """From 2 pods of 16 to more pods of 16 or more: nothing to keep (no reason text about it either)."""
    running = [16] * 2
    state = ScalingState(Size(2, 16), arrival_samples=(ARRIVALS,) * 5, drainable_lag=12_000, polled_at=-15.0)
    step = decide(observation(running), LIMITS, state, 0.0)
    assert step.target.replicas > 2 and step.target.workers >= 16
    assert not step.hold_workers
    assert "until they are ready" not in step.reason

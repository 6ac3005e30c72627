"""An operator restart, as a rolling update or a failover makes one: the new operator has only status.

Real kopf on the API emulator, lag from the real broker. The autoscaler's memory kept in
``status.autoscaler`` (``keyorder_operator.restart``) carries the scale-down window across the restart, and
the resources that existed before a start are first polled spread over their interval, not on its first tick.
"""

from __future__ import annotations

import time

import pytest

from keyorder.devtools.loadgen import create_topics, produce_keyed
from keyorder_operator.restart import CREATED_JUST_BEFORE_SECONDS, first_poll_at, seconds_of
from tests.operator.harness import CR, first_polls, last_poll_at, wait_for, wait_for_polls
from tests.operator.test_operator_e2e import (
    commit_group,
    consumer_resource,
    operator,
    replicas,
    rollout_reported_done,
)
from tests.support import EXACT_END_OFFSETS

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.timeout(180)]

WINDOW = 20
"""The scale-down stabilization window of these tests, in seconds."""


def status_of(kube, name: str) -> dict:
    return (kube.get(CR, name) or {}).get("status") or {}


def test_a_scale_down_held_by_the_window_waits_out_the_window_after_a_restart(kube, broker):
    """A backlog sizes the group at 4 pods; it is drained, so 1 pod is recommended, held by the 20 s window
    counted from the last recommendation of 4 pods. The operator restarts inside the window: the new one
    still waits for the window's end, then scales down. (The old operator kept in status only the memory of
    the last resize, seconds earlier than the last recommendation of 4 pods, so its successor scaled down
    that much sooner.)"""
    topic = "okc-restart-window"
    create_topics(broker.bootstrap, [topic], 4)
    produced = produce_keyed(broker.bootstrap, topic, 4_000, 100, extra_config=EXACT_END_OFFSETS)
    commit_group(broker.bootstrap, f"g-{topic}", topic, dict.fromkeys(range(4), 0))
    scaling = {
        "pollIntervalSeconds": 1,
        "targetDrainSeconds": 10,
        "activationLag": 10,
        "scaleDownStabilizationSeconds": WINDOW,
    }
    body = consumer_resource("patient", broker.bootstrap, topic, scaling=scaling)
    with rollout_reported_done(kube, "patient"):
        with operator(kube.url, autoscaler_save_seconds=1.0):
            kube.create(CR, body)
            wait_for(lambda: replicas(kube, "patient") == 4, 30, "scale-out to the partition count")

            def grown() -> bool:  # the size stopped changing: three polls in a row kept it
                before = status_of(kube, "patient").get("workersPerPod")
                wait_for_polls(kube, "patient", 3)
                return before == status_of(kube, "patient").get("workersPerPod")

            wait_for(grown, 60, "the size to settle")
            wait_for_polls(kube, "patient", 8)  # the size is recommended again and again, never resized
            drained_at = time.time()
            commit_group(broker.bootstrap, f"g-{topic}", topic, produced.end_offsets)
            wait_for(
                lambda: "held by the stabilization window" in status_of(kube, "patient")["lastDecision"]["reason"],
                20,
                "the scale-down to be held by the window",
            )
            assert replicas(kube, "patient") == 4

        with operator(kube.url, autoscaler_save_seconds=1.0):  # a new operator, inside the window
            # hang guard: the test's premise (a restart slower than the window would leave nothing to tell)
            assert time.time() < drained_at + WINDOW - 5, "the restart took too long for this test to tell"
            scaled_in_at = wait_for(
                lambda: replicas(kube, "patient") == 1 and time.time(),
                WINDOW + 30,
                "the scale-down after the window",
                interval=0.05,
            )
    # the last recommendation of 4 pods came from a poll that read the lag before the commit: at most a
    # poll interval (1 s) and a tick (0.3 s) before drained_at
    earliest = drained_at - 1.3 + WINDOW
    # event order: not before the window's end (slowness only delays the scale-down)
    assert scaled_in_at >= earliest, (
        f"scaled down {earliest - scaled_in_at:.1f} s before the window that held it ended: the restart "
        "lost the recommendations made since the last resize"
    )


def test_the_first_polls_after_a_restart_are_spread_over_the_interval(kube, broker):
    """Twelve resources polled by one operator; the next one, started after it stopped, polls each first
    at that resource's own moment of its first 8 s interval (``restart.first_poll_at``), not all on its
    first tick."""
    topic = "okc-restart-spread"
    create_topics(broker.bootstrap, [topic], 1)
    names = [f"spread-{n}" for n in range(12)]
    scaling = {"pollIntervalSeconds": 8, "activationLag": 10}
    with operator(kube.url):
        uids = {
            name: kube.create(CR, consumer_resource(name, broker.bootstrap, topic, scaling=scaling))["metadata"]["uid"]
            for name in names
        }
        for name in names:
            wait_for(lambda name=name: last_poll_at(kube, name) is not None, 30, f"a first poll of {name}")
        # resources created just before a start are polled at once (restart.CREATED_JUST_BEFORE_SECONDS):
        # these must have existed for longer, as a fleet a restart meets has
        created = max(seconds_of(kube.get(CR, name)["metadata"]["creationTimestamp"], "created") for name in names)
        time.sleep(max(0.0, created + CREATED_JUST_BEFORE_SECONDS + 1.5 - time.time()))

    with operator(kube.url) as second:
        polled = first_polls(kube, names, 8 + 30, "a first poll of every resource by the new operator")
        started = second.started_at
        tick = second.tick_seconds
    assert started is not None
    early = {
        name: round(polled[name] - first_poll_at(uids[name], started, 8), 2)
        for name in names
        if polled[name] < first_poll_at(uids[name], started, 8) - tick / 2
    }
    assert not early, f"polled before their moment of the first interval (seconds late, negative: early): {early}"
    span = max(polled.values()) - min(polled.values())
    assert span > 2 * tick, f"the first polls came within {span:.2f} s of each other"

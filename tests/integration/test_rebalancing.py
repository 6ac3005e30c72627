"""Rebalancing on the real broker: cooperative by default, eager when the user asks, never mixed.

A second pod joins a group mid-backlog. With the default (``cooperative-sticky``) the first pod
gives up only the partitions that move and never holds none; with an eager strategy (``range``)
it gives up every partition and holds none until the group has rejoined. Either way no message is
lost and every key's messages are first handled in order. A pod that cannot join because the
group's members use the other protocol says so, naming the fix.
"""

from __future__ import annotations

import logging

import pytest

from keyorder.adapters import kafka_source
from keyorder.adapters.kafka_source import MIXED_PROTOCOLS
from keyorder.devtools.embedded import FAST_GROUP_JOIN
from keyorder.devtools.loadgen import produce_keyed
from tests.conftest import Recorder, wait_until
from tests.guarantees import assert_at_least_once, assert_first_processing_in_order
from tests.support import wait_for, wait_for_commits

pytestmark = [pytest.mark.broker, pytest.mark.slow]


@pytest.mark.parametrize("strategy", ["cooperative-sticky (default)", "range"])
def test_a_joining_pod_takes_only_what_moves_unless_the_strategy_is_eager(broker, make_topic, run_pod, strategy):
    properties = (
        FAST_GROUP_JOIN if "default" in strategy else [*FAST_GROUP_JOIN, f"partition.assignment.strategy={strategy}"]
    )
    topic = make_topic(4)
    produced = produce_keyed(broker.bootstrap, topic, 12_000, 200, seed=24)
    recorder = Recorder(0.002, 0.006)
    group = f"g-{topic}"
    first = run_pod(topic, recorder, group=group, workers=8, kafka_property=properties)
    wait_until(lambda: recorder.count() >= 1_000, 60, "the first pod to make progress")
    second = run_pod(topic, recorder, group=group, workers=8, kafka_property=properties)
    wait_for(lambda: second.runtime.snapshot.assigned_partitions > 0, 60, "the second pod to get partitions")
    wait_until(lambda: len(set(recorder.records)) >= produced.total, 120, "every message handled")
    wait_for_commits(broker.bootstrap, group, topic, produced.end_offsets, 30)
    wait_for(
        lambda: first.runtime.snapshot.assigned_partitions + second.runtime.snapshot.assigned_partitions == 4,
        30,
        "the snapshots to show the final assignment",
    )
    moved = second.runtime.snapshot.assigned_partitions
    taken, idle = first.runtime.snapshot.partitions_revoked, first.runtime.snapshot.rebalance_idle_seconds
    if "default" in strategy:
        assert (taken, idle) == (moved, 0.0), "a cooperative rebalance takes only what moves, and never all of it"
    else:
        assert taken >= 4 and idle > 0, "an eager rebalance takes every partition and leaves the pod with none"
    assert_at_least_once(recorder.records, produced.sequences)
    assert_first_processing_in_order(recorder.records)
    recorder.serial.assert_serial()


def test_a_cooperative_pod_in_an_eager_group_says_why_it_cannot_join(broker, make_topic, run_pod, caplog):
    topic = make_topic(2)
    produce_keyed(broker.bootstrap, topic, 200, 20, seed=25)
    recorder = Recorder()
    group = f"g-{topic}"
    eager = run_pod(
        topic, recorder, group=group, kafka_property=[*FAST_GROUP_JOIN, "partition.assignment.strategy=range"]
    )
    wait_for(lambda: eager.runtime.snapshot.assigned_partitions == 2, 60, "the eager pod to be assigned")
    with caplog.at_level(logging.ERROR, logger="keyorder.adapters.kafka_source"):
        cooperative = run_pod(topic, recorder, group=group)
        refused = MIXED_PROTOCOLS.split("(")[0]
        wait_for(lambda: any(refused in record.getMessage() for record in caplog.records), 60, "the refusal")
    assert cooperative.runtime.snapshot.assigned_partitions == 0
    assert eager.runtime.snapshot.assigned_partitions == 2, "the refused join moved nothing"


def test_group_protocol_consumer_on_a_broker_without_kip848_says_so(broker, make_topic, run_pod, caplog, monkeypatch):
    """The embedded broker (Tansu 0.6.0) has no ConsumerGroupHeartbeat API: librdkafka then waits
    without an error, so the pod says what is wrong once the broker has answered for a while (the
    30 s silence shortened here)."""
    monkeypatch.setattr(kafka_source, "BROKER_ASSIGNS_SILENCE", 2.0)
    topic = make_topic(2)
    with caplog.at_level(logging.ERROR, logger=kafka_source.__name__):
        # no session timeout here: librdkafka refuses it with this protocol (the broker owns it)
        pod = run_pod(topic, Recorder(), kafka_property=["group.protocol=consumer"])
        wait_for(lambda: any("KIP-848" in record.getMessage() for record in caplog.records), 60, "the explanation")
    assert pod.runtime.snapshot.assigned_partitions == 0
    said = [record for record in caplog.records if "KIP-848" in record.getMessage()]
    assert len(said) == 1, "said once, not on every poll"


def test_a_static_member_that_stops_leaves_the_group_so_its_partitions_move_at_once(
    broker, make_topic, run_pod, caplog
):
    """librdkafka sends no LeaveGroup when a static member (``group.instance.id``) closes, so a pod
    removed by a scale-in would hold its partitions, idle, for ``session.timeout.ms`` (here 20 s). The
    pod leaves explicitly when it stops (the client clears its member id only once it has sent the
    LeaveGroup), so the pod that follows it gets both partitions well within that, with every message
    handled in key order. (The embedded broker is slow to add a member to a group with a static one,
    so the second pod starts after the first has stopped.)"""
    topic = make_topic(2)
    produced = produce_keyed(broker.bootstrap, topic, 3_000, 50, seed=26)
    recorder = Recorder(0.001, 0.003)
    group = f"g-{topic}"
    session = ["session.timeout.ms=20000", "heartbeat.interval.ms=500"]
    static = run_pod(topic, recorder, group=group, kafka_property=[*session, f"group.instance.id={topic}-static"])
    wait_for(lambda: static.runtime.snapshot.assigned_partitions == 2, 60, "the static pod to be assigned")
    wait_until(lambda: recorder.count() >= 300, 60, "progress")
    with caplog.at_level(logging.INFO, logger=kafka_source.__name__):
        static.stop_event.set()
        static.thread.join(60)
    assert any("left the consumer group" in record.getMessage() for record in caplog.records), (
        "the client did not send the static member's leave"
    )
    successor = run_pod(topic, recorder, group=group)
    # a static member that did not leave would keep its partitions for its 20 s session timeout
    wait_for(lambda: successor.runtime.snapshot.assigned_partitions == 2, 15, "the successor to take both partitions")
    wait_until(lambda: len(set(recorder.records)) >= produced.total, 60, "every message handled")
    assert_at_least_once(recorder.records, produced.sequences)
    assert_first_processing_in_order(recorder.records)

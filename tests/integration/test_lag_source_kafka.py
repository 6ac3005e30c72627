"""KafkaLagSource against the real (Tansu) broker: it describes only the resource's topics."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, TopicPartition

from keyorder.devtools.loadgen import create_topics, produce_keyed
from keyorder_operator.observe import KafkaLagSource, LagUnavailable

pytestmark = [pytest.mark.broker, pytest.mark.timeout(60)]


def test_lag_counts_only_the_resources_topics_and_names_a_missing_one(broker):
    create_topics(broker.bootstrap, ["lag-mine"], 3)
    create_topics(broker.bootstrap, ["lag-other"], 5)
    produced = produce_keyed(broker.bootstrap, "lag-mine", 300, 30, extra_config={"batch.num.messages": 1})
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "lag-g", "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition("lag-mine", p, 0) for p in range(3)], asynchronous=False)
    finally:
        consumer.close()
    source = KafkaLagSource({"bootstrap.servers": broker.bootstrap})
    try:
        sample = source.sample(["lag-mine"], "lag-g", 1.0)
        assert sample.partitions == 3 and {topic for topic, _, _ in sample.end_offsets} == {"lag-mine"}
        assert sample.lag == produced.total
        with pytest.raises(LagUnavailable, match="topic 'lag-missing' not found"):
            source.sample(["lag-mine", "lag-missing"], "lag-g", 2.0)
    finally:
        source.close()


class RecordingAdmin:
    """The real AdminClient, with the ListOffsets specs each call asked for recorded (a recording proxy,
    not a fake: every call still goes to the broker)."""

    def __init__(self, admin) -> None:
        self.admin, self.asked = admin, []

    def list_offsets(self, specs, **kwargs):
        self.asked.append(sorted({type(spec).__name__ for spec in specs.values()}))
        return self.admin.list_offsets(specs, **kwargs)

    def __getattr__(self, name):
        return getattr(self.admin, name)


def test_the_log_start_is_asked_only_for_partitions_the_group_has_not_committed(broker):
    """A group that committed everywhere costs two offset requests per poll (end and committed), not
    three; a partition without a commit still counts from the log start (auto.offset.reset earliest)."""
    create_topics(broker.bootstrap, ["lag-start"], 2)
    produced = produce_keyed(broker.bootstrap, "lag-start", 200, 20, extra_config={"batch.num.messages": 1})
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "lag-s", "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition("lag-start", 0, 0)], asynchronous=False)  # partition 1: none
        source = KafkaLagSource({"bootstrap.servers": broker.bootstrap})
        recording = RecordingAdmin(source._client())
        source._client = lambda: recording  # type: ignore[method-assign]
        try:
            assert source.sample(["lag-start"], "lag-s", 1.0).lag == produced.total
            assert len(recording.asked) == 2, recording.asked  # the end offsets, then the log start of partition 1
            consumer.commit(offsets=[TopicPartition("lag-start", 1, 0)], asynchronous=False)
            recording.asked.clear()
            assert source.sample(["lag-start"], "lag-s", 2.0).lag == produced.total
            assert len(recording.asked) == 1, recording.asked  # committed everywhere: the end offsets only
        finally:
            source.close()
    finally:
        consumer.close()


def test_a_namespaces_reader_process_reads_the_same_lag_beside_one_a_hostile_broker_killed(broker):
    """Issue 37 finding 1: the operator's default lag sources (``lag_reader.LagReaders``) read a real broker's
    lag in a child process per namespace, exactly as ``KafkaLagSource`` does in-process, while another
    namespace's child, whose resource points at a broker that aborts librdkafka (``tests.unit.hostile_broker``),
    is killed: that namespace alone says ``LagReaderFailed``, and the healthy namespace's two resources are
    sampled again by the same child."""
    from keyorder_operator.lag_reader import READER_FAILED, LagReaders
    from tests.unit.hostile_broker import hostile_broker

    create_topics(broker.bootstrap, ["lag-isolated"], 3)
    produced = produce_keyed(broker.bootstrap, "lag-isolated", 120, 12, extra_config={"batch.num.messages": 1})
    in_process = KafkaLagSource({"bootstrap.servers": broker.bootstrap})
    readers = LagReaders()
    healthy = readers.source("team-a", {"bootstrap.servers": broker.bootstrap})
    neighbour = readers.source("team-a", {"bootstrap.servers": broker.bootstrap, "client.id": "neighbour"})
    try:
        expected = in_process.sample(["lag-isolated"], "lag-i", 1.0)
        with hostile_broker("abort") as address:
            hostile = readers.source("team-b", {"bootstrap.servers": address})
            try:
                first = healthy.sample(["lag-isolated"], "lag-i", 1.0)
                pid = healthy.reader.pid
                with pytest.raises(LagUnavailable) as error:
                    hostile.sample(["orders"], "orders", 1.0)
                second = healthy.sample(["lag-isolated"], "lag-i", 2.0)
                other = neighbour.sample(["lag-isolated"], "lag-i", 2.0)
            finally:
                hostile.close()
        assert error.value.condition == READER_FAILED and "SIGABRT" in error.value.reason, error.value.reason
        assert first == expected and first.lag == produced.total
        assert second.lag == produced.total and second.at == 2.0 and other == second
        assert healthy.started == 1 and healthy.reader.pid == pid  # the same child answered all of team-a
        with pytest.raises(LagUnavailable, match="topic 'lag-missing' not found") as missing:
            healthy.sample(["lag-isolated", "lag-missing"], "lag-i", 3.0)
        assert missing.value.condition == "LagUnavailable" and healthy.backoff.failures == 0
    finally:
        healthy.close()
        neighbour.close()
        in_process.close()

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

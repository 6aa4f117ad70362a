"""The admin calls against each broker: what a topic sets itself, as the service reads it back."""

from __future__ import annotations

import uuid

from kafka import KafkaAdminClient
from kafka.admin import NewTopic
from perceptron_stream.config import KafkaSettings
from perceptron_stream.kafka.admin import topic_configs


def test_topic_configs_are_the_topics_own_on_apache_kafka_and_none_on_the_embedded_broker(kafka_broker):
    topic = f"configs-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap_servers)
    try:
        own = {"cleanup.policy": "compact", "max.message.bytes": "100000"}
        admin.create_topics([NewTopic(topic, 1, 1, topic_configs=own)])
    finally:
        admin.close()
    configs = topic_configs(KafkaSettings(bootstrap_servers=kafka_broker.bootstrap_servers), [topic])
    if kafka_broker.name == "apache-kafka":
        assert {k: configs[topic].get(k) for k in own} == own
    else:
        assert configs == {topic: {}}  # Tansu keeps no topic configs: callers take Kafka's defaults

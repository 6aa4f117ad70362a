"""The admin calls against each broker: a topic's configs, as the service reads them back."""

from __future__ import annotations

import uuid

from kafka import KafkaAdminClient
from kafka.admin import NewTopic
from perceptron_stream.config import KafkaSettings
from perceptron_stream.kafka.admin import DEFAULT_MAX_MESSAGE_BYTES, topic_configs


def test_topic_configs_are_as_the_brokers_apply_them_on_apache_kafka_and_none_on_the_embedded_broker(kafka_broker):
    topic = f"configs-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap_servers)
    try:
        own = {"cleanup.policy": "compact", "max.message.bytes": "100000"}
        admin.create_topics([NewTopic(topic, 1, 1, topic_configs=own), NewTopic(f"{topic}-d", 1, 1)])
    finally:
        admin.close()
    configs = topic_configs(KafkaSettings(bootstrap_servers=kafka_broker.bootstrap_servers), [topic, f"{topic}-d"])
    if kafka_broker.name == "apache-kafka":
        assert {k: configs[topic].get(k) for k in own} == own
        # a topic that sets nothing: the brokers' own values (the test broker's message.max.bytes is Kafka's default)
        defaults = {"cleanup.policy": "delete", "max.message.bytes": str(DEFAULT_MAX_MESSAGE_BYTES)}
        assert {k: configs[f"{topic}-d"].get(k) for k in own} == defaults
    else:  # Tansu describes what a topic was created with, and no defaults: callers take Kafka's
        assert configs == {topic: own, f"{topic}-d": {}}

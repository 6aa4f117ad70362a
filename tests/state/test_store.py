"""The store protocol (perceptron_stream.state.store): both stores satisfy it, and each says where pending tables live."""

from __future__ import annotations

from perceptron_stream.state.checkpoint import KEEP_CHECKPOINTS
from perceptron_stream.state.kafka_store import KafkaStore
from perceptron_stream.state.local import LocalStore
from perceptron_stream.state.store import Store


def test_both_stores_satisfy_the_protocol(tmp_path):
    assert isinstance(LocalStore(tmp_path, "g"), Store)
    assert isinstance(KafkaStore(topic=None, group_id="g"), Store)


def test_pending_tables_live_beside_local_checkpoints_and_nowhere_in_a_topic(tmp_path):
    assert LocalStore(tmp_path, "a/b").pending_dir("partition-3") == tmp_path / "a%2Fb" / "partition-3"
    assert KafkaStore(topic=None, group_id="g").pending_dir("partition-3") is None


def test_both_stores_keep_the_same_number_of_checkpoints(tmp_path):
    assert LocalStore(tmp_path, "g").keep == KafkaStore(topic=None, group_id="g").keep == KEEP_CHECKPOINTS == 3

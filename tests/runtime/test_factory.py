"""The task factory alone (perceptron_stream.runtime.factory): what a task is made of, and where its pending tables live."""

from __future__ import annotations

from pathlib import Path

import pytest
from perceptron_stream.config import ServeSettings, load
from perceptron_stream.pipeline.models import Frozen
from perceptron_stream.runtime.factory import TaskFactory, model_meta
from perceptron_stream.state.checkpoint import GROUP_TASK, Owner
from perceptron_stream.state.kafka_store import KafkaStore
from perceptron_stream.state.local import LocalStore


def _settings(tmp_path, *args):
    return load(ServeSettings, ["--metrics-port", "0", "--state-dir", str(tmp_path / "state"), *args])


def _factory(s, **opened):
    return TaskFactory(s, Owner(s.group_id, s.input_topic, GROUP_TASK, "cluster", "topic-id"), **opened)


def test_a_partitions_task_is_owned_by_its_name_with_the_clusters_ids(tmp_path):
    s = _settings(tmp_path, "--model-scope", "partition", "--challengers", "averaged")
    task = _factory(s).new_task(3)
    assert (task.name, task.partition, task.owner) == (
        "partition-3",
        3,
        Owner(s.group_id, s.input_topic, "partition-3", "cluster", "topic-id"),
    )
    assert task.meta == model_meta(s) and list(task.models.challengers) == ["averaged"]
    assert task.joiner is None and task.mixer is None  # no --label-topic; no mix board


def test_learning_off_freezes_the_champion_and_the_challengers(tmp_path):
    task = _factory(_settings(tmp_path, "--learning", "off", "--challengers", "pocket")).new_task(None)
    assert task.frozen and isinstance(task.learner, Frozen) and isinstance(task.models.challengers["pocket"], Frozen)


@pytest.mark.parametrize("store", ["local", "kafka", "none"])
def test_pending_tables_live_where_the_store_says(tmp_path, store):
    s = _settings(tmp_path, "--label-topic", "labels")
    stores = {
        "local": LocalStore(tmp_path / "state", s.group_id),
        "kafka": KafkaStore(topic=None, group_id=s.group_id),
        "none": None,
    }
    factory = _factory(s, store=stores[store])
    table = factory.pending_table("partition-1", 1)
    path = Path(table.path)
    try:
        beside_checkpoints = path.parent == tmp_path / "state" / s.group_id / "partition-1"
        assert beside_checkpoints is (store == "local")
        assert path.name == "pending-1.sqlite" and path.parent.name == "partition-1"
    finally:
        table.close()
    factory.close()
    assert path.exists() is (store == "local")  # the cache directory goes at close; the store's files stay


def test_without_a_store_the_group_model_starts_from_the_factorys_initial_model(tmp_path):
    from perceptron_stream.runtime.health import Health
    from perceptron_stream.runtime.restore import Restorer
    from perceptron_stream.runtime.retry import Retry

    s = _settings(tmp_path, "--state-store", "none")
    started: list = []
    task = _factory(s).new_task(None)
    Restorer(s, None, Retry(Health(60.0), lambda: False), initial=started.append).start_group_model(task)
    assert started == [task]

"""The restorer's checks of a checkpoint it reads back (perceptron_stream.runtime.restore), on the local store: every
one refused is told to the store's ``on_reject`` (the metric at start-up) under its reason, and none reaches a task."""

from __future__ import annotations

import json

import pytest
from perceptron_stream.config import ServeSettings, load
from perceptron_stream.learning import make_learner
from perceptron_stream.runtime.factory import TaskFactory, model_meta
from perceptron_stream.runtime.health import Health
from perceptron_stream.runtime.restore import Restorer
from perceptron_stream.runtime.retry import Retry
from perceptron_stream.state.checkpoint import GROUP_TASK, Checkpoint, CheckpointError, Owner, encode_checkpoint
from perceptron_stream.state.local import LocalStore

from tests.support.checkpoints import resealed


@pytest.mark.parametrize(
    ("forge", "reason"),
    [
        (lambda doc: doc["model"].update(weights=[1e200, 1.0]), "non_finite"),
        (lambda doc: doc["model"]["counters"].update(mistakes=2**63 - 1), "implausible"),
    ],
    ids=["weights 1e200", "2**63-1 mistakes"],
)
def test_a_refused_checkpoint_is_counted_under_its_reason_and_restores_nothing(tmp_path, forge, reason):
    """Measured on f27e9e1: a checkpoint of 1e308 weights was restored (scores null, ``model export`` of them)."""
    s = load(ServeSettings, ["--metrics-port", "0", "--state-dir", str(tmp_path / "state")])
    owner = Owner(s.group_id, s.input_topic, GROUP_TASK, "cluster", "topic-id")
    task = TaskFactory(s, owner).new_task(None)
    learner = make_learner(max_features=s.max_model_features)
    learner.step([1.0, 2.0], 1)
    store = LocalStore(s.state_dir, s.group_id)
    refused: list[str] = []
    store.on_reject = refused.append
    doc = json.loads(
        encode_checkpoint(Checkpoint(1, {(s.input_topic, 0): 1}, learner.to_state(), 2, model_meta(s), 0.0, owner))
    )
    forge(doc)
    path = store.task_dir(GROUP_TASK)
    path.mkdir(parents=True)
    (path / "checkpoint-000000000001.json").write_bytes(resealed(doc))
    with pytest.raises(CheckpointError):  # nothing usable: stop rather than start from zero weights (as before)
        Restorer(s, store, Retry(Health(60.0), lambda: False)).restore(task)
    assert refused == [reason]
    assert task.learner.weights == {}

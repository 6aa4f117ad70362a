"""The restorer's checks of a checkpoint it reads back (perceptron_stream.runtime.restore), on the local store: every
one refused is told to the store's ``on_reject`` (the metric at start-up) under its reason, and none reaches a task."""

from __future__ import annotations

import json
import logging

import pytest
from perceptron_stream.config import ServeSettings, load
from perceptron_stream.learning import make_learner
from perceptron_stream.runtime.factory import TaskFactory, model_meta
from perceptron_stream.runtime.health import Health
from perceptron_stream.runtime.restore import Restorer
from perceptron_stream.runtime.retry import Retry, StartupError
from perceptron_stream.state.checkpoint import GROUP_TASK, Checkpoint, CheckpointError, Owner, encode_checkpoint
from perceptron_stream.state.local import LocalStore

from tests.support.checkpoints import resealed


def _group_model(tmp_path):
    """Settings, the group model's owner and task, a learner that learned one event, and the local store."""
    s = load(ServeSettings, ["--metrics-port", "0", "--state-dir", str(tmp_path / "state")])
    owner = Owner(s.group_id, s.input_topic, GROUP_TASK, "cluster", "topic-id")
    task = TaskFactory(s, owner).new_task(None)
    learner = make_learner(max_features=s.max_model_features)
    learner.step([1.0, 2.0], 1)
    return s, owner, task, learner, LocalStore(s.state_dir, s.group_id)


def _committed_at_200(s, store) -> Restorer:
    """A restorer to whom the group committed offset 200 of partition 0, in a log of 200 records."""
    restorer = Restorer(s, store, Retry(Health(60.0), lambda: False))
    restorer._read = {("offsets", s.input_topic): {0: 200}, ("ranges", s.input_topic): {0: (0, 200)}}  # noqa: SLF001 — the group's, as the brokers would answer
    return restorer


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
    s, owner, task, learner, store = _group_model(tmp_path)
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


KEY = b"a-secret-of-32-bytes-for-tests!!"


@pytest.mark.parametrize(
    "junk",
    [
        b"junk, not a checkpoint",  # with the key: anyone who can write the store can write junk
        None,  # an unsigned checkpoint claiming a higher seq: the same
    ],
    ids=["junk", "unsigned newer"],
)
def test_with_a_key_an_old_signed_checkpoint_beside_a_junk_record_is_refused_as_stale(tmp_path, junk):
    """Measured on 3125c7b: issue 35's replay with one junk record: an old signed checkpoint (position 40, the group
    committed 200) with junk where a newer one would be was restored with a WARNING as the fallback from a damaged
    newer one, and the 160 events between learned and published again. Now refused as stale."""
    s, owner, task, learner, store = _group_model(tmp_path)
    store.key = KEY
    refused: list[str] = []
    store.on_reject = refused.append
    old = Checkpoint(3, {(s.input_topic, 0): 40}, learner.to_state(), 2, model_meta(s), 0.0, owner)
    store.save(old)
    newer = encode_checkpoint(
        Checkpoint(4, {(s.input_topic, 0): 200}, learner.to_state(), 2, model_meta(s), 0.0, owner)
    )
    (store.task_dir(GROUP_TASK) / "checkpoint-000000000004.json").write_bytes(junk if junk is not None else newer)
    restorer = _committed_at_200(s, store)
    with pytest.raises(StartupError, match=r"checkpoint 3 of .* is behind the offsets .* committed 200"):
        restorer.restore(task)
    assert refused[-1] == "stale"
    assert task.learner.weights == {}


def test_without_a_key_the_fallback_from_a_damaged_newer_file_is_restored_with_a_warning(tmp_path, caplog):
    """The documented fallback (docs/how-to/security.md): the newest checkpoint file damaged, the one before it
    behind the committed offsets is restored, the WARNING saying the events since are learned again."""
    s, owner, task, learner, store = _group_model(tmp_path)
    store.save(Checkpoint(3, {(s.input_topic, 0): 40}, learner.to_state(), 2, model_meta(s), 0.0, owner))
    (store.task_dir(GROUP_TASK) / "checkpoint-000000000004.json").write_bytes(b'{"seq": 4, "posit')  # cut short
    restorer = _committed_at_200(s, store)
    with caplog.at_level(logging.WARNING, logger="perceptron_stream"):
        assert restorer.restore(task)
    assert "learned and published again" in caplog.text
    assert task.learner.weights == learner.weights

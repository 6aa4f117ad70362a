"""Which state topics are checked, and what about them stops the service (perceptron_stream.runtime.state_topics);
on real brokers and service processes: tests/integration/test_state_topics.py."""

from __future__ import annotations

import pytest
from perceptron_stream.config import ServeSettings, load
from perceptron_stream.runtime.state_topics import StateTopic, id_problem, policy_problem, state_topics

CHECKPOINTS = StateTopic("ckpt", "checkpoint_topic", "checkpoint")


def _names(*args: str) -> list[str]:
    return [t.name for t in state_topics(load(ServeSettings, ["--metrics-port", "0", *args]))]


def test_the_topics_checked_are_those_the_settings_keep_state_in():
    assert _names() == []  # the local store
    assert _names("--state-store", "kafka") == ["perceptron-stream.checkpoints"]
    assert _names("--state-store", "kafka", "--label-topic", "labels", "--pending-topic", "pending") == [
        "perceptron-stream.checkpoints",
        "pending",
    ]
    assert _names("--label-topic", "labels") == []  # the local store keeps the pending tables on its disk
    mixing = ("--model-scope", "partition", "--mix-every", "100", "--mix-topic", "mix")
    assert _names(*mixing) == ["mix"]
    assert _names("--state-store", "kafka", *mixing) == ["perceptron-stream.checkpoints", "mix"]


@pytest.mark.parametrize("policy", ["compact", "compact ", "compact,compact"])
def test_a_compacted_topic_keeps_state_whoever_created_it(policy):
    assert policy_problem(CHECKPOINTS, {"cleanup.policy": policy}) is None


@pytest.mark.parametrize("configs", [{"cleanup.policy": "delete"}, {"cleanup.policy": "compact,delete"}, {}])
def test_a_topic_that_deletes_records_is_refused_naming_cleanup_policy_and_the_way_out(configs):
    problem = policy_problem(CHECKPOINTS, configs)
    assert problem is not None
    assert problem.startswith("the checkpoint topic ckpt (--checkpoint-topic) has cleanup.policy=")
    assert "--add-config cleanup.policy=compact" in problem and "--create-topics" in problem
    assert ("(the brokers' default)" in problem) == (configs == {})


def test_a_topic_gone_or_created_again_is_told_apart_from_the_one_the_service_started_with():
    assert id_problem(CHECKPOINTS, "id-1", "id-1") is None
    assert id_problem(CHECKPOINTS, None, "id-2") is None  # no id at start-up: nothing to compare
    gone = id_problem(CHECKPOINTS, "id-1", None)
    again = id_problem(CHECKPOINTS, "id-1", "id-2")
    assert gone is not None and "was deleted while the service ran" in gone
    assert again is not None and "created again while the service ran (its topic id was id-1, now id-2)" in again
    assert all("--start-over" in said and "PerceptronTargetDown.md" in said for said in (gone, again))


def test_a_topic_described_with_no_configs_is_not_described_and_never_refused_for_a_policy(monkeypatch, caplog):
    """kafka-python answers a resource the principal may not describe (DescribeConfigs denied) with no configs and
    no error: that was read as "cleanup.policy=delete (the brokers' default)" and stopped a service whose topic is
    compacted, telling the operator to delete it. Apache Kafka describes every config of a topic it may describe."""
    import perceptron_stream.runtime.state_topics as module
    from perceptron_stream.runtime.health import Health
    from perceptron_stream.runtime.retry import Retry

    s = load(ServeSettings, ["--metrics-port", "0", "--state-store", "kafka"])
    watch = module.StateTopics(s, Retry(Health(60.0), lambda: False))
    monkeypatch.setattr(watch.watch, "ids", lambda names: {name: "id-1" for name in names})
    monkeypatch.setattr(watch.watch, "configs", lambda names: {name: {} for name in names})
    assert watch.start(embedded=False)  # no StateTopicError
    assert not watch.keeps_configs and "their cleanup.policy is not checked" in caplog.text
    watch.check()  # from then on the ids alone

"""Reason codes (``--explain K``) on Apache Kafka: every prediction carries the K largest parts of its score, the very
ones an offline replay of the same learner computes, on both clients, for the credit stream (its policy changes
midway), standardised and averaged, and hashed."""

from __future__ import annotations

import json
from itertools import islice

import pytest
from perceptron_stream.config import ServeSettings, load
from perceptron_stream.learning import make_learner
from perceptron_stream.learning.many import in_order_sum
from perceptron_stream.streams import credit
from perceptron_stream.wire.messages import Prediction

from tests.support.launch import settings_args
from tests.support.service import OutputWatcher, run_to_the_end
from tests.support.topics import produce

pytestmark = pytest.mark.integration

COUNT, K = 3000, 3
SETTINGS = {
    "plain": [],
    "standardized-averaged": ["--standardize", "--variant", "averaged"],
    "hashed": ["--hash-features", "8"],  # age and debt share one of the 8 buckets
}


def _replay(events: list[dict], flags: list[str]) -> list[tuple]:
    """(all the parts, the bias, the score) of each event, as one learner of the service's settings steps them."""
    s = load(ServeSettings, flags)
    learner = make_learner(s.variant, s.margin, s.standardize, s.max_model_features or None, s.hash_features)
    out = []
    for e in events:
        (_, score, _), parts, bias = learner.explain_step(e["features"], e.get("y"))
        out.append((parts, bias, score))
    return out


@pytest.mark.parametrize("client", ["kafka-python", "confluent"])
@pytest.mark.parametrize("kind", sorted(SETTINGS))
def test_each_prediction_carries_the_largest_parts_of_its_score_as_an_offline_replay_computes_them(
    apache_kafka, tmp_path, topics, kind, client
):
    events = list(islice(credit(drift_every=COUNT // 2), COUNT))
    produce(apache_kafka.bootstrap_servers, topics["input_topic"], events)
    flags = ["--explain", str(K), *SETTINGS[kind]]
    args = settings_args(apache_kafka, topics, tmp_path, kafka_client=client) + flags
    watcher = OutputWatcher(apache_kafka.bootstrap_servers, topics["output_topic"]).start()
    try:
        run_to_the_end(args, watcher, COUNT, tmp_path / "serve.log")
        watcher.settle()
    finally:
        by_source = watcher.stop()
    replay = _replay(events, flags)
    for offset, (parts, bias, score) in enumerate(replay):
        [value] = by_source[offset]
        message = json.loads(value)
        Prediction.model_validate(message)  # the schema holds the reasons
        assert message["score"] == score
        largest = sorted(parts, key=lambda part: -abs(part[3]))[:K]
        assert [tuple(reason.values()) for reason in message["reasons"]] == largest, offset
        assert message["bias"] == bias
        total = in_order_sum(c for *_, c in parts) + bias
        if "averaged" in kind:  # the lazy average's score: within rounding of its parts
            assert abs(total - score) <= 4e-15 * (sum(abs(c) for *_, c in parts) + abs(bias)), offset
        else:
            assert total == score, offset  # every part of it, to the last bit
    hashed = {reason["feature"] for value in by_source.values() for reason in json.loads(value[0])["reasons"]}
    if kind == "hashed":
        assert any(" + " in str(feature) for feature in hashed), hashed  # a bucket two names of one event share
    else:
        assert hashed <= {"age", "salary", "years_in_job", "debt"}, hashed

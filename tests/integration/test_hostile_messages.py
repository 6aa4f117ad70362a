"""Hostile messages through a running service: each gets its answer (a prediction or a dead letter), none twice.

What the service must answer is decided offline by the same decoder and
learner; the messages are tests/support/hostile.py's (the decoder's own fuzz
tests are tests/wire/test_fuzz.py).
"""

from __future__ import annotations

import json

import orjson
from perceptron_stream.learning import make_learner
from perceptron_stream.wire.inputs import Decoder
from perceptron_stream.wire.messages import DeadLetter, Event
from perceptron_stream.wire.outputs import DEAD_LETTER_ERROR_LIMIT

from tests.support.hostile import MAX_BYTES, MAX_FEATURES, POISON, collect, service_messages


def test_a_running_service_survives_hostile_messages(broker, topics, tmp_path):
    from perceptron_stream.config import ServeSettings, load
    from perceptron_stream.state.local import LocalStore
    from perceptron_stream.streams import separable

    from tests.support.launch import settings_args, start_service_process
    from tests.support.service import stop_process, tail
    from tests.support.topics import consume, produce

    hostile = POISON + collect(service_messages, 400)
    good = [json.dumps(e).encode() for e, _ in zip(separable(dimensions=3, seed=31), range(100))]
    stream = [good[0]] + [m for pair in zip(hostile, good[1:] * 5) for m in pair]  # a good one first fixes d = 3

    # what the service must do with each, decided offline by the same decoder and learner
    cap = ServeSettings.model_fields["max_model_features"].default  # the service's learner, cap included
    decoder, learner = Decoder(MAX_BYTES, MAX_FEATURES), make_learner("plain", max_features=cap)
    expected: list[tuple[str, bytes | str]] = []
    for raw in stream:
        result = decoder.decode(raw)
        if isinstance(result, Event):
            y_pred, score, mistake = learner.step(result.x, result.y)
            expected.append(("prediction", orjson.dumps({"y_pred": y_pred, "score": score, "mistake": mistake})))
        else:
            expected.append(("dead letter", result.reason))
    predictions = sum(kind == "prediction" for kind, _ in expected)

    produce(broker.bootstrap_servers, topics["input_topic"], stream, keys=[b"k"] * len(stream))
    args = settings_args(
        broker, topics, tmp_path, max_message_bytes=MAX_BYTES, max_features=MAX_FEATURES, batch_size=50
    )
    log_path = tmp_path / "serve.log"
    process = start_service_process(args, log_path)
    try:
        outputs = consume(broker.bootstrap_servers, topics["output_topic"], predictions, timeout=120)
        letters = consume(broker.bootstrap_servers, topics["dlq_topic"], len(stream) - predictions, timeout=60)
        assert process.poll() is None, tail(log_path)
    finally:
        code = stop_process(process, log_path)
    assert code == 0, tail(log_path)
    assert "Traceback" not in log_path.read_text(), tail(log_path)

    got = {}
    for record in outputs:
        p = orjson.loads(record.value)
        got[p["source"]["offset"]] = ("prediction", orjson.dumps({k: p[k] for k in ("y_pred", "score", "mistake")}))
    for record in letters:
        letter = orjson.loads(record.value)
        DeadLetter.model_validate(letter)
        assert len(letter["error"]) <= DEAD_LETTER_ERROR_LIMIT
        assert letter["source"]["offset"] not in got, "an input both predicted and dead-lettered"
        got[letter["source"]["offset"]] = ("dead letter", letter["reason"])
    assert len(outputs) + len(letters) == len(stream)  # one answer per input, none twice
    assert [got.get(offset) for offset in range(len(stream))] == expected
    settings = load(ServeSettings, args)
    final = LocalStore(settings.state_dir, settings.group_id).load("model")
    assert final is not None
    assert json.dumps(final.model, sort_keys=True) == json.dumps(learner.to_state(), sort_keys=True)  # NaN-safe
    assert final.positions == {(topics["input_topic"], 0): len(stream)}

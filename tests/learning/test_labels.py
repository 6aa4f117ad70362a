"""One table of label spellings: the wire (both decoder paths, labels), the CSV reader and the learner agree."""

from __future__ import annotations

import json

import pytest
from perceptron_stream.learning import to_label
from perceptron_stream.learning.labels import LABELS, json_label
from perceptron_stream.streams import csv_label
from perceptron_stream.wire.inputs import Decoder, decode_label
from perceptron_stream.wire.messages import Event, Label, Rejection

SPELLINGS = [(1, 1), (-1, -1), (0, -1), (True, 1), (False, -1)]


@pytest.mark.parametrize(("value", "y"), SPELLINGS)
def test_every_spelling_means_the_same_everywhere(value, y):
    raw = json.dumps({"features": {"a": 1.0}, "y": value}).encode()
    fast, model = Decoder(1000, 10), Decoder(1000, 10, model_first_bytes=0)  # the fast path, and the model's
    fast_event, model_event = fast.decode(raw), model.decode(raw)
    assert isinstance(fast_event, Event) and isinstance(model_event, Event)
    assert fast_event.y == model_event.y == y
    assert decode_label(json.dumps({"id": "p", "y": value}).encode(), None, 1000) == Label("p", y)
    assert to_label(value) == json_label(value) == LABELS[value] == y
    assert csv_label(json.dumps(value)) == y  # 1, -1, 0, true, false as a CSV cell


@pytest.mark.parametrize("value", [2, -2, 1.0, 0.5, "1", None, [1]])
def test_what_is_not_a_label_on_the_wire_is_a_bad_label_with_the_same_sentence(value):
    raw = json.dumps({"features": {"a": 1.0}, "y": value}).encode()
    for decoder in (Decoder(1000, 10), Decoder(1000, 10, model_first_bytes=0)):
        got = decoder.decode(raw)
        if value is None:
            assert isinstance(got, Event) and got.y is None  # null: unlabeled
        else:
            assert type(got) is Rejection and got.reason == "bad_label"
            assert got.error.startswith("y must be -1 or +1 (0/1 and false/true are accepted too), got ")
    assert json_label(value) is None


def test_the_learner_also_takes_numbers_equal_to_a_spelling_and_says_so_of_others():
    assert to_label(1.0) == 1 and to_label(-1.0) == -1 and to_label(0.0) == -1
    with pytest.raises(ValueError, match=r"^y must be -1 or \+1 \(or True/False, 1/0\), got '1'$"):
        to_label("1")

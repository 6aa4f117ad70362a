"""Decoding costs a parse of the message and its first error, whatever the message holds.

Speed itself is measured by bench/decoder.py, never here: these tests check
the structure that bounds it. A 100 KB ``{"x": [[], [], ...]}`` used to make
the model report 33,000 errors (one per bad element, each holding its input as
Python objects) for the decoder to tell only the first.
"""

from __future__ import annotations

import perceptron_stream.wire.inputs as schema
import pytest
from perceptron_stream.wire.inputs import MODEL_FIRST_BYTES, Decoder
from perceptron_stream.wire.messages import InputEvent, Rejection
from pydantic import ValidationError

#: name → a message with ``n`` bad elements (or one bad value holding ``n`` elements)
HOSTILE = {
    "x of lists": lambda n: b'{"x": [' + b",".join([b"[]"] * n) + b"]}",
    "x of objects": lambda n: b'{"x": [' + b",".join([b"{}"] * n) + b"]}",
    "x of strings": lambda n: b'{"x": [' + b",".join([b'"a"'] * n) + b"]}",
    "x of nulls": lambda n: b'{"x": [' + b",".join([b"null"] * n) + b"]}",
    "x of booleans": lambda n: b'{"x": [' + b",".join([b"true"] * n) + b"]}",
    "x of NaN": lambda n: b'{"x": [' + b",".join([b"NaN"] * n) + b"]}",
    "x of 1e999": lambda n: b'{"x": [' + b",".join([b"1e999"] * n) + b"]}",
    "x of numbers, then lists": lambda n: b'{"x": [1.5, 2, ' + b",".join([b"[]"] * n) + b"]}",
    "features of lists": lambda n: b'{"features": {' + b",".join(b'"f%d": []' % i for i in range(n)) + b"}}",
    "features of strings": lambda n: b'{"features": {' + b",".join(b'"f%d": "a"' % i for i in range(n)) + b"}}",
    "features of NaN": lambda n: b'{"features": {' + b",".join(b'"f%d": NaN' % i for i in range(n)) + b"}}",
    "features, one key repeated": lambda n: b'{"features": {' + b",".join([b'"a": []'] * n) + b"}}",
    "features, extra keys": lambda n: (
        b'{"e": 1, "features": {' + b",".join(b'"f%d": null' % i for i in range(n)) + b"}}"
    ),
}


def _errors_reported(raw: bytes) -> int:
    try:
        InputEvent.model_validate_json(raw)
    except ValidationError as exc:
        return exc.error_count()
    return 0


@pytest.mark.parametrize("shape", HOSTILE)
def test_the_model_stops_at_the_first_bad_element(shape):
    assert _errors_reported(HOSTILE[shape](3)) == 1
    assert _errors_reported(HOSTILE[shape](5000)) == 1


def test_a_bad_element_in_each_form_is_one_error_each():
    """x and features are both checked (the first in field order is told), each up to its first bad element."""
    raw = (
        b'{"x": ['
        + b",".join([b"[]"] * 1000)
        + b'], "features": {'
        + b",".join(b'"f%d": []' % i for i in range(1000))
        + b"}}"
    )
    assert _errors_reported(raw) == 2
    assert Decoder(1_000_000, 10_000).decode(raw) == Rejection(
        "invalid_event", "x[0] must be a number, got a list [...]"
    )


@pytest.mark.parametrize(
    "value",
    [b"[" + b",".join([b"[]"] * 5000) + b"]", b"{}", b"[]", b"1.5", b'{"a": [1, 2]}'],
    ids=["5000 lists", "{}", "[]", "1.5", "an object"],
)
def test_a_bad_id_is_one_error(value):
    """Not one per member of ``str | int``: each error holds the whole id as Python objects."""
    raw = b'{"x": [1.0], "id": ' + value + b"}"
    assert _errors_reported(raw) == 1
    got = Decoder(1_000_000, 10_000).decode(raw)
    assert isinstance(got, Rejection)
    assert got.reason == "invalid_event" and got.error.startswith("id must be a string or a number, got ")


@pytest.mark.parametrize("shape", HOSTILE)
@pytest.mark.parametrize("n", [3, 2000])
def test_the_decoder_explains_one_error_whatever_the_count(monkeypatch, shape, n):
    """What the decoder's model path hands to the explanation, small message (orjson first) or large."""
    counts = []
    explain = schema._explain  # noqa: SLF001 — no public hook sees the errors it is handed

    def counting(exc, raw):
        counts.append(exc.error_count())
        return explain(exc, raw)

    monkeypatch.setattr(schema, "_explain", counting)
    got = Decoder(1_000_000, 10_000).decode(HOSTILE[shape](n))
    assert type(got) is Rejection
    assert counts == [1]


def test_a_large_message_is_parsed_once(monkeypatch):
    """From MODEL_FIRST_BYTES the model's parser alone reads the message: the fast path would first parse a
    hostile one, to hand it to the model that parses it again."""
    calls: list[int] = []
    decoder = Decoder(1_000_000, 10_000)
    fast = decoder._fast_decode  # noqa: SLF001 — decode() does not tell which path ran

    def counted(raw):
        calls.append(len(raw))
        return fast(raw)

    monkeypatch.setattr(decoder, "_fast_decode", counted)
    small, large = HOSTILE["x of lists"](10), HOSTILE["x of lists"](MODEL_FIRST_BYTES)
    assert len(small) < MODEL_FIRST_BYTES <= len(large)
    assert (
        decoder.decode(large)
        == decoder.decode(small)
        == Rejection("invalid_event", "x[0] must be a number, got a list [...]")
    )
    assert calls == [len(small)]


@pytest.mark.parametrize(
    "raw",
    [
        b'{"id": "c-1", "x": [' + b",".join(b"0.%017d" % i for i in range(400)) + b'], "y": 1}',
        b'{"features": {' + b",".join(b'"f%d": %d' % (i, i % 2) for i in range(800)) + b'}, "y": 0}',
        b'{"x": [' + b",".join([b"1", b"0"] * 1200) + b'], "source": "sensor-7"}',
    ],
    ids=["dense", "features of 0 and 1", "0 and 1, a key of the producer's"],
)
def test_a_large_valid_event_decodes_as_on_the_fast_path(raw):
    assert len(raw) >= MODEL_FIRST_BYTES
    assert repr(Decoder(1_000_000, 10_000).decode(raw)) == repr(
        Decoder(1_000_000, 10_000, model_first_bytes=len(raw) + 1).decode(raw)
    )

"""The wire format: the models, the committed JSON Schemas and the decoder."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from perceptron_stream.wire.inputs import Decoder
from perceptron_stream.wire.messages import (
    DEAD_LETTER_RAW_LIMIT,
    SCHEMA_DIR,
    Event,
    Prediction,
    Rejection,
    json_schemas,
)
from perceptron_stream.wire.outputs import dead_letter


def _event(outcome: Event | Rejection) -> Event:
    assert isinstance(outcome, Event), outcome
    return outcome


def _reason(outcome: Event | Rejection) -> str:
    assert isinstance(outcome, Rejection), outcome
    return outcome.reason


def test_committed_schemas_match_the_models():
    for filename, text in json_schemas().items():
        path = SCHEMA_DIR / filename
        assert path.exists(), f"{path} is missing: run python -m perceptron_stream.wire.messages"
        assert path.read_text(encoding="utf-8") == text, (
            f"{path} drifted from the models: run python -m perceptron_stream.wire.messages"
        )
    assert sorted(p.name for p in SCHEMA_DIR.glob("*.json")) == sorted(json_schemas())


def test_the_design_examples_are_valid():
    d = Decoder(1_000_000, 100)
    assert d.decode(b'{"id": "c-1042", "x": [0.3, 1.2, -0.5], "y": 1}') == Event("c-1042", [0.3, 1.2, -0.5], 1)
    assert d.decode(b'{"id": "c-1043", "features": {"age": 31, "salary": 52000}, "y": -1}') == Event(
        "c-1043", {"age": 31.0, "salary": 52000.0}, -1
    )
    assert d.decode(b'{"id": "c-1044", "x": [0.1, 0.2, 0.3]}') == Event("c-1044", [0.1, 0.2, 0.3], None)
    Prediction.model_validate(
        {
            "id": "c-1042",
            "source": {"topic": "points", "partition": 0, "offset": 17},
            "y_pred": 1,
            "score": 2.5,
            "y": 1,
            "mistake": False,
            "model": {"version": 42, "seen": 1000, "mistakes": 12},
        }
    )


@pytest.mark.parametrize("y, label", [(1, 1), (-1, -1), (0, -1), (True, 1), (False, -1), (None, None)])
def test_accepted_labels_map_to_plus_minus_one(y, label):
    assert _event(Decoder(1000, 10).decode(json.dumps({"x": [1.0], "y": y}).encode())).y == label


@pytest.mark.parametrize(
    "raw, reason, says",
    [
        (b"{not json", "invalid_json", "not valid JSON"),
        (b"\xc3\x28{}", "not_utf8", "not UTF-8"),
        (b"[1]", "invalid_event", "must be a JSON object, got a list"),
        (b'{"x": [1, "2"]}', "invalid_event", 'x[1] must be a number, got a string "2"'),
        (b'{"features": {"age": null}}', "invalid_event", "features.age must be a number"),
        (b'{"x": [Infinity]}', "non_finite", "x[0] must be a finite number, got Infinity"),
        (b'{"x": [1], "features": {"a": 1}}', "invalid_event", "exactly one of x"),
        (b'{"y": 1}', "invalid_event", "got neither"),
        (b'{"x": [1], "y": 2}', "bad_label", "y must be -1 or +1"),
        (b'{"x": [1], "y": 1.5}', "bad_label", "got 1.5"),
        (b'{"x": [1, 2, 3, 4, 5, 6]}', "too_many_features", "6 features, more than the limit of 5"),
        (b'{"x": [1]}' + b" " * 600, "too_large", "more than the limit of 500"),
        (b'{"x": [' + b"[" * 5000 + b"]}", "invalid_json", "recursion limit"),
        (b'{"x": [1e16]}', "out_of_range", "x has a value of magnitude 1e+16, more than the limit of 1e+15"),
        (b'{"features": {"a": -1.7e308}}', "out_of_range", "features has a value of magnitude 1.7e+308"),
        (b'{"x": [1, "2"], "id": {"deep": 1e308}}', "invalid_event", "id must be a string or a number"),
    ],
)
def test_rejections_say_what_to_fix(raw, reason, says):
    got = Decoder(max_message_bytes=500 if b" " * 600 in raw else 100_000, max_features=5).decode(raw)
    assert isinstance(got, Rejection)
    assert got.reason == reason
    assert says in got.error
    assert len(got.error) < 200


def test_the_key_counts_toward_the_size_limit():
    """A prediction carries its input's key: a huge key must not make an output larger than the brokers take."""
    d = Decoder(max_message_bytes=100, max_features=10)
    raw = b'{"x": [1.0]}'
    assert d.decode(raw, b"k" * (100 - len(raw))) == Event(None, [1.0], None)
    got = d.decode(raw, b"k" * (101 - len(raw)))
    assert got == Rejection(
        "too_large", f"the message is 101 bytes (key {101 - len(raw)} + value {len(raw)}), more than the limit of 100"
    )


def test_the_magnitude_limit_is_a_setting():
    assert Decoder(1000, 10, max_feature_value=1e300).decode(b'{"x": [1e299]}') == Event(None, [1e299], None)
    assert _reason(Decoder(1000, 10, max_feature_value=1e300).decode(b'{"x": [1e301]}')) == "out_of_range"


def test_the_first_dense_event_fixes_the_dimension():
    d = Decoder(1000, 10)
    assert isinstance(d.decode(b'{"x": [1, 2]}'), Event)
    assert _reason(d.decode(b'{"x": [1, 2, 3]}')) == "wrong_dimension"
    assert isinstance(d.decode(b'{"features": {"a": 1, "b": 2, "c": 3}}'), Event)  # named features are free
    assert _reason(Decoder(1000, 10, dimension=3).decode(b'{"x": [1, 2]}')) == "wrong_dimension"


def test_a_dimension_beyond_the_feature_limit_takes_no_dense_event():
    """A checkpoint's dimension from before a lower --max-features: its events have too many features now."""
    d = Decoder(1000, 2, dimension=3)
    assert _reason(d.decode(b'{"x": [1, 2, 3]}')) == "too_many_features"
    assert _reason(d.decode(b'{"x": [1, 2]}')) == "wrong_dimension"
    assert d.decode(b'{"features": {"a": 1, "b": 2}}') == Event(None, {"a": 1.0, "b": 2.0}, None)


def test_the_fast_path_takes_any_limit_and_no_dimension_a_dense_event_cannot_have():
    """A review's edge cases: a dimension of 0 let an empty x through the fast path; a limit beyond a C size
    made the decoder itself raise."""
    assert _reason(Decoder(1000, 5, dimension=0).decode(b'{"x": []}')) == "invalid_event"
    assert _reason(Decoder(1000, 5, dimension=0).decode(b'{"x": [1]}')) == "wrong_dimension"
    assert Decoder(1000, 2**63).decode(b'{"x": [1, 2]}') == Event(None, [1.0, 2.0], None)


def test_dead_letters_keep_the_original():
    text = dead_letter(Rejection("bad_label", "y must be..."), b'{"y": 2}', "points", 3, 99)
    assert text == {
        "error": "y must be...",
        "reason": "bad_label",
        "source": {"topic": "points", "partition": 3, "offset": 99},
        "raw": '{"y": 2}',
        "raw_encoding": "utf-8",
        "raw_truncated": False,
    }
    binary = dead_letter(Rejection("not_utf8", "..."), b"\xff\x00", "points", 0, 1)
    assert (binary["raw"], binary["raw_encoding"]) == ("/wA=", "base64")
    huge = dead_letter(Rejection("too_large", "..."), b"a" * (DEAD_LETTER_RAW_LIMIT + 10), "points", 0, 2)
    assert huge["raw_truncated"] and len(huge["raw"]) == DEAD_LETTER_RAW_LIMIT


# The fast path (msgspec, the limits and the fixed dimension in its type) must decode every message exactly as the
# model and the decoder's own rules do.

_numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(2**70), 2**70),
    st.booleans(),
    st.sampled_from([0, 1, -1, 0.0, 1.0, -0.0, 1e308, 5e-324, 2**53 + 1]),
)
_values = st.one_of(
    st.none(),
    _numbers,
    st.text(max_size=5),
    st.lists(_numbers, max_size=3),
    st.dictionaries(st.text(max_size=3), _numbers, max_size=3),
)
_events = st.dictionaries(
    st.sampled_from(["id", "x", "features", "y", "extra"]),
    st.one_of(
        _values, st.lists(_numbers, min_size=2, max_size=2), st.dictionaries(st.text(max_size=3), _numbers, max_size=7)
    ),
)


@settings(max_examples=1500, deadline=None)
@given(
    event=_events,
    dimension=st.sampled_from([2, 2, None, 1, 3]),
    max_features=st.sampled_from([5, 2]),
    max_feature_value=st.sampled_from([1e15, 2.5]),
)
def test_the_fast_path_decodes_as_the_model_does(event, dimension, max_features, max_feature_value):
    """Also with no dimension yet, and with a checkpoint's dimension beyond today's --max-features."""
    raw = json.dumps(event).encode()  # NaN and Infinity too, as Python writes them
    fast, model = (
        Decoder(100_000, max_features, dimension=dimension, max_feature_value=max_feature_value) for _ in range(2)
    )
    assert repr(fast.decode(raw)) == repr(model._decode_model(raw))  # noqa: SLF001 — the model path alone (decode() picks one)
    assert fast.dimension == model.dimension


@pytest.mark.parametrize(
    "raw",
    [
        b'{"id": "p-1", "x": [0.25, -1.5, 3], "y": 1}',
        b'{"id": 7, "features": {"a": 1, "b": 2.5}, "y": 0}',
        b'{"x": [1, 2], "y": true}',
        b'{"x": [1, 2], "y": false}',
        b'{"x": [1, 2], "y": null}',
        b'{"x": [1, 2], "features": null}',
        b'{"x": null, "features": {"a": 1}}',
        b'{"x": [1, 2], "x": [3]}',
        b'{"id": 1.0, "x": [1]}',
        b'{"id": true, "x": [1]}',
        b'{"id": 18446744073709551616, "x": [1]}',
        b'{"x": [9007199254740993, 1e-400]}',
        b'{"x": [1e999]}',
        b'{"x": [1], "y": 1.0}',
        b'{"x": [1], "y": -2}',
        b'{"x": []}',
        b'{"features": {}}',
        b'{"x": [true]}',
        b'{"x": [1], "other": {"deep": [[1]]}}',
        b' {"x": [1]}\n',
        b'{"id": "\\ud800", "x": [1]}',
        b'\xef\xbb\xbf{"x": [1]}',
        b'{"x": [1, 2, 3, 4, 5, 6]}',
        b"[]",
        b'"x"',
        b'{"x": {"a": 1}}',
        b'{"features": [1]}',
    ],
)
def test_the_fast_path_and_the_model_agree_on_edge_cases(raw):
    assert repr(Decoder(100_000, 5).decode(raw)) == repr(Decoder(100_000, 5)._decode_model(raw))  # noqa: SLF001 — the model path alone (decode() picks one)

"""A dead letter, key included, fits --max-message-bytes like the input it replaces.

JSON escaping writes a control character as six bytes (\\u0000): 64 KB of them
plus a 935 KB key made a 1.3 MB dead letter, which a broker with a 1 MB limit
refuses. The raw head is cut to fit; a key that leaves no room even for a letter
with no raw is left off, and the letter says so.
"""

from __future__ import annotations

import base64

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from perceptron_stream.app import Application
from perceptron_stream.config import ConfigError, ServeSettings, load
from perceptron_stream.kafka import Record
from perceptron_stream.wire.messages import DEAD_LETTER_RAW_LIMIT, DeadLetter, Rejection
from perceptron_stream.wire.outputs import DEAD_LETTER_ERROR_LIMIT, dead_letter_record, dead_letter_value

CONTROL = bytes(range(32))


def test_the_issue_example_fits_the_limit():
    raw, key = CONTROL * 2048, b"k" * 935_000  # 64 KiB of control characters and a 935 KB key
    rejection = Rejection("invalid_json", "the message is not valid JSON: control character (\\u0000-\\u001F) found")
    assert len(key) + len(dead_letter_value(rejection, raw, "points", 0, 7)) > 1_000_000  # unbounded: 1.3 MB
    sent_key, value = dead_letter_record(rejection, raw, key, "points", 0, 7, 1_000_000)
    assert sent_key == key and len(key) + len(value) <= 1_000_000
    letter = DeadLetter.model_validate_json(value)
    assert letter.raw_truncated and raw.startswith(letter.raw.encode()) and len(letter.raw) > 10_000
    assert len(key) + len(value) > 1_000_000 - 6  # cut no further than one escaped character too many
    assert letter.error == rejection.error and not letter.key_dropped


def test_a_key_with_no_room_left_is_dropped_and_the_letter_says_so():
    raw, key = b'{"x": [1, 2], "y": 2}', b"k" * 999_900
    sent_key, value = dead_letter_record(
        Rejection("bad_label", "y must be -1 or +1, got 2"), raw, key, "points", 0, 7, 1_000_000
    )
    letter = orjson.loads(value)
    assert sent_key is None and letter["key_dropped"] is True
    assert letter["raw"] == raw.decode() and letter["raw_truncated"] is False  # without the key the raw fits again
    DeadLetter.model_validate(letter)


def test_a_letter_that_fits_is_as_before():
    rejection = Rejection("bad_label", "y must be -1 or +1, got 2")
    key, value = dead_letter_record(rejection, b'{"y": 2}', b"key", "points", 3, 99, 1024)
    assert key == b"key" and value == dead_letter_value(rejection, b'{"y": 2}', "points", 3, 99)
    assert "key_dropped" not in orjson.loads(value)


@pytest.mark.parametrize("raw", [b"abc", b"\xff\xfe\xfd", "é".encode() * 5, b"\x00" * 40])
@pytest.mark.parametrize("short_by", [1, 2, 5])
def test_a_letter_a_few_bytes_too_long_loses_raw_and_says_so(raw, short_by):
    """ "raw_truncated": true is a byte shorter than false: the letter must not fit by that alone, with all its raw."""
    rejection = Rejection("invalid_json", "the message is not valid JSON")
    limit = len(dead_letter_value(rejection, raw, "points", 0, 1)) - short_by
    letter = DeadLetter.model_validate_json(value := dead_letter_value(rejection, raw, "points", 0, 1, max_bytes=limit))
    kept = letter.raw.encode() if letter.raw_encoding == "utf-8" else base64.b64decode(letter.raw)
    assert len(value) <= limit and raw.startswith(kept) and len(kept) < len(raw) and letter.raw_truncated


def test_the_limit_cannot_be_set_below_one_kib():
    """Below it there is no room for a dead letter's error sentence and source."""
    assert load(ServeSettings, ["--max-message-bytes", "1024"]).max_message_bytes == 1024
    with pytest.raises(ConfigError, match="max_message_bytes"):
        load(ServeSettings, ["--max-message-bytes", "1023"])


# the property ----------------------------------------------------------------
_pieces = st.sampled_from(
    [
        b"\x00",
        b"\x1f",
        b'"',
        b"\\",
        b"a",
        "é".encode(),
        "€".encode(),
        "😀".encode(),
        b"\xff",
        b"\xc3",
        b"\n",
        b"\x7f",
        "\u2028".encode(),
    ]
)
_errors = st.text(st.characters(codec="utf-8"), max_size=30).map(
    lambda t: t * 70
)  # up to 2,100 characters, controls too


@st.composite
def _letters(draw):
    max_bytes = draw(st.sampled_from([1024, 1500, 4096, 20_000, 100_000]))
    pattern = b"".join(draw(st.lists(_pieces, min_size=1, max_size=8)))
    raw = (pattern * (draw(st.integers(0, 2 * max_bytes)) // len(pattern) + 1))[: draw(st.integers(0, 2 * max_bytes))]
    key = draw(st.none() | st.integers(0, max_bytes).map(lambda n: b"k" * n))
    topic = draw(st.sampled_from(["points", "t" * 249]))
    rejection = Rejection(draw(st.sampled_from(["invalid_json", "too_large", "not_utf8"])), draw(_errors))
    if draw(st.booleans()):  # a limit just under what the letter and key take unbounded: the edge of every cut
        unbounded = len(dead_letter_value(rejection, raw, topic, 2, 10**12)) + len(key or b"")
        max_bytes = max(1024, unbounded - draw(st.integers(0, 8)))
    return rejection, raw, key, topic, max_bytes


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=_letters())
# found by hypothesis: a base64 head, and a key that fits beside a letter of no raw only if it said "utf-8"
@example(case=(Rejection("invalid_json", '0"\x80\x80\U00010000' * 70), b"\xc3", b"k" * 100, "points", 1024))
def test_every_dead_letter_fits_its_limit_and_keeps_what_it_can(case):
    rejection, raw, key, topic, max_bytes = case
    sent_key, value = dead_letter_record(rejection, raw, key, topic, 2, 10**12, max_bytes)
    assert len(sent_key or b"") + len(value) <= max_bytes
    letter = DeadLetter.model_validate_json(value)
    assert orjson.dumps(orjson.loads(value)) == value  # re-encoding below measures the same bytes
    assert (letter.source.topic, letter.source.partition, letter.source.offset) == (topic, 2, 10**12)
    assert sent_key in (key, None) and letter.key_dropped == (sent_key is None and key is not None)
    kept = letter.raw.encode() if letter.raw_encoding == "utf-8" else base64.b64decode(letter.raw)
    assert raw.startswith(kept) and letter.raw_truncated == (len(kept) < len(raw))
    # the head is cut only as far as needed: one more character (or base64 group) would not fit
    head = raw[:DEAD_LETTER_RAW_LIMIT]
    error = (
        rejection.error
        if len(rejection.error) <= DEAD_LETTER_ERROR_LIMIT
        else rejection.error[: DEAD_LETTER_ERROR_LIMIT - 3] + "..."
    )
    assert letter.error == error or (
        not sent_key and not letter.raw
    )  # the sentence is cut only once no key and no raw are left
    if len(kept) < len(head) and letter.error == error:
        full = head.decode() if letter.raw_encoding == "utf-8" else base64.b64encode(head).decode()
        more = orjson.loads(value)
        more["raw"] = full[: len(letter.raw) + (1 if letter.raw_encoding == "utf-8" else 4)]
        more["raw_truncated"] = len(more["raw"]) < len(full) or len(raw) > len(head)  # what it would then say
        assert len(sent_key or b"") + len(orjson.dumps(more)) > max_bytes
    if letter.key_dropped:  # only when even a letter with no raw left the key no room
        no_raw = (
            len(dead_letter_value(rejection, b"", topic, 2, 10**12))
            - (1 if raw else 0)  # "raw_truncated": true, not false
            + len(letter.raw_encoding)
            - len("utf-8")
        )  # a head that is not UTF-8 says "base64" even when cut to nothing
        assert len(key) + no_raw > max_bytes


# what the service sends --------------------------------------------------------
class CapturingStream:
    def __init__(self):
        self.sent = []

    def send(self, topic, key, value):
        self.sent.append((topic, key, value))

    def flush(self, timeout_s):
        return []


def test_the_service_sends_dead_letters_within_the_limit():
    app = Application(
        load(ServeSettings, ["--metrics-port", "0", "--max-message-bytes", "1000000", "--state-store", "none"])
    )
    stream = CapturingStream()
    loop = app.attach(stream)  # type: ignore[arg-type]  # a stand-in with what a batch uses: send and flush
    hostile = [
        Record("points", 0, 0, b"k" * 930_000, CONTROL * 2048, 0),  # invalid JSON within the limit, escaped 6 times
        Record("points", 0, 1, b"k" * 999_900, b'{"x": [1.0], "y": 5}', 0),  # bad label, a key with no room left
        Record("points", 0, 2, b"k" * 10, b"\xff" * 2_000_000, 0),
    ]  # too large (2 MB), not UTF-8
    loop.handle_batch([hostile])  # one batch, no broker: run() needs one
    assert [(topic, len(key or b"") + len(value) <= 1_000_000) for topic, key, value in stream.sent] == [
        ("points.dlq", True)
    ] * 3
    letters = [DeadLetter.model_validate_json(value) for _, _, value in stream.sent]
    assert [letter.reason for letter in letters] == ["invalid_json", "bad_label", "too_large"]
    assert [key is None for _, key, _ in stream.sent] == [False, True, False]
    assert [letter.raw_truncated for letter in letters] == [True, False, True]

"""The one place each outgoing message is built: predictions, dead letters (and their budgets).

Every builder returns the bytes (or key and bytes) the service sends, so the
shape of a message is written once, beside the pydantic model in
:mod:`perceptron_stream.wire.messages` that documents it (tests check the two agree).

>>> prediction("c-1", "points", 0, 17, 1, 2.5, 1, False, 42, 1000, 12)
b'{"id":"c-1","source":{"topic":"points","partition":0,"offset":17},"y_pred":1,"score":2.5,"y":1,"mistake":false,"model":{"version":42,"seen":1000,"mistakes":12}}'
"""

from __future__ import annotations

import base64
from collections.abc import Callable

import orjson
from perceptron_stream.wire.messages import DEAD_LETTER_RAW_LIMIT, Rejection

_dumps = orjson.dumps


def outcome(
    label_id,
    y: int,
    y_pred: int,
    score: float,
    mistake: bool,
    point_source: dict,
    topic: str,
    partition: int,
    offset: int,
    delay_seconds: float,
    version: int,
    seen: int,
    mistakes: int,
    replica: dict | None = None,
) -> bytes:
    """The outcome of a published decision once its label came (see :class:`~perceptron_stream.wire.messages.Outcome`);
    ``mistake`` decided by the join (:func:`~perceptron_stream.learning.labels.is_mistake` of ``y`` and ``score``).

    >>> outcome("c-1", 1, -1, -0.31, True, {"topic": "points", "partition": 0, "offset": 17}, "labels", 0, 5, 12.5, 42, 1000, 12)[:60]
    b'{"id":"c-1","y":1,"y_pred":-1,"score":-0.31,"mistake":true,"'
    """
    model = {"version": version, "seen": seen, "mistakes": mistakes}
    if replica is not None:
        model = {**replica, **model}
    return _dumps(
        {
            "id": label_id,
            "y": y,
            "y_pred": y_pred,
            "score": score,
            "mistake": mistake,
            "source": point_source,
            "label_source": {"topic": topic, "partition": partition, "offset": offset},
            "delay_seconds": delay_seconds,
            "model": model,
        }
    )


def prediction(
    event_id,
    topic: str,
    partition: int,
    offset: int,
    y_pred: int,
    score: float,
    y: int | None,
    mistake: bool | None,
    version: int,
    seen: int,
    mistakes: int,
    replica: dict | None = None,
) -> bytes:
    """A prediction (see :class:`~perceptron_stream.wire.messages.Prediction`); ``replica`` adds partition scope's model fields."""
    model = {"version": version, "seen": seen, "mistakes": mistakes}
    if replica is not None:
        model = {**replica, **model}
    return _dumps(
        {
            "id": event_id,
            "source": {"topic": topic, "partition": partition, "offset": offset},
            "y_pred": y_pred,
            "score": score,
            "y": y,
            "mistake": mistake,
            "model": model,
        }
    )


def explained(value: bytes, reasons: list, bias: float) -> bytes:
    """A prediction's bytes with its reason codes (``--explain K``, see :class:`~perceptron_stream.wire.messages.Reason`)
    after its other fields: ``reasons`` as (feature, value, weight, contribution), largest first.

    >>> explained(b'{"id":"c-1","score":-2.5}', [("debt", 1.5, -2.0, -3.0)], 0.5)
    b'{"id":"c-1","score":-2.5,"reasons":[{"feature":"debt","value":1.5,"weight":-2.0,"contribution":-3.0}],"bias":0.5}'
    """
    parts = {
        "reasons": [{"feature": f, "value": v, "weight": w, "contribution": c} for f, v, w, c in reasons],
        "bias": bias,
    }
    return value[:-1] + b"," + _dumps(parts)[1:]


#: One reason code of a message, as :func:`explained` writes it.
_REASON = b'{"feature":%s,"value":%s,"weight":%s,"contribution":%s}'


def _reasons_texts(reasons) -> list[bytes]:
    """Each message's tail from its model object's end: its ``reasons`` (a
    :class:`~perceptron_stream.learning.reasons.Reasons`, K parts an event) and bias, as :func:`explained` writes
    them. Each column is written by one dumps and cut (as :func:`predictions` does), and each event's tail by one
    bytes format of its 4K + 1 texts: a join of them all measured 1.2 µs an event at K = 3, the format 0.55."""
    k = reasons.per_event
    columns = (_texts(reasons.features), _cut(reasons.values), _cut(reasons.weights), _cut(reasons.contributions))
    template = b'},"reasons":[' + b",".join([_REASON] * k) + b'],"bias":%s}\n'
    texts = [column[j::k] for j in range(k) for column in columns]
    return list(map(template.__mod__, zip(*texts, _cut(reasons.bias))))


def predictions(
    ids: list,
    topic: str,
    partition: int,
    offsets,
    y_pred,
    score,
    ys: list,
    mistake: list,
    version,
    seen,
    mistakes,
    replica: dict | None = None,
    reasons=None,
) -> list[bytes]:
    """Many predictions at once: ``[prediction(...) for each event]``, the same bytes, built in one pass; with
    ``reasons`` (a :class:`~perceptron_stream.learning.reasons.Reasons`), each ``explained`` by its own.

    Each column (``offsets``, ``y_pred``, ``score``, ``version``, ``seen``, ``mistakes``: lists or NumPy arrays;
    ``ids``, ``ys``, ``mistake``: lists) is written by one ``orjson.dumps`` and cut at its commas (no number, true,
    false or null holds one; ids with strings are written one per line, and cut at the line ends: a JSON string
    holds no newline unescaped, where it may hold a comma, quotes and brackets in any order); the messages are the columns interleaved with the constant parts, joined once and cut at their newlines (a JSON
    message holds none). orjson writes a float64 of an array as it writes a Python float (tests/wire check both
    builders agree on every value, NaN and infinities (null) and -0.0 included).

    >>> predictions(["c-1", "c-2"], "points", 0, [17, 18], [1, -1], [2.5, -0.5], [1, None], [False, None],
    ...             [42, 42], [1000, 1001], [12, 12])[1]
    b'{"id":"c-2","source":{"topic":"points","partition":0,"offset":18},"y_pred":-1,"score":-0.5,"y":null,"mistake":null,"model":{"version":42,"seen":1001,"mistakes":12}}'
    """
    n = len(ids)
    if n == 0:
        return []
    id_texts = _texts(ids)
    model = b'"version":' if replica is None else _dumps(replica)[1:-1] + b',"version":'
    parts: tuple = (
        b'{"id":',
        id_texts,
        b',"source":{"topic":' + _dumps(topic) + b',"partition":' + _dumps(partition) + b',"offset":',
        _cut(offsets),
        b'},"y_pred":',
        _cut(y_pred),
        b',"score":',
        _cut(score),
        b',"y":',
        _cut(ys),
        b',"mistake":',
        _cut(mistake),
        b',"model":{' + model,
        _cut(version),
        b',"seen":',
        _cut(seen),
        b',"mistakes":',
        _cut(mistakes),
        b"}}\n",
    )
    if reasons is not None:
        if reasons.counts is not None or not reasons.per_event:  # events of fewer parts than K: one at a time
            plain = predictions(
                ids, topic, partition, offsets, y_pred, score, ys, mistake, version, seen, mistakes, replica
            )
            return [explained(value, *reasons[i]) for i, value in enumerate(plain)]
        parts = (*parts[:-1], _reasons_texts(reasons))
    width = len(parts)
    flat: list = [None] * (width * n)
    for i, part in enumerate(parts):
        flat[i::width] = [part] * n if type(part) is bytes else part
    out = b"".join(flat).split(b"\n")
    out.pop()  # after the last newline
    return out


class InRecordOrder:
    """A batch's messages sent in the order of its records: each prediction after the dead letters of the records
    before it, the letters after its last event at the end (:meth:`finish`). The task's batch and one-at-a-time
    forms alike send through it, so the order of what goes out is written once; ``reasons`` (the tally's) gets
    each letter's reason as it goes."""

    __slots__ = ("dlq_topic", "limit", "reasons", "records", "send", "topic", "waiting")

    def __init__(self, records, rejected: list, send, outputs: dict, reasons: list):
        self.records, self.waiting, self.send, self.reasons = records, rejected[::-1], send, reasons
        self.topic, self.dlq_topic = outputs["output_topic"], outputs["dlq_topic"]
        self.limit = outputs["max_message_bytes"]

    def letters_before(self, index: int) -> None:
        """Send the dead letters of the records before record ``index`` (those not sent yet)."""
        waiting = self.waiting
        while waiting and waiting[-1][0] < index:
            i, rejection = waiting.pop()
            r = self.records[i]
            key, value = dead_letter_record(rejection, r.value, r.key, r.topic, r.partition, r.offset, self.limit)
            self.send(self.dlq_topic, key, value)
            self.reasons.append(rejection.reason)

    def predictions(self, at, values: list) -> None:
        """Send ``values``, the predictions of records ``at`` (their indexes, in order: a list or a range), each
        keyed as its record and after the dead letters before it."""
        records, send, topic = self.records, self.send, self.topic
        if self.waiting:
            for i, value in zip(at, values):
                self.letters_before(i)
                send(topic, records[i].key, value)
        elif type(at) is range:  # (the common batch: every record an event)
            for r, value in zip(records[at.start : at.stop], values):
                send(topic, r.key, value)
        else:
            for i, value in zip(at, values):
                send(topic, records[i].key, value)

    def prediction(self, index: int, key: bytes | None, value: bytes) -> None:
        """Send ``value``, the prediction of record ``index`` (its ``key``), after the dead letters before it."""
        if self.waiting:
            self.letters_before(index)
        self.send(self.topic, key, value)

    def finish(self) -> None:
        """The batch sent: the letters of the records after its last event."""
        self.letters_before(len(self.records))


def _cut(column) -> list[bytes]:
    """The JSON text of each value of ``column`` (numbers, booleans, null), by one dumps."""
    return _dumps(column, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1].split(b",")


def _texts(column) -> list[bytes]:
    """:func:`_cut`, for a column that may hold strings too (ids, feature names): those written one per line, and cut
    at the line ends (a JSON string holds no newline unescaped, where it may hold a comma, a quote or a bracket).

    >>> _texts([7, None]), _texts(["a,b", 3])
    ([b'7', b'null'], [b'"a,b"', b'3'])
    """
    if type(column) is not list or str not in set(map(type, column)):
        return _cut(column)
    return _dumps(column, option=orjson.OPT_INDENT_2)[4:-2].split(b",\n  ")


#: The longest error sentence a dead letter carries: the decoder may quote a
#: hostile feature name. With its raw head (cut to fit) and key, a dead letter
#: stays within --max-message-bytes (dead_letter_value).
DEAD_LETTER_ERROR_LIMIT = 1000


def dead_letter_value(
    rejection: Rejection,
    raw: bytes | None,
    topic: str,
    partition: int,
    offset: int,
    *,
    max_bytes: int | None = None,
    key_bytes: int = 0,
    key_dropped: bool = False,
) -> bytes:
    """The dead-letter message the service publishes for a rejected input (JSON bytes).

    With ``max_bytes``, the letter and the ``key_bytes`` of its record's key
    fit in it, as an input must (Decoder.decode): JSON escaping makes a raw
    head of control characters six times longer, and the key adds its own
    length. The raw head is cut first (``raw_truncated``); when even no raw
    leaves room, a keyed letter is returned with no raw, too long (its caller,
    :func:`dead_letter_record`, drops the key), and a letter without key has
    its error sentence cut. From 1 KiB (the setting's least) every letter fits.
    """
    letter = dead_letter(rejection, raw, topic, partition, offset)
    if len(letter["error"]) > DEAD_LETTER_ERROR_LIMIT:
        letter["error"] = letter["error"][: DEAD_LETTER_ERROR_LIMIT - 3] + "..."
    if key_dropped:
        letter["key_dropped"] = True
    value = orjson.dumps(letter)
    if max_bytes is None or key_bytes + len(value) <= max_bytes:
        return value
    room = max_bytes - key_bytes
    head, whole = letter["raw"], not letter["raw_truncated"]
    letter["raw"] = ""
    letter["raw_truncated"] = bool(head)
    value = orjson.dumps(letter)
    if len(value) <= room:
        kept = _longest_head(head, letter["raw_encoding"], room - len(value))
        if whole and len(kept) == len(head):  # it fits only as "raw_truncated": true, one byte shorter than false
            kept = head[: len(head) - (4 if letter["raw_encoding"] == "base64" else 1)]
        letter["raw"] = kept
        return orjson.dumps(letter)
    if key_bytes:
        return value
    error = letter["error"]
    cut = _longest(len(error), lambda n: len(orjson.dumps({**letter, "error": error[:n] + "..."})) <= room)
    letter["error"] = error[:cut] + "..." if cut is not None else ""
    return orjson.dumps(letter)


def dead_letter_record(
    rejection: Rejection, raw: bytes | None, key: bytes | None, topic: str, partition: int, offset: int, max_bytes: int
) -> tuple[bytes | None, bytes]:
    """Key and value of the dead letter for a rejected input: together at most ``max_bytes``.

    The input's key is kept unless even a letter with no raw leaves it no room
    (a key near the limit): then it is left off and the letter says so
    (``key_dropped``), keeping the raw head that fits without it.
    """
    value = dead_letter_value(rejection, raw, topic, partition, offset, max_bytes=max_bytes, key_bytes=len(key or b""))
    if key is None or len(key) + len(value) <= max_bytes:
        return key, value
    return None, dead_letter_value(rejection, raw, topic, partition, offset, max_bytes=max_bytes, key_dropped=True)


def refit_dead_letter(key: bytes | None, value: bytes, max_bytes: int) -> tuple[bytes | None, bytes]:
    """A dead letter (key and value, as :func:`dead_letter_record` built it) cut again to fit ``max_bytes``: a
    dead-letter topic whose ``max.message.bytes`` is below ``--max-message-bytes``. What finds the original (its
    source, reason) is kept whole; the raw head is cut first, then the key, then the error sentence.

    >>> letter = dead_letter_value(Rejection("invalid_json", "bad"), b"x" * 3000, "points", 0, 7)
    >>> key, value = refit_dead_letter(b"k", letter, 1024)
    >>> len(value) + len(key) <= 1024, orjson.loads(value)["source"], orjson.loads(value)["raw_truncated"]
    (True, {'topic': 'points', 'partition': 0, 'offset': 7}, True)
    """
    letter = orjson.loads(value)
    source = letter["source"]
    head = letter.get("raw") or ""
    raw = base64.b64decode(head) if letter.get("raw_encoding") == "base64" else head.encode()
    rejection = Rejection(letter["reason"], letter["error"])
    key, cut = dead_letter_record(
        rejection, raw, key, source["topic"], source["partition"], source["offset"], max_bytes
    )
    if letter.get("raw_truncated") or letter.get("key_dropped"):
        refit = orjson.loads(cut)
        refit["raw_truncated"] = refit["raw_truncated"] or bool(letter.get("raw_truncated"))
        if letter.get("key_dropped"):
            refit["key_dropped"] = True
        cut = orjson.dumps(refit)
    return key, cut


def _longest_head(head: str, encoding: str, room: int) -> str:
    """The longest head of a letter's raw text whose JSON string takes at most ``room`` bytes more than ``""``."""
    if (
        encoding == "base64"
    ):  # 4 characters for every 3 bytes, none escaped: whole groups decode to a head of the original
        return head[: min(len(head), room // 4 * 4)]
    n = _longest(len(head), lambda n: len(orjson.dumps(head[:n])) - 2 <= room)
    return head[:n]


def _longest(most: int, fits: Callable[[int], bool]) -> int | None:
    """The largest n in 0..most with fits(n), for fits true up to some n and false after (None: not even 0)."""
    if not fits(0):
        return None
    low, high = 0, most
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def dead_letter(rejection: Rejection, raw: bytes | None, topic: str, partition: int, offset: int) -> dict:
    """The dead-letter message for a rejected input, as a JSON-able dict."""
    raw = raw or b""
    head = raw[:DEAD_LETTER_RAW_LIMIT]
    try:
        text, encoding = head.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        text, encoding = base64.b64encode(head).decode("ascii"), "base64"
    return {
        "error": rejection.error,
        "reason": rejection.reason,
        "source": {"topic": topic, "partition": partition, "offset": offset},
        "raw": text,
        "raw_encoding": encoding,
        "raw_truncated": len(raw) > DEAD_LETTER_RAW_LIMIT,
    }

"""Bytes in, validated events out: the decoder of the input topic.

Decoding has two paths with one outcome. The common event (an object with
only ``id``, ``x`` or ``features``, and ``y``, every value of the expected
type, within the limits and of the fixed dimension) is parsed and checked by
msgspec in one C pass; anything else (invalid JSON, extra keys, a string where
a number belongs, a label to map or reject, a value out of range...) goes
through the pydantic model and the decoder's own rules, whose first error
becomes one plain sentence and a short reason code, also the ``reason`` label
of ``perceptron_rejected_events_total``. The fast path only accepts what the
model accepts, with the same values (msgspec and pydantic's parser read every
number to the same double, and both refuse non-finite ones), so an event
decodes to the same :class:`Event` either way (tests/wire/test_schema.py checks it).

Decoding costs a parse or two of the message and its first error, whatever
the message holds: the model stops at the first bad element of ``x`` or
``features`` (:class:`~perceptron_stream.wire.messages.FirstErrorOnly`), and a message of ``MODEL_FIRST_BYTES``
or more goes to the model alone, whose parser builds no Python object per
element (the fast path's does, for a hostile message, before the model parses
it again). bench/decoder.py measures the worst shapes (bench/README.md).

>>> decoder = Decoder(max_message_bytes=1000, max_features=10)
>>> decoder.decode(b'{"id": "c-1", "x": [0.5, -1.0], "y": 1}')
Event(id='c-1', x=[0.5, -1.0], y=1)
>>> decoder.decode(b'{"x": [0.5, -1.0, 2.0], "y": 1}')
Rejection(reason='wrong_dimension', error='x has 3 values but this model takes 2 (the first dense event fixed the dimension)')
>>> decoder.decode(b'{"features": {"age": 31}, "y": 2}')
Rejection(reason='bad_label', error='y must be -1 or +1 (0/1 and false/true are accepted too), got 2')
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from itertools import repeat
from math import hypot
from operator import attrgetter
from typing import Annotated, Any, NamedTuple

import msgspec
from perceptron_stream.learning.labels import LABELS, json_label
from perceptron_stream.wire.messages import Event, InputEvent, Label, LabelEvent, Rejection, _show
from pydantic import ValidationError


@functools.lru_cache(maxsize=64)
def _fast_decoder(max_features: int, max_feature_value: float, dimension: int | None) -> Callable[[bytes], Any]:
    """msgspec's decoder of the common event, as the fast path takes it, with this decoder's limits in its type.

    These keys only, each of the expected type, and the rules beyond the
    model checked in the same C pass: at least one feature and at most
    ``max_features``, every |value| at most ``max_feature_value`` (a finite
    1e308 would overflow the score), and a dense ``x`` of the fixed
    ``dimension`` once there is one. msgspec's float takes JSON integers (as
    the model does) and refuses booleans and strings. Whatever it refuses
    goes to the model, whose checks explain the first problem; non-finite
    values cannot come through (JSON has none, and a number too large for a
    double is refused: the model says why). Cached: the tasks of one service
    share their limits, and a dimension changes once.
    """
    value = Annotated[float, msgspec.Meta(ge=-max_feature_value, le=max_feature_value)]
    # ids a prediction can carry (orjson writes 64 bits); msgspec bounds fit an int64, so ids of 2**63 and above
    # take the model's way (whose last check, _checked's, sorts them), as do those beyond 64 bits
    number = Annotated[int, msgspec.Meta(ge=-(1 << 63), le=(1 << 63) - 1)]
    most = min(max_features, sys.maxsize)  # msgspec's lengths are C sizes; no list is longer anyway
    dense: Any  # a type for msgspec, or None: no dense event decodes
    if dimension is None:
        dense = Annotated[list[value], msgspec.Meta(min_length=1, max_length=most)] | None
    elif 1 <= dimension <= max_features:
        dense = Annotated[list[value], msgspec.Meta(min_length=dimension, max_length=dimension)] | None
    else:  # a checkpoint's dimension beyond today's --max-features (or none a dense event can have): the model says why
        dense = None
    event = msgspec.defstruct(
        "FastEvent",
        [
            ("id", str | number | None, None),
            ("x", dense, None),
            ("features", Annotated[dict[str, value], msgspec.Meta(min_length=1, max_length=most)] | None, None),
            ("y", bool | int | None, None),
        ],
        forbid_unknown_fields=True,
    )
    return msgspec.json.Decoder(event).decode


_new = tuple.__new__
_ID, _X, _FEATURES, _Y = (attrgetter(name) for name in ("id", "x", "features", "y"))


class Decoded(NamedTuple):
    """A batch decoded: the valid events as columns, in record order, and the rejections.

    ``at``: each event's record index (None: every record is an event, in order); ``rejected``: (record index,
    why) of the others.
    """

    ids: list
    xs: list
    ys: list
    at: list[int] | None
    rejected: list[tuple[int, Rejection]]


#: An integer id is written back in the prediction: beyond 64 bits orjson
#: (and most consumers) cannot write it, and the event would stop the service.
ID_MIN, ID_MAX = -(1 << 63), (1 << 64) - 1

#: Messages at least this long skip the fast path. Its gain is a fixed
#: cost per event (about 1-2 µs, the model's instance and validators); from a
#: few KiB the model decodes a valid event about as fast per byte (dense x the
#: same, features up to 20% slower, integers twice as fast), and a hostile one
#: 2-4 times faster: no Python object per element before the model parses the
#: message again (bench/decoder.py, bench/README.md "Decoder worst case").
MODEL_FIRST_BYTES = 4096


class Decoder:
    """Turns message values into events or rejections.

    It holds one piece of state, the dimension ``d`` fixed by the first dense
    event, which checkpoints carry so a restart keeps it.

    ``max_feature_value`` bounds every |value|: a finite 1e308 passes JSON,
    but overflows the score to infinity (published as null) and leaves the
    weights there for good.
    """

    def __init__(
        self,
        max_message_bytes: int,
        max_features: int,
        dimension: int | None = None,
        max_feature_value: float = 1e15,
        model_first_bytes: int = MODEL_FIRST_BYTES,
    ):
        self.max_message_bytes = max_message_bytes
        self._max_features, self._max_feature_value = max_features, max_feature_value  # in the fast path's type
        self.model_first_bytes = model_first_bytes
        self.dimension = dimension

    @property
    def max_features(self) -> int:
        return self._max_features

    @property
    def max_feature_value(self) -> float:
        return self._max_feature_value

    @property
    def dimension(self) -> int | None:
        """The dimension of dense events, fixed by the first one (None: none yet)."""
        return self._dimension

    @dimension.setter
    def dimension(self, dimension: int | None) -> None:
        self._dimension = dimension
        self._fast_decode = _fast_decoder(self.max_features, self.max_feature_value, dimension)

    def decode(self, raw: bytes | None, key: bytes | None = None) -> Event | Rejection:
        """The event in ``raw``, or why it is rejected; the Kafka ``key`` counts toward the size limit
        (it is passed through to the outputs, which must fit the brokers' limit too)."""
        if raw is None:
            return Rejection("invalid_event", "the message has no value (a tombstone); send a JSON object")
        size = len(raw) if key is None else len(raw) + len(key)
        if size > self.max_message_bytes:
            what = "" if key is None else f" (key {len(key)} + value {len(raw)})"
            return Rejection(
                "too_large", f"the message is {size} bytes{what}, more than the limit of {self.max_message_bytes}"
            )
        if len(raw) >= self.model_first_bytes:
            return self._decode_model(raw)
        # The fast path: msgspec parses, type-checks and bounds the common event in one C pass; whatever it
        # does not take, or might judge unlike the model, goes to the model (and _checked explains a bound).
        try:
            doc = self._fast_decode(raw)
        except (msgspec.DecodeError, UnicodeDecodeError):  # msgspec raises the latter for invalid UTF-8 in a key
            return self._decode_model(raw)
        y = doc.y
        if y is not None:
            y = json_label(y)
            if y is None:
                return self._decode_model(raw)
        x, features = doc.x, doc.features
        if features is None and x is not None:
            if self._dimension is None:
                self.dimension = len(x)
            return _new(Event, (doc.id, x, y))
        if x is None and features is not None:
            return _new(Event, (doc.id, features, y))
        return self._decode_model(raw)

    def decode_many(self, values: list, keys: list, each: bool = False) -> Decoded:
        """:meth:`decode` of every value (``keys`` their records' keys), in a few C calls when the batch is all
        common events of one form: the fast path's msgspec type over every value, the checks of :meth:`decode` on
        whole columns. A batch with anything else (a message too large or long, a tombstone, one the fast path
        does not take, dense and named events mixed, dense ones of several lengths before the dimension is fixed)
        is decoded one message at a time, so each rejection is the one :meth:`decode` gives; so is every batch
        ``each`` (the reference the C calls equal).

        >>> d = Decoder(max_message_bytes=1000, max_features=10)
        >>> d.decode_many([b'{"x": [1.0, 2.0], "y": 0}', b'{"id": 7, "x": [3.0, 4.0]}'], [None, b"k"])
        Decoded(ids=[None, 7], xs=[[1.0, 2.0], [3.0, 4.0]], ys=[-1, None], at=None, rejected=[])
        >>> d.decode_many([b'{"x": [1.0, 2.0]}', b'{"x": [1.0]}'], [None, None]).rejected[0][1].reason
        'wrong_dimension'
        """
        n = len(values)
        try:
            longest = max(map(len, values), default=0)
        except TypeError:  # a tombstone
            longest = None
        if not each and longest is not None and longest < self.model_first_bytes:
            key_longest = max(map(len, filter(None, keys)), default=0)
            if longest + key_longest <= self.max_message_bytes:
                try:
                    docs = list(map(self._fast_decode, values))
                except (msgspec.DecodeError, UnicodeDecodeError):
                    docs = None
                if docs is not None:
                    decoded = self._columns(docs, n)
                    if decoded is not None:
                        return decoded
        ids: list = []
        xs: list = []
        ys: list = []
        at: list[int] = []
        rejected: list[tuple[int, Rejection]] = []
        for i, (raw, key) in enumerate(zip(values, keys)):
            event = self.decode(raw, key)
            if isinstance(event, Rejection):
                rejected.append((i, event))
            else:
                ids.append(event.id)
                xs.append(event.x)
                ys.append(event.y)
                at.append(i)
        return Decoded(ids, xs, ys, None if len(at) == n else at, rejected)

    def _columns(self, docs: list, n: int) -> Decoded | None:
        """The fast path's structs as columns, with :meth:`decode`'s checks on each column (None: one fails)."""
        ys = list(map(_Y, docs))
        unlabeled = ys.count(None)
        if unlabeled < n:
            ys = list(map(LABELS.get, ys))  # json_label: the type (int or bool) is the struct's already
            if ys.count(None) != unlabeled:  # a label to reject (the model says why)
                return None
        xs = list(map(_X, docs))
        dense = xs.count(None)
        if dense == 0:
            if list(map(_FEATURES, docs)).count(None) != n:
                return None
            if self._dimension is None:  # the first fixes it, and every other must have its length
                lengths = set(map(len, xs))
                if len(lengths) != 1:
                    return None
                self.dimension = lengths.pop()
        elif dense == n:
            xs = list(map(_FEATURES, docs))
            if xs.count(None):
                return None
        else:
            return None
        return Decoded(list(map(_ID, docs)), xs, ys, None, [])

    def _decode_model(self, raw: bytes) -> Event | Rejection:
        """The model's way: every rule of :class:`InputEvent`, and a sentence for the first one broken."""
        try:
            event = InputEvent.model_validate_json(raw)
        except ValidationError as exc:
            return _explain(exc, raw)
        if event.x is not None:
            return self._checked(event.id, event.x, True, event.y)
        assert event.features is not None  # an InputEvent holds x or features
        return self._checked(event.id, event.features, False, event.y)

    def _checked(
        self, id_: str | int | None, x: list[float] | dict[str, float], dense: bool, y: int | None
    ) -> Event | Rejection:
        """The rules beyond the model: at least one feature, at most max_features, the fixed dimension, an id a
        prediction can carry (the fast path's type bounds it already)."""
        n = len(x)
        if not n:
            return Rejection("invalid_event", f"{'x' if dense else 'features'} is empty; send at least one feature")
        if n > self.max_features:
            return Rejection(
                "too_many_features", f"the event has {n} features, more than the limit of {self.max_features}"
            )
        values, limit = (x if isinstance(x, list) else x.values()), self.max_feature_value
        # every |x_i| <= ||x||: the norm (in C doubles, no overflow) settles the common case
        # at a quarter of the cost of max/min, whose comparisons are generic object ones
        if hypot(*values) > limit and (largest := max(map(abs, values))) > limit:
            return Rejection(
                "out_of_range",
                f"{'x' if dense else 'features'} has a value of magnitude {largest:.3g}, more than "
                f"the limit of {limit:.3g}; rescale the feature",
            )
        if dense:
            if self._dimension is None:
                self.dimension = n
            elif n != self._dimension:
                return Rejection(
                    "wrong_dimension",
                    f"x has {n} values but this model takes {self.dimension} (the first dense event fixed the dimension)",
                )
        if type(id_) is int and not ID_MIN <= id_ <= ID_MAX:
            # last, after the dimension is fixed: the one check of an event whose prediction could not be written,
            # judged after every other (as when it was made on the decoded event), so such an event fixes the
            # dimension as it always did
            return Rejection(
                "invalid_event",
                f"id must be a string or an integer of at most 64 bits, got an integer of {id_.bit_length()} bits",
            )
        return _new(Event, (id_, x, y))


#: The common label, ``{"id": str | int, "y": bool | int}`` and nothing else, in msgspec's C decoder: the fast path
#: of :func:`decode_label` and :func:`decode_labels` alike (its ``y`` then a key of :data:`LABELS`, else pydantic).
_FAST_LABEL = msgspec.json.Decoder(
    msgspec.defstruct("FastLabel", [("id", str | int), ("y", bool | int)], forbid_unknown_fields=True)
).decode


def decode_label(raw: bytes | None, key: bytes | None, max_message_bytes: int) -> Label | Rejection:
    """A delayed label ``{"id": ..., "y": ...}`` (:class:`~perceptron_stream.wire.messages.LabelEvent`), or why it is rejected.

    >>> decode_label(b'{"id": "c-1", "y": true}', None, 1000)
    Label(id='c-1', y=1)
    >>> decode_label(b'{"id": "c-1"}', None, 1000).reason
    'bad_label'
    """
    if raw is None:
        return Rejection("invalid_event", "the label has no value (a tombstone); send a JSON object")
    size = len(raw) + len(key or b"")
    if size > max_message_bytes:
        return Rejection("too_large", f"the label is {size} bytes, more than the limit of {max_message_bytes}")
    try:  # the fast path, as decode_labels' columns: {"id": str | int, "y": ±1, 0/1, true/false}
        doc = _FAST_LABEL(raw)
    except (msgspec.DecodeError, UnicodeDecodeError):
        doc = None
    if doc is not None and (y := LABELS.get(_Y(doc))) is not None:
        return _new(Label, (_ID(doc), y))
    try:  # anything else: pydantic's model says what is wrong
        label = LabelEvent.model_validate_json(raw)
    except ValidationError as exc:
        return _explain(exc, raw)
    return Label(label.id, label.y)


def decode_labels(values: list, keys: list, max_message_bytes: int) -> list[Label | Rejection]:
    """:func:`decode_label` of every value (``keys`` their records' keys), in a few C calls when every one is the
    common label (``{"id", "y"}``, a label spelling of the table): msgspec's struct over each, the sizes and the
    labels checked on whole columns; else one at a time, so each rejection is the one :func:`decode_label` gives.

    >>> decode_labels([b'{"id": "c-1", "y": 0}', b'{"id": 7, "y": true}'], [None, b"k"], 1000)
    [Label(id='c-1', y=-1), Label(id=7, y=1)]
    """
    try:
        longest = max(map(len, values), default=0) + max(map(len, filter(None, keys)), default=0)
        docs = list(map(_FAST_LABEL, values)) if longest <= max_message_bytes else None
    except (TypeError, msgspec.DecodeError, UnicodeDecodeError):  # a tombstone, or one the fast path does not take
        docs = None
    if docs is not None:
        ys = list(map(LABELS.get, map(_Y, docs)))
        if None not in ys:
            return list(map(_new, repeat(Label), zip(map(_ID, docs), ys)))
    return [decode_label(raw, key, max_message_bytes) for raw, key in zip(values, keys)]


def _explain(exc: ValidationError, raw: bytes) -> Rejection:
    """One sentence for the first problem pydantic found (never echoing a huge input)."""
    error = exc.errors(include_url=False)[0]
    kind, loc = error["type"], ".".join(str(p) for p in error["loc"])
    if kind == "json_invalid":
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as bad:
            return Rejection(
                "not_utf8", f"the message is not UTF-8 text (bad byte at position {bad.start}); send UTF-8 JSON"
            )
        return Rejection("invalid_json", f"the message is not valid JSON: {error['ctx']['error']}")
    if kind == "model_type":
        return Rejection("invalid_event", f"the event must be a JSON object, got {_json_type(error['input'])}")
    if kind == "missing":
        return Rejection("bad_label" if loc == "y" else "invalid_event", f"{_path(error['loc'])} is required")
    if loc.startswith("id"):
        return Rejection("invalid_event", f"id must be a string or a number, got {_json_type(error['input'])}")
    if loc.startswith("y") or "y must be" in error["msg"]:
        return Rejection("bad_label", error["msg"].removeprefix("Value error, "))
    if kind == "finite_number":
        return Rejection("non_finite", f"{_path(error['loc'])} must be a finite number, got {_show(error['input'])}")
    if kind == "value_error":
        return Rejection("invalid_event", error["msg"].removeprefix("Value error, "))
    if kind in ("float_type", "list_type", "dict_type"):
        wanted = {
            "float_type": "a number",
            "list_type": "a list of numbers",
            "dict_type": "an object of name → number",
        }[kind]
        return Rejection(
            "invalid_event",
            f"{_path(error['loc'])} must be {wanted}, got {_json_type(error['input'])} {_show(error['input'])}",
        )
    return Rejection("invalid_event", f"{_path(error['loc'])}: {error['msg']}")


def _path(loc: tuple) -> str:
    """('x', 3) → 'x[3]'; ('features', 'age') → 'features.age'."""
    out = str(loc[0]) if loc else "the event"
    for part in loc[1:]:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
    }.get(type(value), type(value).__name__)

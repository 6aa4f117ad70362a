"""The wire format: bytes in, validated events, predictions and dead letters out.

Three pydantic models are the contract with producers and consumers
(``schemas/*.json`` is generated from them, see ``python -m service.schema``):

- :class:`InputEvent`, one labeled or unlabeled point;
- :class:`Prediction`, published for every valid input;
- :class:`DeadLetter`, published for every rejected input, with a reason a
  producer can act on.

Decoding has two paths with one outcome. The common event (an object with
only ``id``, ``x`` or ``features``, and ``y``, every value of the expected
type) is parsed by orjson and checked by a few type tests; anything else
(invalid JSON, extra keys, a string where a number belongs, a label to map
or reject...) goes through the pydantic model, whose first error becomes one
plain sentence and a short reason code, also the ``reason`` label of
``perceptron_rejected_events_total``. The fast path only accepts what the
model accepts, with the same values (orjson and pydantic's parser read every
number to the same double, and both refuse non-finite ones), so an event
decodes to the same :class:`Event` either way (tests/test_schema.py checks it).

Decoding costs a parse or two of the message and its first error, whatever
the message holds: the model stops at the first bad element of ``x`` or
``features`` (:class:`FirstErrorOnly`), and a message of ``MODEL_FIRST_BYTES``
or more goes to the model alone, whose parser builds no Python object per
element (orjson's did, for a hostile message, before the model parsed it
again). bench/decoder.py measures the worst shapes (bench/README.md).

>>> decoder = Decoder(max_message_bytes=1000, max_features=10)
>>> decoder.decode(b'{"id": "c-1", "x": [0.5, -1.0], "y": 1}')
Event(id='c-1', x=[0.5, -1.0], y=1)
>>> decoder.decode(b'{"x": [0.5, -1.0, 2.0], "y": 1}')
Rejection(reason='wrong_dimension', error='x has 3 values but this model takes 2 (the first dense event fixed the dimension)')
>>> decoder.decode(b'{"features": {"age": 31}, "y": 2}')
Rejection(reason='bad_label', error='y must be -1 or +1 (0/1 and false/true are accepted too), got 2')
"""

from __future__ import annotations

import base64
import json
import math
from math import hypot
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

FiniteNumber = Annotated[float, Field(strict=True, allow_inf_nan=False)]


class FirstErrorOnly:
    """Validation of the list or dict it annotates stops at its first bad element.

    pydantic-core's ``fail_fast`` (pydantic exposes it for lists only, as
    ``FailFast``; pydantic-core has it for dicts too since 2.28, pydantic
    2.11). Without it the model reports every bad element: a 100 KB
    ``{"x": [[], [], ...]}`` made 33,000 errors, about 0.5 ms per KB, when
    the decoder only ever tells the first.
    """

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        schema = handler(source)
        if schema.get("type") not in ("list", "dict"):
            raise TypeError(f"FirstErrorOnly annotates a list or a dict, not {schema.get('type')}")
        schema["fail_fast"] = True
        return schema


class OneError:
    """A union that fails reports one error, not one per member (pydantic-core's ``custom_error_type``).

    Each error carries the input, which pydantic turns into Python objects: an
    ``id`` holding 1 MB of ``[[], [], ...]`` cost 180 ms as two errors (str, int).
    """

    def __init__(self, error_type: str, message: str):
        self.error_type, self.message = error_type, message

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        schema = handler(source)
        if schema.get("type") != "union":
            raise TypeError(f"OneError annotates a union, not {schema.get('type')}")
        schema["custom_error_type"], schema["custom_error_message"] = self.error_type, self.message
        return schema


#: Raw bytes kept in a dead letter. A rejected message may be as large as the
#: input limit; the dead letter keeps its head and its source position, which
#: points at the whole original in the input topic.
DEAD_LETTER_RAW_LIMIT = 64 * 1024

#: Every reason code a rejection can carry (the metric's label values).
REASONS = ("invalid_json", "not_utf8", "invalid_event", "bad_label", "non_finite", "out_of_range", "wrong_dimension", "too_large",
           "too_many_features", "output_refused")


def to_label(value: Any) -> int | None:
    """Map an accepted label spelling to −1/+1; None stays None (unlabeled).

    >>> [to_label(v) for v in (1, -1, 0, True, False, None)]
    [1, -1, -1, 1, -1, None]
    """
    if value is None:
        return None
    if value is True or value is False:
        return 1 if value else -1
    if type(value) is int and value in (-1, 0, 1):
        return value or -1
    raise ValueError(f"y must be -1 or +1 (0/1 and false/true are accepted too), got {_show(value)}")


class InputEvent(BaseModel):
    """One point on the input topic. Unknown keys are ignored, so producers may add their own."""

    model_config = ConfigDict(extra="ignore", title="InputEvent")

    id: Annotated[str | int, OneError("id_type", "id must be a string or an integer")] | None = Field(
        None, description="The producer's id of the point, copied to the prediction.")
    x: Annotated[list[FiniteNumber], FirstErrorOnly()] | None = Field(
        None, description="Dense features; the first dense event fixes their number.")
    features: Annotated[dict[str, FiniteNumber], FirstErrorOnly()] | None = Field(None, description="Named features, name → number.")
    y: Literal[-1, 1] | None = Field(
        None,
        description="Label −1 or +1; 0/1 and false/true are accepted and mapped (0 and false → −1). "
        "Absent or null: predict only.",
    )

    @field_validator("y", mode="before")
    @classmethod
    def _map_label(cls, value: Any) -> int | None:
        return to_label(value)

    @model_validator(mode="after")
    def _exactly_one_feature_form(self) -> InputEvent:
        if (self.x is None) == (self.features is None):
            which = "both" if self.x is not None else "neither"
            raise ValueError(f"exactly one of x (a list of numbers) or features (an object of name → number) is required, got {which}")
        return self


class Source(BaseModel):
    """Where an input came from: the key to drop repeated outputs by."""

    topic: str
    partition: int
    offset: int


class ModelInfo(BaseModel):
    version: int = Field(description="Weight updates made so far, this event's included.")
    seen: int = Field(description="Events predicted so far, this one included.")
    mistakes: int = Field(description="Mistakes made so far, this event's included.")


class Prediction(BaseModel):
    """Published on the output topic for every valid input, keyed like the input."""

    model_config = ConfigDict(title="Prediction")

    id: str | int | None
    source: Source
    y_pred: Literal[-1, 1] = Field(description="The prediction made BEFORE learning from this event.")
    score: float = Field(description="w·x + b of the predicting weights.")
    y: Literal[-1, 1] | None = Field(description="The label, when the event had one.")
    mistake: bool | None = Field(description="y·score ≤ 0; null when unlabeled.")
    model: ModelInfo


class DeadLetter(BaseModel):
    """Published on the dead-letter topic for every rejected input."""

    model_config = ConfigDict(title="DeadLetter")

    error: str = Field(description="Why the event was rejected, as a sentence.")
    reason: str = Field(description="Short code of the error, the label of perceptron_rejected_events_total.")
    source: Source
    raw: str = Field(description="The original value as text, or base64 when it is not UTF-8.")
    raw_encoding: Literal["utf-8", "base64"]
    raw_truncated: bool = Field(description=f"True when raw holds only the head of the original: it was longer than "
                                            f"{DEAD_LETTER_RAW_LIMIT} bytes, or the head was cut so that the dead letter "
                                            "(key included) fits --max-message-bytes.")
    key_dropped: bool = Field(False, description="Present and true when the input's Kafka key was left off this dead "
                                                 "letter: with it even a letter with no raw would exceed --max-message-bytes.")


class Event(NamedTuple):
    """A valid input, in the form the learner takes."""

    id: str | int | None
    x: list[float] | dict[str, float]
    y: int | None


class Rejection(NamedTuple):
    reason: str
    error: str


#: The keys of the events the fast path takes; an event with others is decoded by the model.
_FAST_KEYS = frozenset(("id", "x", "features", "y"))
_ONLY_FLOATS = frozenset((float,)).issuperset
_NUMBERS = frozenset((float, int)).issuperset  # bool is not int here: type(True) is bool
_LABELS = {1: 1, -1: -1, 0: -1}  # True == 1 and False == 0 hash alike: the booleans map too
_new = tuple.__new__

#: Messages at least this long skip the orjson fast path. Its gain is a fixed
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

    def __init__(self, max_message_bytes: int, max_features: int, dimension: int | None = None,
                 max_feature_value: float = 1e15, model_first_bytes: int = MODEL_FIRST_BYTES):
        self.max_message_bytes = max_message_bytes
        self.max_features = max_features
        self.dimension = dimension
        self.max_feature_value = max_feature_value
        self.model_first_bytes = model_first_bytes

    def decode(self, raw: bytes | None, key: bytes | None = None) -> Event | Rejection:
        """The event in ``raw``, or why it is rejected; the Kafka ``key`` counts toward the size limit
        (it is passed through to the outputs, which must fit the brokers' limit too)."""
        if raw is None:
            return Rejection("invalid_event", "the message has no value (a tombstone); send a JSON object")
        size = len(raw) if key is None else len(raw) + len(key)
        if size > self.max_message_bytes:
            what = "" if key is None else f" (key {len(key)} + value {len(raw)})"
            return Rejection("too_large", f"the message is {size} bytes{what}, more than the limit of {self.max_message_bytes}")
        if len(raw) >= self.model_first_bytes:
            return self._decode_model(raw)
        # The fast path: each test below that fails hands the message to the model.
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return self._decode_model(raw)
        if type(doc) is not dict or not _FAST_KEYS.issuperset(doc):
            return self._decode_model(raw)
        get = doc.get
        id_, y = get("id"), get("y")
        if not (id_ is None or type(id_) is str or type(id_) is int):
            return self._decode_model(raw)
        if y is not None:
            y = _LABELS.get(y) if (type(y) is int or type(y) is bool) else None
            if y is None:
                return self._decode_model(raw)
        x, features = get("x"), get("features")
        if features is None and type(x) is list:
            if not _ONLY_FLOATS(map(type, x)):
                if not _NUMBERS(map(type, x)):
                    return self._decode_model(raw)
                if len(x) <= self.max_features:  # else rejected below, unconverted
                    x = list(map(float, x))
            return self._checked(id_, x, True, y)
        if x is None and type(features) is dict:
            values = features.values()
            if not _ONLY_FLOATS(map(type, values)):
                if not _NUMBERS(map(type, values)):
                    return self._decode_model(raw)
                if len(features) <= self.max_features:
                    features = dict(zip(features, map(float, values)))
            return self._checked(id_, features, False, y)
        return self._decode_model(raw)

    def _decode_model(self, raw: bytes) -> Event | Rejection:
        """The model's way: every rule of :class:`InputEvent`, and a sentence for the first one broken."""
        try:
            event = InputEvent.model_validate_json(raw)
        except ValidationError as exc:
            return _explain(exc, raw)
        dense = event.x is not None
        return self._checked(event.id, event.x if dense else event.features, dense, event.y)

    def _checked(self, id_: str | int | None, x: list[float] | dict[str, float], dense: bool, y: int | None) -> Event | Rejection:
        """The rules beyond the model: at least one feature, at most max_features, the fixed dimension."""
        n = len(x)
        if not n:
            return Rejection("invalid_event", f"{'x' if dense else 'features'} is empty; send at least one feature")
        if n > self.max_features:
            return Rejection("too_many_features", f"the event has {n} features, more than the limit of {self.max_features}")
        values, limit = (x if dense else x.values()), self.max_feature_value
        # every |x_i| <= ||x||: the norm (in C doubles, no overflow) settles the common case
        # at a quarter of the cost of max/min, whose comparisons are generic object ones
        if hypot(*values) > limit and (largest := max(map(abs, values))) > limit:
            return Rejection("out_of_range", f"{'x' if dense else 'features'} has a value of magnitude {largest:.3g}, more than "
                                             f"the limit of {limit:.3g}; rescale the feature")
        if dense:
            if self.dimension is None:
                self.dimension = n
            elif n != self.dimension:
                return Rejection(
                    "wrong_dimension",
                    f"x has {n} values but this model takes {self.dimension} (the first dense event fixed the dimension)",
                )
        return _new(Event, (id_, x, y))


def _explain(exc: ValidationError, raw: bytes) -> Rejection:
    """One sentence for the first problem pydantic found (never echoing a huge input)."""
    error = exc.errors(include_url=False)[0]
    kind, loc = error["type"], ".".join(str(p) for p in error["loc"])
    if kind == "json_invalid":
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as bad:
            return Rejection("not_utf8", f"the message is not UTF-8 text (bad byte at position {bad.start}); send UTF-8 JSON")
        return Rejection("invalid_json", f"the message is not valid JSON: {error['ctx']['error']}")
    if kind == "model_type":
        return Rejection("invalid_event", f"the event must be a JSON object, got {_json_type(error['input'])}")
    if loc.startswith("id"):
        return Rejection("invalid_event", f"id must be a string or a number, got {_json_type(error['input'])}")
    if loc.startswith("y") or "y must be" in error["msg"]:
        return Rejection("bad_label", error["msg"].removeprefix("Value error, "))
    if kind == "finite_number":
        return Rejection("non_finite", f"{_path(error['loc'])} must be a finite number, got {_show(error['input'])}")
    if kind == "value_error":
        return Rejection("invalid_event", error["msg"].removeprefix("Value error, "))
    if kind in ("float_type", "list_type", "dict_type"):
        wanted = {"float_type": "a number", "list_type": "a list of numbers", "dict_type": "an object of name → number"}[kind]
        return Rejection("invalid_event", f"{_path(error['loc'])} must be {wanted}, got {_json_type(error['input'])} {_show(error['input'])}")
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
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


def _show(value: Any, limit: int = 40) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return {math.inf: "Infinity", -math.inf: "-Infinity"}.get(value, "NaN")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**30:
        return f"a number of {len(str(abs(value)))} digits"
    text = json.dumps(value, default=str) if not isinstance(value, (list, dict)) else ("[...]" if isinstance(value, list) else "{...}")
    return text if len(text) <= limit else text[: limit - 3] + "..."


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


SCHEMAS = {"input-event": InputEvent, "prediction": Prediction, "dead-letter": DeadLetter}
SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"


def json_schemas() -> dict[str, str]:
    """The text of each ``schemas/<name>.schema.json``, as generated from the models."""
    return {
        f"{name}.schema.json": json.dumps(model.model_json_schema(mode="validation"), indent=2, ensure_ascii=False) + "\n"
        for name, model in SCHEMAS.items()
    }


if __name__ == "__main__":  # python -m service.schema: regenerate schemas/
    SCHEMA_DIR.mkdir(exist_ok=True)
    for filename, text in json_schemas().items():
        (SCHEMA_DIR / filename).write_text(text, encoding="utf-8")
        print("wrote", SCHEMA_DIR / filename)

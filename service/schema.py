"""The wire format: bytes in, validated events, predictions and dead letters out.

Three pydantic models are the contract with producers and consumers
(``schemas/*.json`` is generated from them, see ``python -m service.schema``):

- :class:`InputEvent`, one labeled or unlabeled point;
- :class:`Prediction`, published for every valid input;
- :class:`DeadLetter`, published for every rejected input, with a reason a
  producer can act on.

Decoding goes through pydantic's Rust JSON parser in one call per message;
rejections are turned into one plain sentence and a short reason code that
is also the ``reason`` label of ``perceptron_rejected_events_total``.

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
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

FiniteNumber = Annotated[float, Field(strict=True, allow_inf_nan=False)]

#: Raw bytes kept in a dead letter. A rejected message may be as large as the
#: input limit; the dead letter keeps its head and its source position, which
#: points at the whole original in the input topic.
DEAD_LETTER_RAW_LIMIT = 64 * 1024

#: Every reason code a rejection can carry (the metric's label values).
REASONS = ("invalid_json", "not_utf8", "invalid_event", "bad_label", "non_finite", "wrong_dimension", "too_large", "too_many_features")


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

    id: str | int | None = Field(None, description="The producer's id of the point, copied to the prediction.")
    x: list[FiniteNumber] | None = Field(None, description="Dense features; the first dense event fixes their number.")
    features: dict[str, FiniteNumber] | None = Field(None, description="Named features, name → number.")
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
    raw_truncated: bool = Field(description=f"True when the original was longer than {DEAD_LETTER_RAW_LIMIT} bytes.")


class Event(NamedTuple):
    """A valid input, in the form the learner takes."""

    id: str | int | None
    x: list[float] | dict[str, float]
    y: int | None


class Rejection(NamedTuple):
    reason: str
    error: str


class Decoder:
    """Turns message values into events or rejections.

    It holds one piece of state, the dimension ``d`` fixed by the first dense
    event, which checkpoints carry so a restart keeps it.
    """

    def __init__(self, max_message_bytes: int, max_features: int, dimension: int | None = None):
        self.max_message_bytes = max_message_bytes
        self.max_features = max_features
        self.dimension = dimension

    def decode(self, raw: bytes | None) -> Event | Rejection:
        if raw is None:
            return Rejection("invalid_event", "the message has no value (a tombstone); send a JSON object")
        if len(raw) > self.max_message_bytes:
            return Rejection("too_large", f"the message is {len(raw)} bytes, more than the limit of {self.max_message_bytes}")
        try:
            event = InputEvent.model_validate_json(raw)
        except ValidationError as exc:
            return _explain(exc, raw)
        x = event.x if event.x is not None else event.features
        if not x:
            return Rejection("invalid_event", f"{'x' if event.x is not None else 'features'} is empty; send at least one feature")
        if len(x) > self.max_features:
            return Rejection("too_many_features", f"the event has {len(x)} features, more than the limit of {self.max_features}")
        if event.x is not None:
            if self.dimension is None:
                self.dimension = len(x)
            elif len(x) != self.dimension:
                return Rejection(
                    "wrong_dimension",
                    f"x has {len(x)} values but this model takes {self.dimension} (the first dense event fixed the dimension)",
                )
        return Event(event.id, x, event.y)


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

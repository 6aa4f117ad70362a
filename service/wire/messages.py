"""The wire contract: the messages producers send and consumers read, as pydantic models.

``schemas/*.json`` is generated from them (``python -m perceptron_stream.wire.messages``;
a test fails when they drift):

- :class:`InputEvent`, one labeled or unlabeled point;
- :class:`Prediction`, published for every valid input;
- :class:`DeadLetter`, published for every rejected input, with a reason a
  producer can act on.
- :class:`ModelFile`, one model as a file: named here with the others, at home in
  :mod:`perceptron_stream.model_format` (below the settings, which check a file against it).

:mod:`perceptron_stream.wire.inputs` turns bytes into events with these rules;
:mod:`perceptron_stream.wire.outputs` is the one place that builds each outgoing message.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

from perceptron_stream.learning.labels import json_label
from perceptron_stream.model_format import FiniteNumber, ModelFile  # the model file's contract lives below the settings
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


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
REASONS = (
    "invalid_json",
    "not_utf8",
    "invalid_event",
    "bad_label",
    "non_finite",
    "out_of_range",
    "wrong_dimension",
    "too_large",
    "too_many_features",
    "output_refused",
    "unknown_id",
    "duplicate",
)


def _show(value: Any, limit: int = 40) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return {math.inf: "Infinity", -math.inf: "-Infinity"}.get(value, "NaN")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**30:
        return f"a number of {len(str(abs(value)))} digits"
    text = (
        json.dumps(value, default=str)
        if not isinstance(value, (list, dict))
        else ("[...]" if isinstance(value, list) else "{...}")
    )
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _label(value: Any) -> int | None:
    """A JSON ``y`` to -1/+1 by :func:`~perceptron_stream.learning.labels.json_label`; None stays None (unlabeled).

    >>> [_label(v) for v in (1, -1, 0, True, False, None)]
    [1, -1, -1, 1, -1, None]
    """
    if value is None:
        return None
    y = json_label(value)
    if y is None:
        raise ValueError(f"y must be -1 or +1 (0/1 and false/true are accepted too), got {_show(value)}")
    return y


class InputEvent(BaseModel):
    """One point on the input topic. Unknown keys are ignored, so producers may add their own."""

    model_config = ConfigDict(extra="ignore", title="InputEvent")

    id: Annotated[str | int, OneError("id_type", "id must be a string or an integer")] | None = Field(
        None, description="The producer's id of the point, copied to the prediction."
    )
    x: Annotated[list[FiniteNumber], FirstErrorOnly()] | None = Field(
        None, description="Dense features; the first dense event fixes their number."
    )
    features: Annotated[dict[str, FiniteNumber], FirstErrorOnly()] | None = Field(
        None, description="Named features, name → number."
    )
    y: Literal[-1, 1] | None = Field(
        None,
        description="Label −1 or +1; 0/1 and false/true are accepted and mapped (0 and false → −1). "
        "Absent or null: predict only.",
    )

    @field_validator("y", mode="before")
    @classmethod
    def _map_label(cls, value: Any) -> int | None:
        return _label(value)

    @model_validator(mode="after")
    def _exactly_one_feature_form(self) -> InputEvent:
        if (self.x is None) == (self.features is None):
            which = "both" if self.x is not None else "neither"
            raise ValueError(
                f"exactly one of x (a list of numbers) or features (an object of name → number) is required, got {which}"
            )
        return self


class Source(BaseModel):
    """Where an input came from: the key to drop repeated outputs by."""

    topic: str
    partition: int
    offset: int


class ModelInfo(BaseModel):
    """The model that made the prediction: the group's one model, or (``--model-scope partition``) a partition's replica."""

    scope: Literal["partition"] | None = Field(
        None, description="\"partition\" for a partition's replica; absent for the group's model."
    )
    partition: int | None = Field(None, description="The replica's input partition (partition scope).")
    mixes: int | None = Field(
        None, description="Mixes the replica has made with the other partitions' (partition scope)."
    )
    run: str | None = Field(
        None,
        description="--model-history-topic: the model's run (an incarnation: from a start, a restore or a warm "
        "start) whose history rebuilds it (perceptron-stream explain); absent without a history.",
    )
    version: int = Field(description="Weight updates made so far, this event's included (a replica's own).")
    seen: int = Field(description="Events predicted so far, this one included (a replica's own).")
    mistakes: int = Field(description="Mistakes made so far, this event's included (a replica's own).")


class Reason(BaseModel):
    """One feature's part in a score (``--explain K``): the contributions of all the event's features plus ``bias``
    add up to ``score``."""

    feature: str | int = Field(
        description='The feature as the event gave it: its name ({"features": {...}}) or its position ({"x": [...]}).'
    )
    value: float = Field(
        description="The value the model saw: the event's, or after --standardize its standardised value; with "
        "--hash-features the event's value, its weight that of the feature's bucket (signed as the bucket's hash)."
    )
    weight: float = Field(description="The predicting weight of the feature (of its bucket, with hashing).")
    contribution: float = Field(description="weight × value: its part in the score.")


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
    reasons: list[Reason] | None = Field(
        None,
        description="--explain K: the K features with the largest absolute contribution to the score, largest "
        "first (ties in the event's order); absent without --explain.",
    )
    bias: float | None = Field(
        None, description="--explain K: the predicting bias, the part of the score no feature holds."
    )


class DeadLetter(BaseModel):
    """Published on the dead-letter topic for every rejected input."""

    model_config = ConfigDict(title="DeadLetter")

    error: str = Field(description="Why the event was rejected, as a sentence.")
    reason: str = Field(description="Short code of the error, the label of perceptron_rejected_events_total.")
    source: Source
    raw: str = Field(description="The original value as text, or base64 when it is not UTF-8.")
    raw_encoding: Literal["utf-8", "base64"]
    raw_truncated: bool = Field(
        description=f"True when raw holds only the head of the original: it was longer than "
        f"{DEAD_LETTER_RAW_LIMIT} bytes, or the head was cut so that the dead letter "
        "(key included) fits --max-message-bytes."
    )
    key_dropped: bool = Field(
        False,
        description="Present and true when the input's Kafka key was left off this dead "
        "letter: with it even a letter with no raw would exceed --max-message-bytes.",
    )


class LabelEvent(BaseModel):
    """A label that comes after its point (``--label-topic``), keyed with the point's key. Unknown keys are ignored."""

    model_config = ConfigDict(extra="ignore", title="LabelEvent")

    id: Annotated[str | int, OneError("id_type", "id must be a string or an integer")] = Field(
        description="The id of the point it labels (sent earlier without y)."
    )
    y: Literal[-1, 1] = Field(
        description="Label −1 or +1; 0/1 and false/true are accepted and mapped (0 and false → −1)."
    )

    @field_validator("y", mode="before")
    @classmethod
    def _map_label(cls, value: Any) -> int | None:
        if value is None:
            raise ValueError("y is required in a label: -1 or +1 (0/1 and false/true are accepted too)")
        return _label(value)


class Outcome(BaseModel):
    """Published on the outcome topic when a delayed label joins its point: how the published decision fared."""

    model_config = ConfigDict(title="Outcome")

    id: str | int
    y: Literal[-1, 1] = Field(description="The label that came.")
    y_pred: Literal[-1, 1] = Field(description="The prediction published for the point, before the label.")
    score: float = Field(description="The score published with that prediction.")
    mistake: bool = Field(
        description="y·score ≤ 0: the published decision was wrong (a score of exactly 0 is a mistake whatever y_pred "
        "says); what perceptron_mistakes_total counts, as for a labeled event."
    )
    source: Source = Field(description="The point's position: the prediction's source.")
    label_source: Source = Field(description="The label's position: the key to drop repeated outcomes by.")
    delay_seconds: float = Field(description="From the point's arrival to its label's.")
    model: ModelInfo = Field(description="The model once it learned from the label.")


class ChampionReport(BaseModel):
    variant: str
    weights: dict[str, float] = Field(
        description="A page of the predicting weights by feature name: at most the report's "
        "limit, from its offset, in the order the model first learned them."
    )
    bias: float
    version: int
    seen: int
    mistakes: int
    radius: float
    weight_norm: float
    features: int = Field(description="How many features the model holds (every page together).")
    weights_version: int = Field(
        description="The version the weights, bias and weight norm are of: the model's version "
        "when a request first saw it (copied once per version)."
    )
    weights_seen: int = Field(
        description="Events seen when they were copied: the averaged variant's average moves with "
        "every event, so its weights are as of then; the other variants' are exact."
    )


class ReplicaReport(BaseModel):
    task: str = Field(description='"model" (group scope) or "partition-N".')
    partition: int | None
    champion: ChampionReport
    challengers: dict[str, ChampionReport]


class ModelReport(BaseModel):
    """GET /model: the weights and numbers of every model this instance serves (read-only)."""

    model_config = ConfigDict(title="ModelReport")

    scope: Literal["group", "partition"]
    learning: Literal["on", "off"]
    offset: int = Field(description="The first feature of each model's page (?offset=, default 0).")
    limit: int = Field(description="Most weights per model in this response (?limit=, default 1000, at most 10000).")
    next_offset: int | None = Field(description="The offset of the next page, null when no model has more features.")
    models: list[ReplicaReport]


class Event(NamedTuple):
    """A valid input, in the form the learner takes."""

    id: str | int | None
    x: list[float] | dict[str, float]
    y: int | None


class Label(NamedTuple):
    """A valid delayed label."""

    id: str | int
    y: int


class Rejection(NamedTuple):
    reason: str
    error: str


SCHEMAS: dict[str, type[BaseModel]] = {
    "input-event": InputEvent,
    "prediction": Prediction,
    "dead-letter": DeadLetter,
    "label-event": LabelEvent,
    "outcome": Outcome,
    "model-file": ModelFile,
    "model-report": ModelReport,
}
SCHEMA_DIR = Path(__file__).resolve().parents[2] / "schemas"


def json_schemas() -> dict[str, str]:
    """The text of each ``schemas/<name>.schema.json``, as generated from the models."""
    return {
        f"{name}.schema.json": json.dumps(model.model_json_schema(mode="validation"), indent=2, ensure_ascii=False)
        + "\n"
        for name, model in SCHEMAS.items()
    }


if __name__ == "__main__":  # python -m perceptron_stream.wire.messages: regenerate schemas/
    SCHEMA_DIR.mkdir(exist_ok=True)
    for filename, text in json_schemas().items():
        (SCHEMA_DIR / filename).write_text(text, encoding="utf-8")
        print("wrote", SCHEMA_DIR / filename)

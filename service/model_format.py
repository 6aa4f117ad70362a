"""The model file's contract (:class:`ModelFile`): one model as a JSON document, what ``train --output`` and
``model export`` write and ``serve --initial-model`` reads.

A pydantic model of the wire's contract (:mod:`perceptron_stream.wire.messages` names it beside the messages, and
``schemas/model-file.schema.json`` is generated from it there), kept in a module that imports nothing of the
project: the settings check an initial model against it at start-up (:mod:`perceptron_stream.config`, exit 2)
without importing the wire. :mod:`perceptron_stream.learning.model_file` turns such a document into a learner.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: A JSON number that is finite, and a number (not a string of one): the weights of a model, an event's features.
FiniteNumber = Annotated[float, Field(strict=True, allow_inf_nan=False)]


class ModelFile(BaseModel):
    """One model as a file: what ``train --output`` and ``model export`` write, and ``serve --initial-model`` reads."""

    model_config = ConfigDict(extra="forbid", title="ModelFile")

    kind: Literal["perceptron-stream.model"]
    format: Literal[1]
    variant: Literal["plain", "averaged", "pocket", "margin"]
    margin: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0
    standardize: bool = Field(False, description="A StandardScaler in front (its moments are in state).")
    hash_features: Annotated[int, Field(ge=0)] = Field(0, description="Buckets the features are hashed into (0: none).")
    input: Literal["dense", "named", "mixed"] | None = Field(
        None,
        description="The form of input the features come from: dense (x, numbered 0..d-1: features are integers), "
        "named (features by name: strings), mixed (both). serve refuses a file whose features do not fit it. Absent "
        "(files written before it existed, or hashed models): told by the features' types where it can be.",
    )
    features: list[str | int] = Field(description="Feature names: strings for named features, 0..d-1 for dense x.")
    weights: list[FiniteNumber] = Field(description="The predicting weights, one per feature.")
    bias: FiniteNumber
    source: str = Field(description="Where it comes from (train's algorithm and data, or the checkpoint exported).")
    state: dict | None = Field(
        None,
        description="The learner's whole state (counters, averaged sums, the scaler's "
        "moments): an exact start. Absent: the weights alone.",
    )

    @model_validator(mode="after")
    def _one_weight_per_feature(self) -> ModelFile:
        if len(self.weights) != len(self.features) or len(set(self.features)) != len(self.features):
            raise ValueError("features must be unique names, one per weight")
        return self

"""One model as a file (``train --output``, ``model export``, ``serve --initial-model``): to and from learners.

The document's contract is :class:`service.wire.messages.ModelFile` (a JSON
Schema in ``schemas/``); this module only converts, with no Kafka or HTTP.

>>> doc = from_weights({"age": 0.5, "debt": -1.0}, bias=0.25, source="train pla")
>>> learner = to_learner(doc, variant="plain", margin=0.0, standardize=False, hash_features=0, max_features=None)
>>> learner.weights, learner.bias
({'age': 0.5, 'debt': -1.0}, 0.25)
>>> to_learner(doc, variant="averaged", margin=0.0, standardize=False, hash_features=0, max_features=None)
Traceback (most recent call last):
...
ValueError: the model file holds a plain perceptron, and --variant is averaged
"""

from __future__ import annotations

from service.learning.factory import learner_from_state
from service.learning.perceptron import Perceptron

KIND, FORMAT = "perceptron-stream.model", 1


def from_weights(weights: dict, bias: float, source: str, variant: str = "plain", margin: float = 0.0) -> dict:
    """A model file of weights alone (the batch algorithms' result)."""
    return {"kind": KIND, "format": FORMAT, "variant": variant, "margin": margin, "standardize": False, "hash_features": 0,
            "features": list(weights), "weights": [float(v) for v in weights.values()], "bias": float(bias), "source": source}


def from_learner(learner, source: str, settings_meta: dict) -> dict:
    """A model file of a running learner: its predicting weights, and its whole state for an exact start."""
    weights = learner.weights
    return {"kind": KIND, "format": FORMAT, "variant": settings_meta["variant"], "margin": settings_meta["margin"],
            "standardize": settings_meta["standardize"], "hash_features": settings_meta.get("hash_features", 0),
            "features": list(weights), "weights": list(weights.values()), "bias": learner.bias, "source": source,
            "state": learner.to_state()}


def to_learner(doc: dict, *, variant: str, margin: float, standardize: bool, hash_features: int, max_features: int | None):
    """The learner a model file starts; ValueError naming what does not fit the service's settings."""
    for name, theirs, ours in (("variant", doc["variant"], variant), ("margin", doc["margin"], margin),
                               ("standardize", doc["standardize"], standardize), ("hash_features", doc["hash_features"], hash_features)):
        if theirs != ours:
            what = {"variant": f"a {theirs} perceptron, and --variant is {ours}",
                    "margin": f"margin {theirs}, and --margin is {ours}",
                    "standardize": f"{'a' if theirs else 'no'} scaler in front, and --standardize is {'on' if ours else 'off'}",
                    "hash_features": f"features hashed into {theirs} buckets, and --hash-features is {ours}"}[name]
            raise ValueError(f"the model file holds {what}")
    if max_features is not None and len(doc["features"]) > max_features:
        raise ValueError(f"the model file holds {len(doc['features']):,} features, more than --max-model-features {max_features:,}")
    if doc.get("state") is not None:
        learner = learner_from_state(doc["state"])
        if learner.weights != dict(zip(doc["features"], doc["weights"])):
            raise ValueError("the model file's state and its weights disagree")
        learner.max_features = max_features
        return learner
    if standardize or hash_features:
        raise ValueError("a model file of weights alone (no state) cannot start a model with a scaler or hashing in front")
    return Perceptron.from_weights(dict(zip(doc["features"], doc["weights"])), bias=doc["bias"], variant=variant,
                                   margin=margin, max_features=max_features)

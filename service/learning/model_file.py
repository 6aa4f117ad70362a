"""One model as a file (``train --output``, ``model export``, ``serve --initial-model``): to and from learners.

The document's contract is :class:`perceptron_stream.model_format.ModelFile` (a JSON
Schema in ``schemas/``); this module only converts, with no Kafka or HTTP.

>>> doc = from_weights({"age": 0.5, "debt": -1.0}, bias=0.25, source="train pla")
>>> doc["input"]
'named'
>>> learner = to_learner(doc, variant="plain", margin=0.0, standardize=False, hash_features=0, max_features=None)
>>> learner.weights, learner.bias
({'age': 0.5, 'debt': -1.0}, 0.25)
>>> to_learner({**doc, "input": "dense"}, variant="plain", margin=0.0, standardize=False, hash_features=0, max_features=None)
Traceback (most recent call last):
...
ValueError: the model file says its features come from dense x (numbered 0, 1, ...), and they are names ('age', 'debt'): no event can meet them that way. Write it again with train (--dense for a CSV read as x)
>>> to_learner(doc, variant="averaged", margin=0.0, standardize=False, hash_features=0, max_features=None)
Traceback (most recent call last):
...
ValueError: the model file holds a plain perceptron, and --variant is averaged
"""

from __future__ import annotations

from perceptron_stream.learning.factory import learner_from_state
from perceptron_stream.learning.perceptron import Perceptron

KIND, FORMAT = "perceptron-stream.model", 1

#: Bytes a model file may take per feature it holds, and besides them. A feature's entry in the largest file (an
#: averaged or pocket model with a scaler: its name four times, five numbers) with 20-30 character names is ~160
#: bytes (bench/checkpoint_size.py measures the checkpoint alike); 2 KiB leaves room for names of some 450
#: characters. What is larger is refused before it is read (at the default 50,000 features: over 100 MB).
BYTES_PER_FEATURE, BYTES_BESIDES = 2048, 64 * 1024


def largest_file_bytes(max_features: int | None) -> int | None:
    """The largest model file a model of at most ``max_features`` features may be (None: no cap, no bound).

    >>> largest_file_bytes(50_000), largest_file_bytes(None)
    (102465536, None)
    """
    return None if max_features is None else max_features * BYTES_PER_FEATURE + BYTES_BESIDES


def input_form(features) -> str | None:
    """The form of input features come from, told by their types: dense x is numbered (int), named features are str.

    The service numbers a dense event's values 0..d-1 and keeps a named event's names as they are (JSON keys are
    strings), so an int feature only ever meets dense events and a str feature only named ones.

    >>> input_form([0, 1]), input_form(["age"]), input_form([0, "age"]), input_form([])
    ('dense', 'named', 'mixed', None)
    """
    kinds = {type(f) for f in features}
    if not kinds:
        return None
    return "dense" if kinds == {int} else "named" if kinds == {str} else "mixed"


def from_weights(weights: dict, bias: float, source: str, variant: str = "plain", margin: float = 0.0) -> dict:
    """A model file of weights alone (the batch algorithms' result): dense x's features are 0..d-1, named ones str."""
    return {
        "kind": KIND,
        "format": FORMAT,
        "variant": variant,
        "margin": margin,
        "standardize": False,
        "hash_features": 0,
        "input": input_form(weights),
        "features": list(weights),
        "weights": [float(v) for v in weights.values()],
        "bias": float(bias),
        "source": source,
    }


def from_learner(learner, source: str, settings_meta: dict) -> dict:
    """A model file of a running learner: its predicting weights, and its whole state for an exact start."""
    weights = learner.weights
    hashed = settings_meta.get("hash_features", 0)
    return {
        "kind": KIND,
        "format": FORMAT,
        "variant": settings_meta["variant"],
        "margin": settings_meta["margin"],
        "standardize": settings_meta["standardize"],
        "hash_features": hashed,
        "input": None if hashed else input_form(weights),  # hashed: buckets, whatever the events' form
        "features": list(weights),
        "weights": list(weights.values()),
        "bias": learner.bias,
        "source": source,
        "state": learner.to_state(),
    }


def check_input(doc: dict, max_event_features: int | None = None) -> None:
    """ValueError when a model file's features cannot meet the events it says it is for.

    Where it can be known before any event: the features' types against the
    file's ``input`` (str names meet only named events, numbers only dense
    ones), and dense positions at or beyond ``--max-features`` (events that
    long are dead-lettered, so those weights would never be used). Whether the
    events a service will get are of that form is known only when they come:
    the task counts those that share no feature with the model.
    """
    if doc.get("hash_features"):
        return  # its features are buckets, whatever the events' form
    features = doc["features"]
    form = doc.get("input") or input_form(features)
    if form == "dense":
        names = [f for f in features if type(f) is not int]
        if names:
            raise ValueError(
                f"the model file says its features come from dense x (numbered 0, 1, ...), and they are names "
                f"({_some(names)}): no event can meet them that way. Write it again with train (--dense for a "
                "CSV read as x)"
            )
        if max_event_features is not None and features and max(features) >= max_event_features:
            raise ValueError(
                f"the model file's dense features go up to position {max(features)}, and events with more than "
                f"--max-features {max_event_features:,} values are dead-lettered: raise --max-features to at "
                f"least {max(features) + 1:,}"
            )
    elif form == "named":
        numbers = [f for f in features if type(f) is not str]
        if numbers:
            raise ValueError(
                f"the model file says its features are named, and some are positions of dense x "
                f'({_some(numbers)}): write it again with train, or give it "input": "mixed"'
            )


def _some(values: list) -> str:
    """The first three, for a message."""
    return ", ".join(map(repr, values[:3])) + (", ..." if len(values) > 3 else "")


def to_learner(
    doc: dict,
    *,
    variant: str,
    margin: float,
    standardize: bool,
    hash_features: int,
    max_features: int | None,
    max_event_features: int | None = None,
):
    """The learner a model file starts; ValueError naming what does not fit the service's settings
    (``max_event_features``: the decoder's ``--max-features``)."""
    check_input(doc, max_event_features)
    # margin, standardize and hash_features have defaults in the ModelFile contract (0, false, 0): a file may leave them out
    for name, theirs, ours in (
        ("variant", doc["variant"], variant),
        ("margin", doc.get("margin", 0.0), margin),
        ("standardize", doc.get("standardize", False), standardize),
        ("hash_features", doc.get("hash_features", 0), hash_features),
    ):
        if theirs != ours:
            what = {
                "variant": f"{'an' if str(theirs)[:1] in 'aeiou' else 'a'} {theirs} perceptron, and --variant is {ours}",
                "margin": f"margin {theirs}, and --margin is {ours}",
                "standardize": f"{'a' if theirs else 'no'} scaler in front, and --standardize is {'on' if ours else 'off'}",
                "hash_features": f"features hashed into {theirs} buckets, and --hash-features is {ours}",
            }[name]
            raise ValueError(f"the model file holds {what}")
    if max_features is not None and len(doc["features"]) > max_features:
        raise ValueError(
            f"the model file holds {len(doc['features']):,} features, more than --max-model-features {max_features:,}"
        )
    if doc.get("state") is not None:
        learner = learner_from_state(doc["state"])
        if learner.weights != dict(zip(doc["features"], doc["weights"])):
            raise ValueError("the model file's state and its weights disagree")
        learner.max_features = max_features
        return learner
    if standardize or hash_features:
        raise ValueError(
            "a model file of weights alone (no state) cannot start a model with a scaler or hashing in front"
        )
    return Perceptron.from_weights(
        dict(zip(doc["features"], doc["weights"])),
        bias=doc["bias"],
        variant=variant,
        margin=margin,
        max_features=max_features,
    )

"""What both peers share: river's Perceptron as a user would call it, and their standalone command line."""

from __future__ import annotations

import argparse

from river import linear_model


def predictor():
    """river's Perceptron: each event predicted before it is learned; returns the prediction message.

    >>> predict_and_learn = predictor()
    >>> predict_and_learn({"id": "a", "x": [1.0, 2.0], "y": 1})
    {'id': 'a', 'y_pred': -1, 'y': 1, 'mistake': True}
    >>> predict_and_learn({"id": "b", "x": [1.0, 2.0], "y": 1})["y_pred"]
    1
    """
    model = linear_model.Perceptron()

    def predict_and_learn(event: dict) -> dict:
        x = event["features"] if "features" in event else dict(enumerate(event["x"]))
        y_pred = 1 if model.predict_one(x) else -1
        y = event.get("y")
        if y is None:  # unlabeled: predict only
            return {"id": event.get("id"), "y_pred": y_pred, "y": None, "mistake": None}
        model.learn_one(x, y == 1)
        return {"id": event.get("id"), "y_pred": y_pred, "y": y, "mistake": y_pred != y}

    return predict_and_learn


def standalone_arguments(doc: str, group: str) -> argparse.ArgumentParser:
    """The command line of a peer run on a broker of your own (``python3 -m bench.peers.NAME``)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--bootstrap", default="localhost:9092")
    parser.add_argument("--input", required=True, help="input topic: JSON events {id, x or features, y}")
    parser.add_argument("--output", required=True, help="output topic: JSON predictions {id, y_pred, y, mistake}")
    parser.add_argument("--group", default=group)
    return parser

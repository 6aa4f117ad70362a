"""Labels: which values mean -1 and which +1 (for points, labels and CSV cells), and what a mistake is.

The home of the label table, and of the one definition of a mistake (:func:`is_mistake`). The perceptron learns y = -1/+1; producers also
send 0/1 and false/true (river's datasets give bools). The wire
(:mod:`perceptron_stream.wire.messages`, :mod:`perceptron_stream.wire.inputs`), the learner
(:func:`to_label`, :mod:`perceptron_stream.learning.perceptron`) and the CSV reader
(:mod:`perceptron_stream.streams`) look spellings up here, so they cannot disagree on
what a spelling means; they differ only in which *types* they take: JSON on
the wire is strict (an int or a bool: ``1.0`` is not a label there), the
learner's ``learn_one`` also takes floats and numpy scalars that compare
equal. Pure code: the learning core imports it.
"""

from __future__ import annotations

from typing import Any

#: The spellings of a label as a value: -1/+1, and 0/1 (True == 1 and False == 0 hash alike: the booleans map too;
#: so do 1.0 and numpy's ints and bools, which compare equal).
LABELS = {1: 1, -1: -1, 0: -1}

#: The spellings of a label in a CSV cell, as the wire format maps them (0 and false → -1).
CSV_LABELS = {"1": 1, "+1": 1, "-1": -1, "0": -1, "true": 1, "false": -1}


def is_mistake(y, score):
    """Whether a decision scored ``score`` was a mistake on label ``y``: y·score ≤ 0, the seeds' rule, the one meaning.

    A score of exactly 0 is a mistake whatever the label (sign(0) is no label: the model has not decided), and so
    is the first point a model of zero weights sees. Every place that says "mistake" decides it here: the learner's
    step (inlined on its hot paths, tests/learning check they agree), its batch form (``y`` and ``score`` NumPy
    arrays: the answer is an array of the same flags), a delayed label's join (the *published* decision's score
    against the label), the outcome message, the metrics and the batch algorithms. Not ``y_pred != y``: a
    published ``y_pred`` of -1 for a score of 0 agrees with a label -1, and is still a mistake. A NaN score is no
    mistake (no comparison with NaN holds): the learner's step says the same.

    >>> [is_mistake(y, s) for y, s in ((1, 2.5), (1, -0.3), (-1, -0.3), (-1, 0.0), (1, 0.0), (1, -0.0))]
    [False, True, False, True, True, True]
    """
    return y * score <= 0.0


def json_label(value: Any) -> int | None:
    """A JSON ``y`` to -1/+1: an int or a bool of :data:`LABELS`; None for anything else (null, 2, 1.0, "1").

    >>> [json_label(v) for v in (1, -1, 0, True, False, None, 2, 1.0, "1")]
    [1, -1, -1, 1, -1, None, None, None, None]
    """
    return LABELS.get(value) if type(value) is int or type(value) is bool else None


def to_label(y: Any) -> int:
    """Map a label to -1/+1: -1/+1 as they are, True/1 → +1, False/0 → -1.

    >>> [to_label(v) for v in (1, -1, True, False, 0, 1.0)]
    [1, -1, 1, -1, -1, 1]
    >>> to_label(2)
    Traceback (most recent call last):
    ...
    ValueError: y must be -1 or +1 (or True/False, 1/0), got 2
    """
    try:
        if not isinstance(y, (str, bytes)):
            return LABELS[y]
    except (KeyError, TypeError):
        pass
    raise ValueError(f"y must be -1 or +1 (or True/False, 1/0), got {y!r}")

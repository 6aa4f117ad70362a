"""The learning core: the online perceptron of the seeds and its batch forms.

No Kafka, no HTTP: only river (for the classifier protocol and the optional
StandardScaler), NumPy (the batch form of ``step``) and the standard
library, so it can be read, tested and reused alone.

- :class:`Perceptron`: river classifier with the fused ``step`` hot path
  (variants plain, averaged, pocket, margin: one small class each in
  :mod:`perceptron_stream.learning.variants`, on the shared step) and its
  batch form ``step_many`` (:mod:`perceptron_stream.learning.many`: the same
  floats); JSON state (:mod:`perceptron_stream.learning.saved`), no pickle.
- :func:`make_learner` / :func:`learner_from_state`: what the service runs
  and restores (optionally a StandardScaler in front, a cap on the features
  the model holds, feature hashing: :class:`HashedPerceptron`).
- :mod:`perceptron_stream.learning.batch`: cyclic/random PLA and pocket over a data
  set, margins, radius and the (R/γ)² bound.
"""

from perceptron_stream.learning.factory import learner_from_state, make_learner
from perceptron_stream.learning.hashing import HashedPerceptron
from perceptron_stream.learning.labels import to_label
from perceptron_stream.learning.perceptron import VARIANTS, Perceptron, StepResult
from perceptron_stream.learning.scaled import ScaledPerceptron

__all__ = [
    "VARIANTS",
    "HashedPerceptron",
    "Perceptron",
    "ScaledPerceptron",
    "StepResult",
    "learner_from_state",
    "make_learner",
    "to_label",
]

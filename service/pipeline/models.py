"""Model operations around a task's champion: challengers, frozen learning, drift, and the report of /model.

- **Challengers** (``--challengers averaged,pocket,margin:0.5``): other
  variants stepped on exactly the events the champion learns from, in the
  same order, checkpointed and restored with it; only the champion's
  prediction is published. Their mistakes are scored on the same labels, so
  a team sees on its own stream whether another variant would do better.
- **Frozen learning** (``--learning off``, river's ``pure_inference_mode``):
  predict, publish and count mistakes; never update.
- **Drift**: river's binary DDM over the champion's mistakes. DDM watches
  for the error rate going *up* (Gama et al.'s warning and drift levels); on
  our streams it flagged a label flip after 20 events and nothing during the
  warm-up, where ADWIN, which tests both ways, also flagged the falling
  error rate of a model still learning.
  Edge-triggered: one drift, one count; the detector starts afresh after it.

>>> models = ModelSet.parse("averaged, margin:0.5")
>>> [name for name, _, _ in models]
['averaged', 'margin:0.5']
>>> ModelSet.parse("pocket,pocket")
Traceback (most recent call last):
...
ValueError: challenger pocket is named twice
"""

from __future__ import annotations

import math
from typing import Any

from service.learning import VARIANTS, learner_from_state


class Frozen:
    """A learner that predicts and counts, and never learns (``--learning off``).

    Its state is the wrapped model's as it was given: checkpoints keep it
    unchanged; the counters of what it predicted since live in memory.

    >>> from service.learning import Perceptron
    >>> frozen = Frozen(Perceptron.from_weights([1.0, -1.0]))
    >>> frozen.step([1.0, 3.0], 1), frozen.step([1.0, 3.0], 1), frozen.updates, frozen.seen, frozen.mistakes
    ((-1, -2.0, True), (-1, -2.0, True), 0, 2, 2)
    """

    def __init__(self, model):
        self.model = model
        self.seen, self.mistakes = model.seen, model.mistakes
        self.updates = model.updates

    def step(self, x, y) -> tuple:
        score = self.model.score_one(x)
        y_pred = 1 if score > 0.0 else -1
        self.seen += 1
        if y is None:
            return (y_pred, score, None)
        mistake = y * score <= 0.0
        self.mistakes += mistake
        return (y_pred, score, mistake)

    def relabel(self, x, y, mistake: bool) -> tuple:
        self.mistakes += bool(mistake)
        score = self.model.score_one(x)
        return (1 if score > 0.0 else -1, score, y * score <= 0.0)

    def __getattr__(self, name: str) -> Any:  # weights, bias, radius, to_state... of the model as it is
        return getattr(self.model, name)


def _score_one(learner, x):
    score = getattr(learner, "score_one", None)
    return score(x) if score is not None else learner.perceptron.score_one(x)


class ModelSet:
    """A task's challengers (the champion is the task's learner), stepped alongside it."""

    def __init__(self, specs: list[tuple[str, str, float]], make):
        self.specs = specs
        self.make = make  # (variant, margin) -> a fresh learner, with the champion's preprocessing
        self.challengers = {name: make(variant, margin) for name, variant, margin in specs}

    @staticmethod
    def parse(text: str) -> list[tuple[str, str, float]]:
        """``averaged,pocket,margin:0.5`` → [(name, variant, margin)]; ValueError naming what is wrong."""
        out, names = [], set()
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            variant, _, margin = part.partition(":")
            if variant not in VARIANTS:
                raise ValueError(f"challenger {part!r}: the variant must be one of {', '.join(VARIANTS)}")
            if variant == "margin":
                try:
                    gamma = float(margin) if margin else 0.0
                except ValueError:
                    raise ValueError(f"challenger {part!r}: the margin must be a number, as in margin:0.5") from None
                if not math.isfinite(gamma) or gamma < 0:
                    raise ValueError(f"challenger {part!r}: the margin must be a finite number >= 0")
                name = f"margin:{margin}" if margin else "margin"
            elif margin:
                raise ValueError(f"challenger {part!r}: only the margin variant takes a parameter")
            else:
                name, gamma = variant, 0.0
            if name in names:
                raise ValueError(f"challenger {name} is named twice")
            names.add(name)
            out.append((name, variant, gamma))
        return out

    def __iter__(self):
        return iter(self.specs)

    def step(self, x, y) -> dict[str, tuple]:
        return {name: c.step(x, y) for name, c in self.challengers.items()}

    def predict(self, x) -> dict[str, int]:
        """Each challenger's prediction of x now, learning nothing (kept with a pending point)."""
        return {name: 1 if _score_one(c, x) > 0.0 else -1 for name, c in self.challengers.items()}

    def to_state(self) -> dict:
        return {name: c.to_state() for name, c in self.challengers.items()}

    def restore(self, states: dict) -> list[str]:
        """The challengers a checkpoint holds; a challenger it lacks starts fresh (its name returned)."""
        fresh = []
        for name, variant, margin in self.specs:
            state = states.get(name) if isinstance(states, dict) else None
            if state is None:
                self.challengers[name] = self.make(variant, margin)
                fresh.append(name)
            else:
                self.challengers[name] = learner_from_state(state)
        return fresh


class DriftWatch:
    """river's binary DDM over a champion's mistake stream; edge-triggered (one drift, one count)."""

    def __init__(self):
        from river.drift.binary import DDM  # river's drift detectors: imported only when used

        self._make = DDM
        self.detector = DDM()

    def update(self, mistakes: list[bool]) -> int:
        """Feed a batch's mistake flags, in order; how many drifts they showed."""
        found = 0
        detector = self.detector
        for m in mistakes:
            detector.update(bool(m))
            if detector.drift_detected:
                found += 1
                detector = self.detector = self._make()  # the next drift is measured from here
        return found


def learner_report(learner) -> dict:
    """What /model shows of one model: its weights by feature name and its numbers."""
    inner = getattr(learner, "model", learner)  # Frozen, HashedPerceptron: the model they wrap
    return {
        "variant": learner.variant if hasattr(learner, "variant") else inner.variant,
        "weights": {str(k): v for k, v in learner.weights.items()},
        "bias": learner.bias,
        "version": learner.updates,
        "seen": learner.seen,
        "mistakes": learner.mistakes,
        "radius": learner.radius,
        "weight_norm": learner.weight_norm,
    }

"""Online standardisation in front of the perceptron, and the factory the service uses.

Why: a perceptron is not scale invariant.  Salary in tens of thousands beside
age in tens swamps every other feature, and R (hence the (R/γ)² bound)
explodes.  river's ``preprocessing.StandardScaler`` keeps running means and
variances; :class:`ScaledPerceptron` is ``StandardScaler() | Perceptron()``
with the perceptron's API (``step``, counters, ``to_state``), its state
including the scaler's statistics, so a checkpoint restores both.

``predict_one``/``learn_one`` behave exactly like river's pipeline (the
scaler learns in ``learn_one``; ``predict_one`` answers True/False after bool
labels, -1/+1 otherwise, like :class:`Perceptron`, and the label kind is in
the state).  ``step`` first lets the scaler see x, then predicts and learns
with the same scaled x: river's pipeline inside
``compose.learn_during_predict()``.  It uses no label, so the published
prediction is still made before learning from the label.

The scaler holds the perceptron's features, no more: an unlabeled event's
new features are left out of both (the scaler goes on learning the moments
of the features it has), and a labeled one's are those the perceptron admits
(all of them, or up to ``max_features``, the rest counted in
``dropped_features``).  A scaled feature nobody learned from would weigh 0
anyway; keeping its statistics only made the checkpoint grow.

>>> m = ScaledPerceptron()
>>> [mistake for _, _, mistake in (m.step(x, y) for x, y in [([1.0, 10.0], 1), ([3.0, 30.0], -1), ([1.0, 10.0], 1)])]
[True, True, False]
>>> ScaledPerceptron.from_state(m.to_state()).to_state() == m.to_state()
True
"""

from __future__ import annotations

import math
from typing import Any

from perceptron_stream.learning.labels import to_label
from perceptron_stream.learning.many import Steps, relabel_each, signed_labels, step_each
from perceptron_stream.learning.perceptron import Perceptron, StepResult
from perceptron_stream.learning.state import Reader as _Reader
from river import base

STATE_KIND = "scaled-perceptron"
STATE_FORMAT = 1

#: The largest magnitude of a standardised value the perceptron is given: that of the largest feature value
#: --max-feature-value allows (1e100), so the perceptron behind the scaler sees values within the bounds that keep
#: its scores finite (MAX_STATE_MAGNITUDE's reasoning), whatever the scaler holds. A standardised value is
#: (x - mean) / std, and a variance can be tiny without being 0 (values 0 and 1e-160 give 2.5e-321): a value of 1 then
#: standardises to 2e160, and a weight of 1e150 makes an infinite score. Learning never comes near it (a value the
#: scaler has just learned is within sqrt(count) standard deviations of the mean); only a forged or damaged scaler
#: state, or a frozen one (--learning off: the scaler learns nothing), does.
MAX_SCALED = 1e100
#: The largest mean and variance a scaler state read back may hold. Values within +-1e100 have means within 1e100
#: and variances within 1e200; these leave room above them and keep a mix's pooling of the moments (a sum of
#: count * (variance + mean**2), counts below 2**63) finite: a mean of 1e200 squared overflows, and the mix fails.
MAX_MEAN, MAX_VARIANCE = 1e120, 1e240
_MAX_COUNT = 1 << 63


def _clamped(value: float) -> float:
    """``value`` held within +-MAX_SCALED (infinities to the bound; a NaN, which finite inputs cannot make, to 0)."""
    if value > MAX_SCALED:
        return MAX_SCALED
    if value < -MAX_SCALED:
        return -MAX_SCALED
    return value if value == value else 0.0


class ScaledPerceptron(base.Classifier):
    """``preprocessing.StandardScaler() | Perceptron(variant, margin, max_features)`` with the perceptron's API."""

    def __init__(self, variant: str = "plain", margin: float = 0.0, max_features: int | None = None) -> None:
        self.variant = variant
        self.margin = margin
        self.perceptron = Perceptron(variant, margin, max_features)
        # Imported here: river.preprocessing imports most of river (about 1.5 s
        # of start-up), which only a model that standardises needs.
        from river.preprocessing import StandardScaler

        self.scaler = StandardScaler()

    def _scaled(self, x: dict | list) -> dict:
        """x scaled as it is now, changing nothing: only the features the scaler has seen. river's transform_one
        adds a zero mean and variance for any other (its dicts are defaultdicts), so a mere prediction would change
        the checkpointed state; such a feature scales to 0 either way, so the prediction is the same."""
        counts = self.scaler.counts
        return self._transform({k: v for k, v in _as_dict(x).items() if k in counts})

    def _floored(self, x: dict) -> None:
        """The variances of x's features that rounding left below 0 set to 0 (see :meth:`_transform`)."""
        variances = self.scaler.vars
        for k in x:
            if variances[k] < 0.0:
                variances[k] = 0.0

    def _transform(self, x: dict) -> dict:
        """x standardised by the scaler as it is, each value held within +-MAX_SCALED (see there why).

        Checked with one min and one max over the values (at 10 features about 0.4 µs beside river's 6.4 µs learn
        and transform, timeit; a sum of their magnitudes and a separate look at the variances took twice that):
        they are clamped only when one is out of bounds. A value
        is complex where the scaler's variance is below 0 (river takes its square root): Welford's update of a
        feature whose count was 0 and whose mean was not (a mix pools the others' moments into features this
        replica never saw) computes (x - old)·(x - new) with new = old + (x - old), which rounding can leave off
        x: a mean of 1e17 and a value of 1 made a variance of -1e17, and the step failed with a TypeError. min
        and max refuse to compare a complex number: those variances are set to 0 and x standardised again.
        (A NaN cannot come of finite values, finite means and variances >= 0.)
        """
        z = self.scaler.transform_one(x)
        values = z.values()
        try:
            if not values or (min(values) >= -MAX_SCALED and max(values) <= MAX_SCALED):
                return z
        except TypeError:  # a complex value: a variance below 0
            self._floored(x)
            z = self.scaler.transform_one(x)
        return {k: _clamped(v) for k, v in z.items()}

    def predict_one(self, x: dict, **kwargs: Any) -> int | bool:
        return self.perceptron.predict_one(self._scaled(x))

    def score_one(self, x: dict | list) -> float:
        """The score :meth:`step` would publish for x with the scaler as it is; changes nothing (``--learning off``
        scores by it: :class:`~perceptron_stream.pipeline.models.Frozen`)."""
        return self.perceptron.score_one(self._scaled(x))

    def learn_one(self, x: dict, y: Any, **kwargs: Any) -> None:
        """Like the pipeline's: y as the perceptron's ``learn_one`` takes it (its kind sets
        what ``predict_one`` answers in: True/False after bools, else -1/+1)."""
        label = to_label(y)  # a bad label is a ValueError before the scaler learns anything
        x = self._admitted(x, label)
        self.scaler.learn_one(x)
        self.perceptron.learn_one(self._transform(x), y)

    def step(self, x: dict | list, y: int | None) -> StepResult:
        """The scaler sees x (the features the perceptron holds or admits), then the perceptron steps on the scaled x."""
        x = self._admitted(x, y)
        self.scaler.learn_one(x)
        return self.perceptron.step(self._transform(x), y)

    def explain(self, x: dict | list) -> tuple[list[tuple], float]:
        """The parts of :meth:`score_one`'s score (the perceptron's :meth:`~Perceptron.explain` of x scaled as it
        is): each ``value`` the standardised one the perceptron saw."""
        return self.perceptron.explain(self._scaled(x))

    def explain_step(self, x: dict | list, y: int | None) -> tuple[StepResult, list[tuple], float]:
        """:meth:`step`, with the parts of its score: those of x standardised once the scaler saw it, as the
        perceptron scored it before it learned."""
        x = self._admitted(x, y)
        self.scaler.learn_one(x)
        scaled = self._transform(x)
        parts, bias = self.perceptron.explain(scaled)
        return self.perceptron.step(scaled, y), parts, bias

    def can_step_many(self, xs: list, ys: list) -> bool:
        """Whether :meth:`step_many` registers nothing: the scaler (so the perceptron) holds every feature."""
        counts = self.scaler.counts
        return signed_labels(ys) and all(all(map(counts.__contains__, _names(x))) for x in xs)

    def step_many(self, xs: list, ys: list, checked: bool = False, joins: list | None = None) -> Steps:
        """:meth:`step` of each event, as :class:`~perceptron_stream.learning.many.Steps` (``joins``: each of those
        events relabeled right after it, as ``step_each`` says). The scaler stays per event: each feature's
        running mean and variance after an event depend on those before it through rounded operations (a
        recurrence along the stream, which no reordering reproduces); it does not depend on the labels or the
        weights, so it scales the whole batch first, and the perceptron steps the scaled rows at once (a join's
        relabel scales its event's row again with the scaler as it is then: the same row). A batch with a
        feature the scaler lacks goes one event at a time (the perceptron may admit it)."""
        if not self.can_step_many(xs, ys):
            return step_each(self, xs, ys, joins)
        learn, transform = self.scaler.learn_one, self._transform
        scaled = []
        for x in xs:
            x = _as_dict(x)
            learn(x)
            scaled.append(transform(x))
        return self.perceptron.step_many(scaled, ys, True, joins)  # dicts, labels checked by can_step_many

    def relabel_many(self, xs: list, ys: list, mistakes: list[bool]) -> tuple[list[int], list[int]]:
        """:meth:`relabel` of each: with every feature held by the scaler (it learns nothing then), the perceptron's
        ``relabel_many`` of the rows scaled as they are; else one at a time."""
        if not self.can_step_many(xs, ys):
            return relabel_each(self, xs, ys, mistakes)
        transform = self._transform
        return self.perceptron.relabel_many([transform(_as_dict(x)) for x in xs], ys, mistakes)

    def relabel(self, x: dict | list, y: int, mistake: bool) -> StepResult:
        """:meth:`Perceptron.relabel` on the scaled x. The scaler saw x when it was predicted: it learns now only the
        moments of features it did not hold then (so they scale), never x twice."""
        x = self._admitted(x, y)
        new = {k: v for k, v in x.items() if k not in self.scaler.counts}
        if new:
            self.scaler.learn_one(new)
        return self.perceptron.relabel(self._transform(x), y, mistake)

    def knows_none_of(self, x: dict | list) -> bool:
        """:meth:`Perceptron.knows_none_of`: the scaler keeps the features' names."""
        return self.perceptron.knows_none_of(x)

    def _admitted(self, x: dict | list, y: int | None) -> dict:
        """x as a dict, without the new features the perceptron does not take (unlabeled, or past its cap)."""
        x = _as_dict(x)
        if all(map(self.scaler.counts.__contains__, x)):
            return x
        return self.perceptron.admit(x, y)

    @property
    def max_features(self) -> int | None:
        return self.perceptron.max_features

    @max_features.setter
    def max_features(self, value: int | None) -> None:
        self.perceptron.max_features = value

    # The perceptron's counters and stats, in the scaled space.
    seen = property(lambda self: self.perceptron.seen)
    labeled = property(lambda self: self.perceptron.labeled)
    mistakes = property(lambda self: self.perceptron.mistakes)
    updates = property(lambda self: self.perceptron.updates)
    radius = property(lambda self: self.perceptron.radius)
    weight_norm = property(lambda self: self.perceptron.weight_norm)
    weights = property(lambda self: self.perceptron.weights)
    weight_snapshot = property(lambda self: self.perceptron.weight_snapshot)
    bias = property(lambda self: self.perceptron.bias)
    dropped_features = property(lambda self: self.perceptron.dropped_features)

    def to_state(self) -> dict:
        sc = self.scaler
        return {
            "kind": STATE_KIND,
            "format": STATE_FORMAT,
            "scaler": {
                "with_std": sc.with_std,
                # [name, value] pairs: JSON object keys would turn int names into str
                "counts": [[k, v] for k, v in sc.counts.items()],
                "means": [[k, v] for k, v in sc.means.items()],
                "vars": [[k, v] for k, v in sc.vars.items()],
            },
            "perceptron": self.perceptron.to_state(),
        }

    @classmethod
    def from_state(cls, state: dict) -> ScaledPerceptron:
        """Exact inverse of :meth:`to_state`; ValueError on a wrong or corrupt state."""
        st = _Reader("scaled-perceptron state", state)
        st.header(STATE_KIND, STATE_FORMAT)
        p = Perceptron.from_state(st.get("perceptron"))
        m = cls(p.variant, p.margin, p.max_features)
        m.perceptron = p
        sc = _Reader("scaled-perceptron state scaler", st.get("scaler"))
        if sc.get("with_std") is not True:
            sc.fail("with_std must be true")
        counts, means, variances = _pairs(sc, "counts", int), _pairs(sc, "means", float), _pairs(sc, "vars", float)
        if any(v < 0 for v in counts.values()) or any(v < 0 for v in variances.values()):
            sc.fail("counts and vars must be >= 0")
        if (
            any(v >= _MAX_COUNT for v in counts.values())
            or any(abs(v) > MAX_MEAN for v in means.values())
            or any(v > MAX_VARIANCE for v in variances.values())
        ):
            sc.fail(
                f"counts must be below 2**63, means of magnitude at most {MAX_MEAN:g} and vars at most "
                f"{MAX_VARIANCE:g}",
                "non_finite",
            )
        m.scaler.counts.update(counts)
        m.scaler.means.update(means)
        m.scaler.vars.update(variances)
        return m


def _pairs(sc: _Reader, key: str, kind: type) -> dict:
    """The [name, number] pairs of ``key``: names unique, numbers finite (ints for counts)."""
    pairs = sc.get(key)
    ok = isinstance(pairs, list) and all(
        isinstance(e, list)
        and len(e) == 2
        and type(e[0]) in (str, int)
        and type(e[1]) in ((int,) if kind is int else (int, float))
        and (type(e[1]) is int or math.isfinite(e[1]))  # an int is finite (and may be too large for a float)
        for e in pairs
    )
    if not ok:
        numbers = isinstance(pairs, list) and all(  # well formed, only some numbers not finite
            isinstance(e, list) and len(e) == 2 and type(e[0]) in (str, int) and type(e[1]) in (int, float)
            for e in pairs
        )
        sc.fail(f"{key} must be a list of [name, finite number] pairs", "non_finite" if numbers else "damaged")
    out = {k: kind(v) for k, v in pairs}
    if len(out) != len(pairs):
        sc.fail(f"{key} has duplicate names")
    return out


def _as_dict(x: dict | list) -> dict:
    return dict(enumerate(x)) if isinstance(x, list) else x


def _names(x: dict | list):
    """x's features: a dict's keys, a list's positions."""
    return range(len(x)) if type(x) is list else x

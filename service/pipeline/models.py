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
  One drift, one count: a detection opens a drift *episode*, and the
  detector's further detections are not counted until it closes
  (:class:`DriftWatch` says when, and why).

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
import time
from collections import deque
from typing import Any

import orjson
from perceptron_stream.learning import learner_from_state
from perceptron_stream.learning.challengers import parse_challengers
from perceptron_stream.learning.labels import is_mistake
from perceptron_stream.learning.many import relabel_each, step_each


class Frozen:
    """A learner that predicts and counts, and never learns (``--learning off``).

    Its state is the wrapped model's as it was given: checkpoints keep it
    unchanged; the counters of what it predicted since live in memory.

    >>> from perceptron_stream.learning import Perceptron
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
        mistake = is_mistake(y, score)
        self.mistakes += mistake
        return (y_pred, score, mistake)

    def explain_step(self, x, y) -> tuple:
        """:meth:`step`, with the parts of its score (the model's ``explain``: its weights, which never move)."""
        parts, bias = self.model.explain(x)
        return self.step(x, y), parts, bias

    def can_step_many(self, xs: list, ys: list) -> bool:
        """Whether the model holds every feature of ``xs`` (its ``can_step_many``): the task's batch form then
        needs no per-event look at unknown features; the steps themselves go one at a time (a frozen model is
        the operator's exception, not the hot path)."""
        return self.model.can_step_many(xs, ys)

    def step_many(self, xs: list, ys: list, checked: bool = False, joins: list | None = None):
        return step_each(self, xs, ys, joins)

    def relabel_many(self, xs: list, ys: list, mistakes: list[bool]) -> tuple[list[int], list[int]]:
        return relabel_each(self, xs, ys, mistakes)  # (not the model's: it would learn)

    def relabel(self, x, y, mistake: bool) -> tuple:
        self.mistakes += bool(mistake)
        score = self.model.score_one(x)
        return (1 if score > 0.0 else -1, score, is_mistake(y, score))

    def __getattr__(self, name: str) -> Any:  # weights, bias, radius, to_state... of the model as it is
        return getattr(self.model, name)


class ModelSet:
    """A task's challengers (the champion is the task's learner), stepped alongside it."""

    def __init__(self, specs: list[tuple[str, str, float]], make):
        self.specs = specs
        self.make = make  # (variant, margin) -> a fresh learner, with the champion's preprocessing
        self.challengers = {name: make(variant, margin) for name, variant, margin in specs}

    #: ``averaged,pocket,margin:0.5`` → [(name, variant, margin)] (:func:`perceptron_stream.learning.challengers.parse_challengers`)
    parse = staticmethod(parse_challengers)

    def __iter__(self):
        return iter(self.specs)

    def step(self, x, y) -> dict[str, tuple]:
        return {name: c.step(x, y) for name, c in self.challengers.items()}

    def step_many(self, xs: list, ys: list, checked: bool = False, joins: list | None = None) -> dict:
        """Each challenger's ``step_many`` over the champion's events (each is exact: the same as :meth:`step`)."""
        return {name: c.step_many(xs, ys, checked, joins) for name, c in self.challengers.items()}

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


class DDM:
    """river's binary DDM (``river.drift.binary.DDM``, river 0.26), float for float, with a loop over many flags.

    Gama et al.'s Drift Detection Method: the running error rate p and its standard deviation s = √(p(1-p)/n);
    after ``warm_start`` events, the minimum of p + s is remembered, and p + s above p_min + 2 s_min is a warning,
    above p_min + 3 s_min a drift; the next update starts afresh. The same operations as river's, in the same
    order (its running mean: n += 1, mean += (1/n)(x - mean)), so the same detections (tests/pipeline checks it
    against river's on random streams). Why not river's own: one method call and a statistics object per
    mistake flag was a sixth of a plain event's own work, and ``import river.drift`` imports SciPy (+94 MiB).

    >>> ddm = DDM()
    >>> ddm.update_many([False] * 100 + [True] * 20, 0)  # the first mistake after 100 right: a drift at once
    (101, True)
    """

    def __init__(self, warm_start: int = 30, warning_threshold: float = 2.0, drift_threshold: float = 3.0):
        self.warm_start, self.warning_threshold, self.drift_threshold = warm_start, warning_threshold, drift_threshold
        self.drift_detected = self.warning_detected = False
        self._reset()

    def _reset(self) -> None:
        self.n, self.mean = 0.0, 0.0  # river's stats.Mean: the weight seen, the running mean
        self.p_min = self.s_min = 0.0  # river's None: read only once set (ps_min = inf makes the first look set them)
        self.ps_min = math.inf
        self.drift_detected = self.warning_detected = False

    def update(self, x: bool) -> None:
        """One flag (True: a mistake)."""
        self.update_many([x], 0)

    def update_many(self, flags: list, start: int) -> tuple[int, bool]:
        """Feed ``flags[start:]`` (bools) until a drift is detected: how many were fed, and whether one was.

        The levels p_min + 2 s_min and p_min + 3 s_min are computed when p_min and s_min change, not at every
        flag (the same floats), and the warning once, for the last flag fed."""
        if self.drift_detected:
            self._reset()
        n, mean, p_min, s_min, ps_min = self.n, self.mean, self.p_min, self.s_min, self.ps_min
        warm, sqrt = self.warm_start, math.sqrt
        drift_level = p_min + self.drift_threshold * s_min
        ps = None  # p + s of the last flag fed after the warm start
        fed = 0
        for fed, x in enumerate(flags[start:], 1):
            n += 1.0
            mean += (1.0 / n) * (x - mean)
            s = sqrt(mean * (1 - mean) / n)
            if n > warm:
                ps = mean + s
                if ps <= ps_min:
                    p_min, s_min, ps_min = mean, s, mean + s
                    drift_level = p_min + self.drift_threshold * s_min
                if ps > drift_level:
                    self.n, self.mean, self.p_min, self.s_min, self.ps_min = n, mean, p_min, s_min, ps_min
                    self.drift_detected, self.warning_detected = True, False
                    return fed, True
        self.n, self.mean, self.p_min, self.s_min, self.ps_min = n, mean, p_min, s_min, ps_min
        if ps is not None:
            self.warning_detected = ps > p_min + self.warning_threshold * s_min
        return fed, False


class DriftWatch:
    """river's binary DDM over a champion's mistake stream, counted in episodes: one change, one count.

    river's DDM starts afresh after a detection (its statistics are reset at
    its next update), and while the model relearns the new rule its error
    rate is unsteady: a fresh DDM whose first 30 events (its warm-up) were
    nearly all right fires again at the next few mistakes. On the demo's
    credit stream that counted one policy change as 4 drifts within a
    second. So a detection opens a **drift episode**, counted once, and
    detections during the episode are not counted. The episode ends when the
    model has settled again: at least ``window`` labeled events after the
    detection, the mistake rate of the last ``window`` is back at the level
    the detector measured before the drift (its mistakes / events from its
    start to the detection), within two standard errors of a window of that
    size (a window of 100 events is noisy: at 4 % its rate is 4 ± 2 %). The
    detector is fed all along (river restarted it at the detection); from the
    end of the episode its detections count again. A model that never gets
    back to its old level (the new rule is harder) ends the episode after
    ``limit`` events: the detector has measured the new level by then, and
    the next change is counted.

    Why this rule: tried offline on the demo's stream (13 seeds) and on a
    separable stream whose labels flip (10 seeds), it counted exactly one
    drift per change, two for a flip and a flip back 5,000 events later, and
    none on a noisy stream that does not change; the episodes lasted 150-370
    events after a flip, 800-3,700 after the demo's policy change. The
    detector's own warm-up alone (30 events) is too short: the refires came
    hundreds of events after the detection.

    >>> watch = DriftWatch(window=10, limit=50)
    >>> watch.update([False] * 200 + [True] * 30), watch.in_episode     # the first burst: one drift
    (1, True)
    >>> watch.update([True] * 20 + [False] * 30), watch.in_episode      # still relearning, then settled: no more
    (0, False)
    """

    def __init__(self, window: int = 100, limit: int = 5_000, tolerance: float = 2.0):
        self.detector = DDM()
        self.window, self.limit, self.tolerance = window, limit, tolerance
        self._seen = self._erred = 0  # the detector's events and mistakes since it (re)started: its level
        self._episode: int | None = None  # events since the detection; None: no episode open
        self._recent: deque[bool] = deque(maxlen=window)  # the episode's last `window` flags
        self._in_window = 0  # mistakes among them
        self._settled_at = 0.0  # the highest window rate that ends the episode

    @property
    def in_episode(self) -> bool:
        """A drift was counted and the model has not settled since."""
        return self._episode is not None

    def update(self, mistakes: list[bool]) -> int:
        """Feed a batch's mistake flags, in order; how many drift episodes they opened.

        Outside an episode the flags go to the detector in one loop (:meth:`DDM.update_many`) up to its next
        detection; inside one, one at a time with the episode's book-keeping.
        """
        found, i, n = 0, 0, len(mistakes)
        detector, recent = self.detector, self._recent
        while i < n:
            if self._episode is None:
                fed, drift = detector.update_many(mistakes, i)
                self._seen += fed
                self._erred += sum(map(bool, mistakes[i : i + fed]))
                i += fed
                if drift:
                    found += 1
                    self._open()
                continue
            m = bool(mistakes[i])
            i += 1
            detector.update(m)
            self._seen += 1
            self._erred += m
            self._episode += 1
            if len(recent) == self.window:
                self._in_window -= recent[0]
            recent.append(m)
            self._in_window += m
            if (
                self._episode >= self.window and self._in_window <= self._settled_at * self.window
            ) or self._episode >= self.limit:
                self._episode = None  # settled: the detector's next detection is a new drift
        return found

    def _open(self) -> None:
        level = self._erred / self._seen
        self._settled_at = level + self.tolerance * math.sqrt(level * (1.0 - level) / self.window)
        self._episode = 0
        self._recent.clear()
        self._in_window = 0
        self._seen = self._erred = 0  # the restarted detector's level, for the next drift


#: GET /model's page: weights per model in one response by default, and at most (?limit=).
REPORT_PAGE, REPORT_MAX_PAGE = 1_000, 10_000
#: A model's weights are copied again for /model at its next version, but not more often than this: a model that
#: updates on every event would otherwise be copied for every request (the report says the version they are of).
REPORT_COPY_EVERY_S = 1.0


class _Snapshot:
    """One model's weights as of one version: copied once, encoded a page at a time, each page once."""

    __slots__ = ("bias", "keys", "learner", "norm", "pages", "seen", "take", "taken_at", "version", "weights")

    def __init__(self, learner, take):
        self.learner, self.version, self.seen, self.take = learner, learner.updates, learner.seen, take
        self.taken_at = time.monotonic()
        self.keys: list = []  # the copy's, once a page is asked for (take() then None)
        self.weights: list[float] = []
        self.bias = self.norm = 0.0
        self.pages: dict[tuple[int, int], orjson.Fragment] = {}

    def page(self, offset: int, limit: int) -> orjson.Fragment:
        if self.take is not None:  # off the lock: the lists were copied under it
            self.keys, self.weights, self.bias = self.take()
            self.norm = math.hypot(self.bias, *self.weights)
            self.take = None
        key = (offset, limit)
        if key not in self.pages:
            end = offset + limit
            page = dict(zip(self.keys[offset:end], self.weights[offset:end]))
            self.pages[key] = orjson.Fragment(orjson.dumps(page, option=orjson.OPT_NON_STR_KEYS))
        return self.pages[key]


class ModelReports:
    """GET /model at most one build of a model's weights per version, and a bounded page of them per response.

    With 50,000 features the whole report was 1 MB of JSON built on every
    request, in the service's process, partly under the lock the loop steps
    the model with: 8 clients polling it halved the loop's events/s. Now:

    - under the task's lock, only the counters and, when the model's version
      (its updates; its object, for a model replaced by a mix or a restore)
      changed since the last copy, and that copy is :data:`REPORT_COPY_EVERY_S`
      old, C-speed copies of its weight lists
      (:meth:`~perceptron_stream.learning.Perceptron.weight_snapshot`, ``builds`` + 1):
      at most one copy per version, and one a second of a model that updates
      all the time (the report's ``weights_version`` says which version the
      weights are of, ``version`` the model's now);
    - off the lock, the weights of the page asked for are encoded once per
      version and page and kept; every other request of that version reuses
      the bytes;
    - paginated: a response holds at most ``limit`` weights per model (default
      :data:`REPORT_PAGE`, at most :data:`REPORT_MAX_PAGE`) from ``offset`` in
      the model's feature order (the order it first learned them), and says
      the model's ``features`` and the ``next_offset`` (null after the last
      page). A bounded response: a wide model costs no client or scraper more
      than a page.

    The averaged variant's average moves with every event, not only with an
    update: its weights are as of ``weights_seen`` events (the snapshot's),
    taken again at its next update. The other variants' weights are exact.
    """

    def __init__(self):
        self.builds = 0  # weight snapshots taken: at most one per model version (tests count them)
        self._snapshots: dict[tuple[str, str], _Snapshot] = {}

    def report(self, tasks, scope: str, learning: str, offset: int = 0, limit: int = REPORT_PAGE) -> dict:
        """The report of every model of ``tasks``: a page of each one's weights, and its numbers now."""
        models, widest = [], 0
        self.forget({task.name for task in tasks})
        for task in tasks:
            with task.lock:  # the loop steps the models under it: counters and list copies only
                learners = [("", task.learner)] + ([] if task.models is None else list(task.models.challengers.items()))
                taken = [
                    (name, learner, self._snapshot(task.name, name, learner), self._numbers(learner))
                    for name, learner in learners
                ]
            reports = {}
            for name, learner, snap, numbers in taken:
                weights = snap.page(offset, limit)
                widest = max(widest, len(snap.keys))
                variant = learner.variant if hasattr(learner, "variant") else learner.model.variant
                reports[name] = {
                    "variant": variant,
                    "weights": weights,
                    "bias": snap.bias,
                    **numbers,
                    "weight_norm": snap.norm,
                    "features": len(snap.keys),
                    "weights_version": snap.version,
                    "weights_seen": snap.seen,
                }
            models.append(
                {"task": task.name, "partition": task.partition, "champion": reports.pop(""), "challengers": reports}
            )
        return {
            "scope": scope,
            "learning": learning,
            "offset": offset,
            "limit": limit,
            "next_offset": offset + limit if offset + limit < widest else None,
            "models": models,
        }

    def _snapshot(self, task: str, name: str, learner) -> _Snapshot:
        snap = self._snapshots.get((task, name))
        if (
            snap is None
            or snap.learner is not learner
            or (snap.version != learner.updates and time.monotonic() - snap.taken_at >= REPORT_COPY_EVERY_S)
        ):
            snap = self._snapshots[(task, name)] = _Snapshot(learner, learner.weight_snapshot())
            self.builds += 1
        return snap

    @staticmethod
    def _numbers(learner) -> dict:
        return {
            "version": learner.updates,
            "seen": learner.seen,
            "mistakes": learner.mistakes,
            "radius": learner.radius,
        }

    def forget(self, live: set[str]) -> None:
        """Drop the snapshots of tasks no longer served (partitions revoked)."""
        for key in [k for k in self._snapshots if k[0] not in live]:
            del self._snapshots[key]

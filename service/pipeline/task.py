"""How is a partition processed? A task: what one model owns, and how it processes its partitions' records.

The partition is the unit of state (as in Kafka Streams and Quix Streams): in
``--model-scope partition`` every input partition has a task of its own (its
replica of the model, its decoder's fixed dimension, its position, its
mixing book-keeping), checkpointed, restored and moved with the partition;
in ``--model-scope group`` one task holds the group's one model over every
partition (the service's original behaviour).

A batch of points goes through one outline, in this order: bytes → events (the decoder,
:mod:`perceptron_stream.wire.inputs`, the one place an event is judged) → predict, then
learn (the learner's fused ``step_many`` over a span of events, or its ``step`` one event
at a time) → the predictions built and sent in record order with the dead letters among
them (:mod:`perceptron_stream.wire.outputs`) → the delayed labels' hook; the position
moves on. The batch form and the one-at-a-time reference differ only in the size of
their spans, so each part is visited once, by both.
No Kafka and no HTTP here: outputs go to a callable, and the others'
mixing states come from a :class:`~perceptron_stream.pipeline.mixer.MixBoard`.
Delayed labels are not here either: a task with a joiner hands each batch's
points and labels to one hook (:class:`~perceptron_stream.pipeline.labels.span.SpanLabels`).
"""

from __future__ import annotations

import logging
import threading
import time
from operator import attrgetter
from typing import TYPE_CHECKING

from perceptron_stream.pipeline.history import MIX, History, Recorded
from perceptron_stream.state.checkpoint import Checkpoint, CheckpointError, Owner
from perceptron_stream.wire.outputs import InRecordOrder, explained, prediction, predictions

if TYPE_CHECKING:
    from perceptron_stream.pipeline.labels.span import SpanLabels

log = logging.getLogger("perceptron_stream")
_KEY, _VALUE, _OFFSET, _PARTITION, _TOPIC = (
    attrgetter(name) for name in ("key", "value", "offset", "partition", "topic")
)


def _explains_many(learner) -> bool:
    """Whether ``learner`` (or the learner a model history records) explains a batch at once (``explain_many``:
    the variants whose running weights publish); asked of its class, never of a wrapper's ``__getattr__``."""
    inner = learner.unwrapped() if type(learner) is Recorded else learner
    return hasattr(type(inner), "explain_many")


def _largest_first(part: tuple) -> float:
    """A reason code's rank: the larger its contribution's magnitude, the earlier."""
    return -abs(part[3])


#: A batch whose spans (see Task._points) average fewer events than this goes one event at a time.
SPAN_EVENTS = 16


def _frozen(learner):
    from perceptron_stream.pipeline.models import Frozen

    return learner if isinstance(learner, Frozen) else Frozen(learner)


def partition_task(partition: int) -> str:
    """The task name of a partition's replica (``--model-scope partition``).

    >>> partition_task(3)
    'partition-3'
    """
    return f"partition-{partition}"


class Tally:
    """What one batch did, for the metrics: counted in the loop, observed once per batch."""

    __slots__ = (
        "challenger_flags",
        "delays",
        "drifts",
        "dropped",
        "flags",
        "history_bytes",
        "history_records",
        "joined",
        "label_outcomes",
        "labeled",
        "mixes",
        "rejected",
        "unknown",
        "unlabeled",
        "updates",
    )

    def __init__(self):
        # Events are the input's valid records (points), each counted once, when it is predicted: labeled (it came
        # with its y) or unlabeled. A delayed label joined later is no event: it counts in ``joined`` (and as a
        # "joined" label outcome), and its decision's mistake flag in ``flags`` beside the labeled events'.
        self.labeled = self.unlabeled = self.updates = self.dropped = 0
        self.joined = 0  # delayed labels joined with their point: decisions scored late
        self.unknown = 0  # valid events that shared no feature with a model holding some (scored by its bias alone)
        self.flags: list[bool] = []  # mistake or not, one per decision scored (labeled event, joined label), in order
        self.rejected: list[str] = []  # reasons
        self.mixes: list[int | None] = []  # partitions that mixed
        self.label_outcomes: list[
            str
        ] = []  # delayed labels: joined, unknown_id, duplicate, early; points expired, evicted
        self.delays: list[float] = []  # seconds from a point to its label, per joined label
        self.challenger_flags: dict[str, list[bool]] = {}  # challenger → its mistakes on the labeled events, in order
        self.drifts = 0  # drifts the champions' mistake streams showed
        self.history_records = self.history_bytes = 0  # the model history's records sent, and their bytes


class _Learning:
    """The task's learner through one batch, for points and labels alike: its updates and dropped features counted
    into the tally, the mix made when due (the next events are stepped by the mixed model), the drift of the
    champion's mistakes watched at the end."""

    __slots__ = ("dropped_before", "flags_before", "learner", "replica", "tally", "task", "updates_before")

    def __init__(self, task: Task, tally: Tally):
        self.task, self.tally, self.flags_before = task, tally, len(tally.flags)
        self.replica: dict | None = None  # the model fields an output carries beside its counters
        if task.partition is not None:
            mixes = 0 if task.mixer is None else task.mixer.mixes
            self.replica = {"scope": "partition", "partition": task.partition, "mixes": mixes}
        if task.history is not None:  # the run its version belongs to (the model history)
            self.replica = {**(self.replica or {}), "run": task.history.run}
        self._from(task.learner)

    def _from(self, learner) -> None:
        self.learner, self.updates_before, self.dropped_before = learner, learner.updates, learner.dropped_features

    def _count(self) -> None:
        self.tally.updates += self.learner.updates - self.updates_before
        self.tally.dropped += self.learner.dropped_features - self.dropped_before

    def mix(self, send):
        """Replace the task's weights by the mix (its mixer said it ``learned()`` enough); the mixed learner."""
        self._count()
        task = self.task
        self._from(task.mixed(task.mixer.mix(task, send, time.time())))
        self.tally.mixes.append(task.partition)
        return self.learner

    def stamp(self) -> None:
        """The replica's number of mixes, as an output made now carries it."""
        if self.task.mixer is not None and self.replica is not None:
            self.replica["mixes"] = self.task.mixer.mixes

    def passed(self, r, learned: bool, send) -> None:
        """Record ``r`` processed: the position moves past it; the mix made when it ``learned`` and one is due."""
        task = self.task
        task.positions[(r.topic, r.partition)] = r.offset + 1
        if learned and task.mixer is not None and task.mixer.learned():
            self.mix(send)

    def end(self) -> None:
        """The batch processed (inside the task's lock): its updates and dropped features counted."""
        self._count()

    def drift(self) -> None:
        """The drifts the batch's mistakes showed (after the lock)."""
        if self.task.drift is not None:
            self.tally.drifts += self.task.drift.update(self.tally.flags[self.flags_before :])


class Task:
    """One model and what goes with it: learner, decoder (its fixed dimension), positions, checkpoint seq.

    ``partition`` is None for the group's model; a replica's predictions carry
    its partition and mixes. ``mixer`` (a replica with ``--mix-every``) mixes
    its weights with the others' every so many events learned.
    """

    def __init__(
        self,
        name: str,
        owner: Owner,
        learner,
        decoder,
        meta: dict,
        *,
        outputs: dict,
        partition: int | None = None,
        mixer=None,
        joiner=None,
        models=None,
        drift=None,
        frozen: bool = False,
        explain: int = 0,
        history: History | None = None,
        challenger_histories: dict[str, History] | None = None,
    ):
        self.name, self.owner, self.meta = name, owner, meta
        self.history = history  # --model-history-topic: the model's changes, to rebuild any version it predicted with
        self.challenger_histories = challenger_histories or {}  # --history-challengers: each challenger's, by name
        self.learner, self.decoder = learner, decoder
        self.partition, self.mixer, self.joiner = partition, mixer, joiner
        self.models, self.drift, self.frozen = models, drift, frozen  # challengers, DDM, --learning off
        self.outputs = outputs  # output_topic, dlq_topic, max_message_bytes
        self.explain = explain  # --explain K: each prediction with its K largest reason codes (0: none)
        self.positions: dict[tuple[str, int], int] = {}
        self.seq = 0  # the last checkpoint's (written or restored)
        self.unsaved = 0  # events processed since it
        self.started_over = False  # --start-over set another model's state aside: committed offsets are not ours
        self.told_unknown = False  # the log said once that events share no feature with the model, and what to do
        self.lock = threading.Lock()  # the HTTP thread reads the model (/model) while the loop steps it

    @property
    def learner(self):
        """The task's champion: with a model history, recorded (:class:`~perceptron_stream.pipeline.history.Recorded`)."""
        return self._learner

    @learner.setter
    def learner(self, learner) -> None:
        """A model restored, warm-started or made: with a history, a new run begins at the next batch."""
        if self.history is not None:
            self.history.restart()
            learner = Recorded(learner, self.history)
            for history in self.challenger_histories.values():  # (restored or made with it: in the same run)
                history.restart()
        self._learner = learner

    def _begin_challengers(self, run: str) -> None:
        """Each recorded challenger's history begins the champion's ``run``, counting the champion's events."""
        if self.models is None:
            return
        seen = self._learner.seen
        for name, history in self.challenger_histories.items():
            challenger = Recorded(self.models.challengers[name], history)
            self.models.challengers[name] = challenger
            history.begin(challenger, run, seen - challenger.seen)

    def mixed(self, learner):
        """The mix's learner replaces the replica's: the history keeps its state (the run goes on)."""
        if self.history is not None:
            learner = Recorded(learner, self.history)
            self.history.state(learner, MIX)
        self._learner = learner
        return learner

    # processing -----------------------------------------------------------
    def process(self, records, send, tally: Tally, each: bool = False) -> None:
        """Decode, predict-then-learn and publish each record, in order; positions move past them.

        A batch at once where it can be: decoded by a few msgspec calls, stepped by the learner's ``step_many``,
        its predictions built in one pass; the same outputs, in the same order, and the same model as one record
        at a time (``each``: :meth:`process_each`, the reference; tests/pipeline/test_task.py checks).
        """
        with self.lock:
            history = self.history
            if history is not None and history.run is None:
                self._begin_challengers(history.begin(self._learner))
            run = _Learning(self, tally)
            labels = None if self.joiner is None else self.joiner.span(send, tally, run.replica, self.models)
            if labels is None or records[0].topic != self.outputs.get("label_topic"):
                self._points(run, labels, records, send, tally, each)
            else:
                labels.labels(records, run, each=each or self.mixer is not None)  # (a mix may come after any join)
            run.end()
            if history is not None:  # after the batch's outputs, through the same send (its transaction)
                tally.history_records, tally.history_bytes = history.send(send, self._learner)
                for name, theirs in self.challenger_histories.items():
                    count, size = theirs.send(send, self.models.challengers[name])
                    tally.history_records += count
                    tally.history_bytes += size
            self.unsaved += len(records)
        run.drift()

    def process_each(self, records, send, tally: Tally) -> None:
        """:meth:`process` one record at a time, each decoded on its own: the reference the batch form equals."""
        self.process(records, send, tally, each=True)

    def _points(self, run: _Learning, labels: SpanLabels | None, records, send, tally: Tally, each: bool) -> None:
        """A batch of points, in one outline for both forms: decoded; then span by span, learned (the learner's
        ``step_many`` over a span, or its ``step`` over a span of one event), the predictions built, sent in record
        order with the dead letters among them (:class:`~perceptron_stream.wire.outputs.InRecordOrder`), and the
        points handed to the labels' hook (kept, or joined with their label that came first); a mix made where
        one is due. Written once, so that the batch form cannot drift from the reference.

        The span is the batch when it is one partition's, and the champion steps its events without registering
        a feature (``can_step_many``: then none is unknown to it either, so the per-event look at that has
        nothing to say): the joins of its points whose label waited (the hook's ``waiting``) learned in the same
        pass, each right after its point, as the hook's ``published`` learns it one at a time. With mixing, a
        span ends where a mix is due and after each join (a mix may follow any learning event), and a batch of
        many short spans goes one event at a time; so does everything ``each`` (the reference).
        """
        decoded = self.decoder.decode_many(list(map(_VALUE, records)), list(map(_KEY, records)), each)
        ids, xs, ys, at, rejected = decoded
        at = range(len(records)) if at is None else at
        n, mixer, models, positions = len(xs), self.mixer, self.models, self.positions
        one_partition = len(set(map(_PARTITION, records))) == 1 and len(set(map(_TOPIC, records))) == 1
        explain = self.explain  # reason codes: of a learner that explains a batch at once, else one at a time
        many = (
            not each
            and n > 0
            and one_partition
            and run.learner.can_step_many(xs, ys)
            and (not explain or _explains_many(run.learner))
        )
        cuts: list = []  # (event, label's y) of the points whose label waits
        if many and labels is not None:
            cuts = labels.waiting(records[0].partition, ids, ys)
            many = (mixer is None or len(cuts) * SPAN_EVENTS <= n) and not (explain and cuts)
        out = InRecordOrder(records, rejected, send, self.outputs, tally.rejected)
        start, unknown = 0, None
        while start < n:
            learner, replica = run.learner, run.replica
            # learn
            if many:
                if mixer is None:
                    end, joins = n, [(i - start, y) for i, y in cuts]
                else:
                    end = cuts[0][0] + 1 if cuts else n
                    learning = [i for i in range(start, end) if ys[i] is not None] + [i for i, _ in cuts[:1]]
                    if len(learning) >= max(1, mixer.every - mixer.since):
                        end = learning[max(1, mixer.every - mixer.since) - 1] + 1  # ends with the event making it due
                    joins = [(i - start, y) for i, y in cuts if i < end]
                cuts = [(i, y) for i, y in cuts if i >= end]
                span_xs, span_ys = xs[start:end], ys[start:end]
                if explain:  # (no joins: cuts sent the batch one at a time)
                    steps, reasons = learner.explain_many(span_xs, span_ys, explain)
                else:
                    steps = learner.step_many(span_xs, span_ys, True, joins)  # (can_step_many checked the kinds)
                    reasons = None
                others = None if models is None else models.step_many(span_xs, span_ys, True, joins)
                labeled = len(span_ys) - span_ys.count(None)
                tally.labeled += labeled
                tally.unlabeled += len(span_ys) - labeled
                if labeled or joins:  # the joins' counted here too, in order (the labels' hook counts the rest)
                    tally.flags.extend(steps.flags())
                    for name, theirs in (others or {}).items():
                        tally.challenger_flags.setdefault(name, []).extend(theirs.flags())
            else:
                end, x, y = start + 1, xs[start], ys[start]
                if learner.knows_none_of(x):  # before the step: a labeled event would add its features
                    tally.unknown += 1
                    if not self.told_unknown:  # said once the batch is sent, of the model this event found
                        self.told_unknown, unknown = True, (list(learner.weights), x)
                if explain:
                    (y_pred, score, mistake), parts, bias = learner.explain_step(x, y)
                else:
                    y_pred, score, mistake = learner.step(x, y)
                others = None if models is None else models.step(x, y)  # stepped on the same events
                if y is None:
                    tally.unlabeled += 1
                else:
                    tally.labeled += 1
                    tally.flags.append(mistake)
                    for name, (_, _, m) in (others or {}).items():
                        tally.challenger_flags.setdefault(name, []).append(m)
            if mixer is not None and replica is not None:
                replica["mixes"] = mixer.mixes
            # build, send, hand to the labels' hook
            if many:
                span_at, span_ids = at[start:end], ids[start:end]
                last = records[span_at[-1]]
                built = predictions(
                    span_ids,
                    last.topic,
                    last.partition,
                    [records[i].offset for i in span_at],
                    steps.y_pred,
                    steps.score,
                    span_ys,
                    steps.mistake,
                    steps.updates,
                    steps.seen,
                    steps.mistakes,
                    replica,
                    reasons,
                )
            else:
                last = records[at[start]]
                value = prediction(
                    ids[start],
                    last.topic,
                    last.partition,
                    last.offset,
                    y_pred,
                    score,
                    y,
                    mistake,
                    learner.updates,
                    learner.seen,
                    learner.mistakes,
                    replica,
                )
                if explain:  # the largest parts first; sorted is stable: ties in the event's order
                    value = explained(value, sorted(parts, key=_largest_first)[:explain], bias)
            if not many:
                out.prediction(at[start], last.key, value)
            elif labels is None:
                out.predictions(span_at, built)
            learned = False  # (one event: its join, the label having come first)
            if labels is not None:
                if many:  # sends them (each point's join after it) with the dead letters among them
                    labels.published_many(
                        records,
                        span_at,
                        span_ids,
                        span_xs,
                        span_ys,
                        steps,
                        others,
                        joins,
                        built,
                        out.topic,
                        out.letters_before,
                    )
                elif y is None:  # kept until its label comes, or joined with one that came first
                    learned = labels.published(last, ids[start], x, y_pred, score, learner, others)
            positions[(last.topic, last.partition)] = last.offset + 1
            # mix when due
            if mixer is not None:
                if many:
                    learned_many = len(joins) + sum(1 for y in span_ys if y is not None)
                    if learned_many:
                        mixer.since += learned_many - 1
                        if mixer.learned():
                            run.mix(send)
                elif (y is not None or learned) and mixer.learned():
                    run.mix(send)
            start = end
        out.finish()  # (the letters after the last event)
        if one_partition:
            positions[(records[0].topic, records[0].partition)] = records[-1].offset + 1
        else:
            for r in records:
                positions[(r.topic, r.partition)] = r.offset + 1
        if labels is not None:
            labels.points_done(records)
        if unknown is not None:
            self._tell_unknown(*unknown)

    def _tell_unknown(self, features: list, x) -> None:
        """Say once, with the way out, that an event (``x``) shares no feature with the model (``features``, as it
        found them): the usual cause is a model trained on one form of input (names, or dense positions) served
        events of the other."""
        shown = ", ".join(map(repr, features[:5])) + (", ..." if len(features) > 5 else "")
        if type(x) is list and all(type(f) is str for f in features):
            fix = (
                'this event is dense ({"x": [...]}: features 0..d-1) and the model\'s features are names: send '
                '{"features": {name: value}} events, or train the model on dense x (train --dense for a CSV)'
            )
        elif type(x) is not list and all(type(f) is int for f in features):
            fix = (
                'this event names its features ({"features": {...}}) and the model\'s are positions of dense x: send '
                '{"x": [...]} events in the model\'s order, or train the model on named features (train without --dense)'
            )
        else:
            names = ", ".join(map(repr, list(x)[:5])) if type(x) is not list else f"positions 0..{len(x) - 1}"
            fix = f"the event's features ({names}) are none of them: check the names the producers send"
        log.warning(
            "%s: an event shares no feature with the model (%d features: %s), so the model scores it by its bias "
            "alone; %s. Counted in perceptron_events_without_known_features_total; said once.",
            self.name,
            len(features),
            shown,
            fix,
        )

    # checkpoints ----------------------------------------------------------
    def snapshot(self) -> Checkpoint:
        """The next checkpoint of this task (taken once every output of its events was acknowledged)."""
        with self.lock:
            return Checkpoint(
                seq=self.seq + 1,
                positions=dict(self.positions),
                model=self.learner.to_state(),
                dimension=self.decoder.dimension,
                meta=self.meta,
                created=time.time(),
                owner=self.owner,
                task={
                    **({} if self.mixer is None else self.mixer.to_state()),
                    **({} if self.joiner is None else {"labels": self.joiner.to_state()}),
                    **({} if self.models is None else {"challengers": self.models.to_state()}),
                },
            )

    def fresh(self) -> None:
        """No checkpoint restored (a new model, or started over): its first checkpoint is seq + 1."""
        if self.joiner is not None:
            self.joiner.fresh(self.seq)

    def before_save(self, cp: Checkpoint, into=None) -> None:
        """What must be durable before ``cp`` is (the Kafka store's pending changelog); ``into``: the stream whose
        open transaction commits ``cp`` (exactly-once), which the changelog's records join."""
        if self.joiner is not None:
            self.joiner.before_save(cp.seq, into)

    def saved(self, cp: Checkpoint, learned: int | None = None) -> None:
        """``cp`` is written; ``learned``: the events it covers (None: all processed so far), those processed since
        its snapshot stay unsaved (a checkpoint written off the loop, runtime/checkpointer.py)."""
        self.seq = cp.seq
        self.unsaved = 0 if learned is None else max(0, self.unsaved - learned)
        if self.joiner is not None:
            self.joiner.saved(cp.seq)

    def restore(self, cp: Checkpoint, learner) -> None:
        """Take checkpoint ``cp`` (its model already rebuilt as ``learner``)."""
        with self.lock:
            self.learner = _frozen(learner) if self.frozen else learner
            if self.models is not None:
                try:
                    fresh = self.models.restore(cp.task.get("challengers", {}))
                except ValueError as exc:
                    raise CheckpointError(f"the checkpoint's challengers cannot be read: {exc}") from None
                if fresh:
                    log.info(
                        "challenger(s) %s not in checkpoint %d of %s: they start from zero weights",
                        ", ".join(fresh),
                        cp.seq,
                        self.name,
                    )
            self.decoder.dimension = cp.dimension
            self.positions = dict(cp.positions)
            self.seq = cp.seq
            self.unsaved = 0
            if self.mixer is not None:
                self.mixer.restore(cp.task)
            if self.joiner is not None:
                # a partition read on either side has a table (labels alone, before their points, leave early rows)
                sides = (self.owner.input_topic, self.outputs.get("label_topic"))
                partitions = sorted({p for t, p in cp.positions if t in sides})
                self.joiner.restore(cp.seq, cp.task.get("labels", {}), partitions)


class TaskSet:
    """The tasks of this instance, found by input partition: the group's one model, or one replica per partition."""

    def __init__(self, input_topic: str, per_partition: bool):
        self.input_topic, self.per_partition = input_topic, per_partition
        self.by_partition: dict[int, Task] = {}
        self.group: Task | None = None

    def add(self, task: Task) -> None:
        if task.partition is None:
            self.group = task
        else:
            self.by_partition[task.partition] = task

    def drop(self, partition: int) -> Task | None:
        return self.by_partition.pop(partition, None)

    def for_partition(self, partition: int) -> Task | None:
        """The task that processes input partition ``partition`` (None: not restored yet, or not ours)."""
        return self.group if not self.per_partition else self.by_partition.get(partition)

    def all(self) -> list[Task]:
        # list() of the items first: one C call, so the HTTP thread (/model) may read while the loop adds and drops
        return [self.group] if self.group is not None else [task for _, task in sorted(list(self.by_partition.items()))]

"""The model history (``--model-history-topic``): what rebuilds the weights behind any prediction published.

A perceptron changes on its mistakes, thousands of times an hour, and a
prediction's ``model.version`` names a version nothing else keeps. The
history keeps them all, cheaply: a linear model's change on an event is the
event itself, so the history is the model's **full state now and then**
and, between them, **the events that changed it**, each replayed by the
learner's own ``step`` or ``relabel``: the same floats in the same order,
so a rebuilt model is the one that predicted, to the last bit.

Records (JSON, keyed ``{group}/{task}``; written by :class:`History`):

- ``{"kind": "state", "run", "op", "seen", "version", "cause", "model", "meta"}``: the learner's
  whole state (its ``to_state``) after ``op`` changes of the run, at its
  ``seen``-th event and its ``version`` (its updates), with the settings it depends on (``meta``: a model
  file of a version carries them); ``cause`` ``start`` (a task's first batch after it was made,
  restored or warm-started), ``snapshot`` (once ``--history-snapshot-every``
  versions, or as many changes, passed since the last state) or ``mix`` (partition scope: the mixed weights
  replace the replica's). A state longer than a record may be (:data:`STATE_PART_BYTES`, or the topic's
  ``max.message.bytes`` if lower) has ``"model": null``, its ``parts`` and
  their ``sha256``, and follows as ``{"kind": "part", "run", "op", "seen", "cause", "part", "data"}`` records
  (base64).
- ``{"kind": "changes", "run", "op", "version", "changes": [[kind, seen, version, x, y], ...]}``:
  the changes from the run's ``op``-th on, in order: ``"s"`` a step (the
  event ``x`` as the decoder gave it, names or a dense list, its label ``y``),
  ``"j"`` a delayed label's join (``relabel``); ``seen`` and ``version`` the
  learner's count of events and of updates after it (the record's
  ``version``: its last change's).
- ``{"kind": "gap", "run", "op", "seen", "version", "why"}``: a change left out, one event larger than a
  record of the history's topic may be; the versions from it to the next state (the batch's end writes one)
  cannot be rebuilt, and a rebuild of one says so.

Which steps are changes: every labeled step of a learner that keeps
something beside the running weights (averaged, pocket) or standardises
(its scaler moves on every event, labeled or not); for plain and margin only
the steps that updated, or registered a feature (a cap on the features is
filled in the order they came). A frozen model (``--learning
off``) never changes: its history is its start.

**A run** is one incarnation of a task: it starts where the task's model
came from (a checkpoint, a warm start, zero) and lasts until the process
stops or the partition moves. Predictions carry theirs (``model.run``).
Under at-least-once, events after the last checkpoint are learned again
after a crash, by a new run; with several partitions in group scope the
replay may interleave them otherwise, so the second copies' versions may
differ from the first's (guarantees.md). Each copy names its run, and each
run's history is its own: every published prediction is rebuilt with its
own weights.

**Signed** with ``--checkpoint-key`` (as the checkpoints are): each record
ends in ``"hmac"``, the HMAC-SHA256 of its key and its bytes without it
(:func:`sign_record`), so a record altered, forged, or moved under another
key (a champion's changes under a challenger's history, which shares its
run) is refused by a reader with the key (:func:`decode_record`). A reader
without the key reads the records as they are; the rebuilt score's check
against the published one still holds.

**Rebuilding** (:func:`rebuild`) the model that predicted event ``seen = S``
of run ``R``: the run's last state with seen ≤ S − 1, then its changes with
seen ≤ S − 1, in ``op`` order. The result is checked by the caller against
the score the prediction published (``perceptron-stream explain``): a history
that lost or altered a change gives another score, and is refused as such.

>>> from perceptron_stream.learning import Perceptron
>>> history = History(b"g/model", snapshot_every=100)
>>> learner = Recorded(Perceptron(), history)
>>> run = history.begin(learner)
>>> [learner.step(x, y)[1] for x, y in [([1.0, 2.0], 1), ([1.0, 2.0], 1), ([-1.0, 0.5], 1)]]
[0.0, 6.0, 1.0]
>>> records = [decode_record(value) for value in history.take()]
>>> [r["kind"] for r in records], records[1]["changes"]    # [kind, seen, version, x, y]: its first update
(['state', 'changes'], [['s', 1, 1, [1.0, 2.0], 1]])
>>> rebuild(records, history.run, seen=3).explain_step([-1.0, 0.5], None)   # as it scored the third event
((1, 1.0, None), [(0, -1.0, 1.0, -1.0), (1, 0.5, 2.0, 1.0)], 1.0)
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import secrets
from typing import Any

import numpy as np
import orjson
from perceptron_stream.learning import learner_from_state
from perceptron_stream.pipeline.models import Frozen

log = logging.getLogger(__name__)

#: A history record is at most this long, or its topic's limit (``max.message.bytes``) if smaller: a full state
#: longer is written in parts after its record, each base64 in a record of its own (a model of 50,000 named
#: features is ~1.5 MB of JSON, past the brokers' default 1 MB limit); a changes record longer is cut in halves.
STATE_PART_BYTES = 256 * 1024

#: A part record's bytes beside its data (kind, run, op, seen, cause, part; a run is 16 characters).
_PART_FRAME_BYTES = 256

#: What a signature adds to a record: ``,"hmac":"<64 hex digits>"`` before its closing brace.
SIGNATURE_BYTES = len(b',"hmac":""') + 64

#: The cause of a full state in the history.
START, SNAPSHOT, MIX = "start", "snapshot", "mix"

#: Changes per ``changes`` record at most; a record longer than a record may be is cut in halves (wide
#: events), down to one change a record.
CHANGES_PER_RECORD = 500


def history_key(group_id: str, task: str) -> bytes:
    """The key of a task's history records.

    >>> history_key("credit", "partition-3")
    b'credit/partition-3'
    """
    return f"{group_id}/{task}".encode()


def challenger_key(group_id: str, task: str, challenger: str) -> bytes:
    """The key of a challenger's history records (``--history-challengers``): beside its champion's.

    >>> challenger_key("credit", "model", "margin:0.5")
    b'credit/model/margin:0.5'
    """
    return history_key(group_id, task) + b"/" + challenger.encode()


def _changes_on(learner) -> tuple[Any, str]:
    """The innermost perceptron of ``learner`` (whose counters say whether a step changed it), and which of its
    steps change its state beyond them: ``"every"`` event (a scaler moves on each, labeled or not), ``"labeled"``
    (averaged and pocket keep sums or a run beside the weights), or ``"some"`` (plain and margin: the updates)."""
    every = "some"
    while True:
        if hasattr(learner, "scaler"):
            every, learner = "every", learner.perceptron
        elif hasattr(learner, "model"):  # hashing's and a frozen model's wrapped one
            learner = learner.model
        else:
            keeps = getattr(learner, "_keeps", False)  # a variant says it of itself (learning/perceptron.py)
            return learner, ("labeled" if every == "some" and keeps else every)


def _mac(signing_key: bytes, key: bytes, unsigned: bytes) -> str:
    """The HMAC-SHA256 of a record's Kafka ``key`` and its ``unsigned`` bytes (the key's length first: no record can
    be read as another key's)."""
    return hmac.new(signing_key, len(key).to_bytes(4, "big") + key + unsigned, hashlib.sha256).hexdigest()


def sign_record(record: bytes, key: bytes, signing_key: bytes) -> bytes:
    """``record`` (a JSON object's bytes) with its signature as its last member, ``"hmac"``. The bytes as written are
    signed, and checked as read: a checkpoint's signature (:mod:`perceptron_stream.state.checkpoint`) is over a
    canonical encoding of its body, which here would encode every record a second time, on the loop.

    >>> signed = sign_record(b'{"kind":"gap"}', b"g/model", b"k" * 16)
    >>> signed[:22], len(signed) - len(b'{"kind":"gap"}') == SIGNATURE_BYTES
    (b'{"kind":"gap","hmac":"', True)
    """
    return b'%s,"hmac":"%s"}' % (record[:-1], _mac(signing_key, key, record).encode())


def _verified(value: bytes, key: bytes, signing_key: bytes) -> None:
    """Nothing, when ``value`` is a record of ``key`` signed with ``signing_key``; else HistoryError."""
    tail_bytes = SIGNATURE_BYTES + 1  # with the closing brace
    head, tail = value[:-tail_bytes], value[-tail_bytes:]
    if not (len(value) > tail_bytes and tail.startswith(b',"hmac":"') and tail.endswith(b'"}')):
        raise HistoryError("a history record is not signed, and --checkpoint-key is set: written without it, or forged")
    if not hmac.compare_digest(tail[9:-2], _mac(signing_key, key, head + b"}").encode()):
        raise HistoryError(
            "a history record's signature does not match: written with another --checkpoint-key, altered, or moved "
            "from another model's history"
        )


class History:
    """One task's history: its run, the changes since the last state, and the records not yet sent (each signed with
    ``signing_key``: --checkpoint-key, if set)."""

    def __init__(
        self,
        key: bytes,
        snapshot_every: int,
        topic: str = "",
        meta: dict | None = None,
        max_record_bytes: int = 0,
        signing_key: bytes | None = None,
    ):
        self.key, self.snapshot_every, self.topic = key, snapshot_every, topic
        self.signing_key = signing_key
        # the longest record value: STATE_PART_BYTES, or less where the topic's limit (key + value) is lower; less
        # its signature's bytes, if signed
        self.room = STATE_PART_BYTES if max_record_bytes <= 0 else min(STATE_PART_BYTES, max_record_bytes - len(key))
        self.room -= 0 if signing_key is None else SIGNATURE_BYTES
        if self.room < 4 * _PART_FRAME_BYTES:
            raise ValueError(f"a history record of {self.room} bytes at most holds nothing (the topic's limit)")
        self.meta = meta or {}  # the settings the model depends on (a model file of a version carries them)
        self.run: str | None = None  # None: a new run begins at the task's next batch
        self.op = 0  # changes recorded in this run
        self.since_state = 0  # changes since the run's last full state
        self.version_at_state = 0  # the version of the run's last full state
        self.changes: list[list] = []  # not yet in a record
        self.records: list[bytes] = []  # made, not yet sent
        self.gaps = 0  # changes too large for a record of the topic: left out, each said by a gap record
        # added to each seen recorded: a challenger's history counts the champion's events (its own count may differ:
        # one a checkpoint lacked starts from zero), so that a prediction's seen finds both
        self.shift = 0

    def restart(self) -> None:
        """The task's model was replaced (restored, warm-started): a new run begins at its next batch."""
        self.run, self.changes = None, []

    def begin(self, learner, run: str | None = None, shift: int = 0) -> str:
        """A new run, from ``learner`` as it is: its start state; the run. A challenger's history takes its
        champion's ``run``, and counts its events as the champion does (``shift``: the champion's count less its
        own)."""
        self.run = began = run or secrets.token_hex(8)
        self.op, self.since_state, self.changes, self.shift = 0, 0, [], shift
        self.state(learner, START)
        return began

    def state(self, learner, cause: str) -> None:
        """``learner``'s full state now, after the changes recorded so far; a large one in parts
        (longer than a record may be: :data:`STATE_PART_BYTES` or the topic's limit) after its record."""
        self._cut()
        model = orjson.dumps(learner.to_state())
        where = {"run": self.run, "op": self.op, "seen": learner.seen + self.shift}
        header = {"kind": "state", **where, "version": learner.updates, "cause": cause, "meta": self.meta}
        whole = orjson.dumps({**header, "model": orjson.Fragment(model)})
        if len(whole) <= self.room:
            self._add(whole)
        else:  # base64 makes 4 bytes of 3
            size = (self.room - _PART_FRAME_BYTES) // 4 * 3
            parts = [model[i : i + size] for i in range(0, len(model), size)]
            digest = hashlib.sha256(model).hexdigest()
            self._add(orjson.dumps({**header, "model": None, "parts": len(parts), "sha256": digest}))
            for i, part in enumerate(parts):
                data = base64.b64encode(part).decode()
                self._add(orjson.dumps({"kind": "part", **where, "cause": cause, "part": i, "data": data}))
        self.since_state, self.version_at_state = 0, learner.updates

    def step(self, seen: int, version: int, x: Any, y: int | None) -> None:
        """A step that changed the model: its learner's ``seen`` after it (counted as the champion's), ``version``."""
        self.changes.append(["s", seen + self.shift, version, x, y])

    def join(self, seen: int, version: int, x: Any, y: int) -> None:
        """A delayed label's join, as :meth:`step`."""
        self.changes.append(["j", seen + self.shift, version, x, y])

    def send(self, send, learner) -> tuple[int, int]:
        """The records made so far sent through ``send`` (the task's: in its transaction under exactly-once): how
        many, and their bytes (keys and values)."""
        records = self.take(learner)
        for value in records:
            send(self.topic, self.key, value)
        return len(records), len(self.key) * len(records) + sum(map(len, records))

    def take(self, learner=None) -> list[bytes]:
        """The records made since the last take (the changes cut into records; a snapshot of ``learner`` once
        ``--history-snapshot-every`` versions, or as many changes, passed since the last state, or after a gap),
        in order."""
        gaps = self.gaps
        self._cut()
        if learner is not None and (
            self.gaps != gaps
            or learner.updates - self.version_at_state >= self.snapshot_every
            or self.since_state >= self.snapshot_every
        ):
            self.state(learner, SNAPSHOT)  # after a gap: the versions from here on can be rebuilt again
        records, self.records = self.records, []
        return records

    def _add(self, record: bytes) -> None:
        """``record`` to be sent, signed if the history is."""
        self.records.append(record if self.signing_key is None else sign_record(record, self.key, self.signing_key))

    def _cut(self) -> None:
        changes, self.changes = self.changes, []
        for start in range(0, len(changes), CHANGES_PER_RECORD):
            self._record(changes[start : start + CHANGES_PER_RECORD])

    def _record(self, part: list[list]) -> None:
        """``part`` as one changes record, or halves of it while it is longer than a record may be (events of a
        thousand features each: 500 of them would pass the brokers' 1 MB). One change alone too long (an event
        larger than the history topic takes) is left out, and a ``gap`` record says so: the versions after it
        cannot be rebuilt until the next state, which the batch's end writes."""
        record = orjson.dumps(
            {"kind": "changes", "run": self.run, "op": self.op, "version": part[-1][2], "changes": part}
        )
        if len(record) > self.room:
            if len(part) > 1:
                self._record(part[: len(part) // 2])
                self._record(part[len(part) // 2 :])
                return
            _, seen, version, _, _ = part[0]
            why = f"a change of {len(record)} bytes, longer than a record of topic {self.topic or '?'} may be"
            record = orjson.dumps(
                {"kind": "gap", "run": self.run, "op": self.op, "seen": seen, "version": version, "why": why}
            )
            self.gaps += 1
            log.error("the model history left out its change at version %s (event %s): %s", version, seen, why)
        self._add(record)
        self.op += len(part)
        self.since_state += len(part)


class Recorded:
    """A learner whose changes go into a :class:`History`; everything else is the learner's own.

    Only the methods that learn are its own (``step``, ``explain_step``, ``step_many``, ``relabel``,
    ``relabel_many``); the rest (counters, ``to_state``, ``explain``...) reach the learner unchanged.
    """

    __slots__ = ("every", "frozen", "history", "inner", "labeled", "learner")

    def __init__(self, learner, history: History):
        if isinstance(learner, Recorded):
            learner = learner.unwrapped()
        self.learner: Any = learner
        self.history = history
        self.frozen = isinstance(learner, Frozen)  # never changes: nothing to record
        self.inner, changes = _changes_on(learner)
        self.every, self.labeled = changes == "every", changes == "labeled"

    def __getattr__(self, name: str) -> Any:
        return getattr(self.learner, name)

    def unwrapped(self):
        """The learner itself."""
        return self.learner

    # What the task reads at every event, delegated in one call: __getattr__ comes only after a failed lookup,
    # which cost the one-at-a-time path (--explain) ~10 µs an event in all (bench/README.md, the model history).
    @property
    def updates(self) -> int:
        return self.learner.updates

    @property
    def seen(self) -> int:
        return self.learner.seen

    @property
    def mistakes(self) -> int:
        return self.learner.mistakes

    @property
    def dropped_features(self) -> int:
        return self.learner.dropped_features

    def knows_none_of(self, x) -> bool:
        return self.learner.knows_none_of(x)

    def can_step_many(self, xs: list, ys: list) -> bool:
        return self.learner.can_step_many(xs, ys)

    def step(self, x, y):
        return self._stepped(self.learner.step, x, y)

    def explain_step(self, x, y):
        return self._stepped(self.learner.explain_step, x, y)

    def _stepped(self, step, x, y):
        """The learner's ``step`` (or ``explain_step``); recorded when it changed the model: every step of a learner
        that moves on each (``every``), each labeled one of averaged and pocket (``labeled``), else (plain,
        margin) one that updated or registered a feature (a feature the cap dropped changes nothing a replay
        needs)."""
        if self.frozen:
            return step(x, y)
        inner = self.inner
        updates, features = inner.updates, len(inner.feature_index)
        result = step(x, y)
        if (
            self.every
            or (self.labeled and y is not None)
            or inner.updates != updates
            or len(inner.feature_index) != features
        ):
            self.history.step(self.learner.seen, inner.updates, x, y)
        return result

    def step_many(self, xs: list, ys: list, checked: bool = False, joins: list | None = None):
        """The learner's ``step_many``; its changes read from the steps' columns (the batch form registers no
        feature: ``can_step_many``), each join right after its event's step (its version from the steps'
        ``joined`` counters)."""
        if self.frozen:
            return self.learner.step_many(xs, ys, checked, joins)
        before = self.inner.updates
        steps = self.learner.step_many(xs, ys, checked, joins)
        if not joins:
            self._changed_many(xs, ys, before, steps)
            return steps
        history, every, labeled = self.history, self.every, self.labeled
        joined: dict[int, list] = {}
        for (i, y), counters in zip(joins or (), steps.joined):
            joined.setdefault(i, []).append((y, counters[0]))
        updates, seen = _column(steps.updates), _column(steps.seen)
        for i, (x, y) in enumerate(zip(xs, ys)):
            if every or (labeled and y is not None) or updates[i] != before:
                history.step(seen[i], updates[i], x, y)
            before = updates[i]
            for label, version in joined.get(i, ()):
                history.join(seen[i], version, x, label)
                before = version
        return steps

    def explain_many(self, xs: list, ys: list, k: int):
        """The learner's ``explain_many`` (its steps and each event's reasons), its changes recorded as
        :meth:`step_many` records them."""
        before = self.inner.updates
        steps, reasons = self.learner.explain_many(xs, ys, k)
        self._changed_many(xs, ys, before, steps)
        return steps, reasons

    def _changed_many(self, xs: list, ys: list, before: int, steps) -> None:
        """The changes of a batch without joins, from its steps' columns: the rows that changed the model, found at
        C speed (plain, margin: its updates)."""
        if self.every:
            rows: Any = range(len(xs))
        elif self.labeled:
            rows = [i for i, y in enumerate(ys) if y is not None]
        else:
            rows = np.flatnonzero(np.diff(np.asarray(steps.updates), prepend=before)).tolist()
        seen_at, version_at, shift = steps.seen, steps.updates, self.history.shift
        self.history.changes.extend(["s", int(seen_at[i]) + shift, int(version_at[i]), xs[i], ys[i]] for i in rows)

    def relabel(self, x, y: int, mistake: bool):
        result = self.learner.relabel(x, y, mistake)
        if not self.frozen:
            self.history.join(self.learner.seen, self.inner.updates, x, y)
        return result

    def relabel_many(self, xs: list, ys: list, mistakes: list[bool]):
        result = self.learner.relabel_many(xs, ys, mistakes)
        if not self.frozen:
            seen = self.learner.seen
            for x, y, version in zip(xs, ys, result[0]):
                self.history.join(seen, version, x, y)
        return result


def _column(values) -> list:
    return values.tolist() if hasattr(values, "tolist") else list(values)


def _int_or_zero(value) -> int:
    return value if type(value) is int else 0


class HistoryError(ValueError):
    """The history cannot rebuild the model asked for: what is missing or does not read."""


def decode_record(value: bytes, key: bytes = b"", signing_key: bytes | None = None) -> dict:
    """A history record read back: a JSON object of a kind this module writes (else HistoryError); with
    ``signing_key``, one signed with it as a record of ``key`` (:func:`sign_record`), else HistoryError.

    >>> signed = sign_record(b'{"kind":"gap","run":"ab","op":0}', b"g/model", b"k" * 16)
    >>> decode_record(signed, b"g/model", b"k" * 16)["kind"]
    'gap'
    >>> decode_record(signed, b"g/model/averaged", b"k" * 16)
    Traceback (most recent call last):
    ...
    perceptron_stream.pipeline.history.HistoryError: a history record's signature does not match: written with another --checkpoint-key, altered, or moved from another model's history
    """
    if signing_key is not None:
        _verified(value, key, signing_key)
    try:
        record = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise HistoryError(f"a history record is not JSON ({exc})") from None
    if not isinstance(record, dict) or record.get("kind") not in ("state", "changes", "part", "gap"):
        raise HistoryError("a history record is neither a state, a part of one, changes nor a gap")
    if not isinstance(record.get("run"), str) or type(record.get("op")) is not int:
        raise HistoryError("a history record has no run or op")
    return record


def _in_order(records: list[dict], run: str) -> list[dict]:
    """``run``'s records in ``op`` order (a state before the changes at its op; two states at one op, mixes of a
    replica whose steps between changed nothing, in the order of their ``seen``). A record written twice (a
    producer's retry) counts once; two different ones at one place are refused: the history was altered."""
    unique: dict[tuple, dict] = {}
    parts: dict[tuple, dict[int, str]] = {}
    for record in records:
        if record.get("run") != run:
            continue
        if record["kind"] == "part":  # a large state's: joined to its record below
            given = parts.setdefault((record["op"], _int_or_zero(record.get("seen")), record.get("cause")), {})
            number, data = record.get("part"), record.get("data")
            if type(number) is not int or not isinstance(data, str) or given.get(number, data) != data:
                raise HistoryError(
                    f"a part of run {run}'s state at its change {record['op']} does not read, or was altered"
                )
            given[number] = data
            continue
        at = (
            record["op"],
            0 if record["kind"] == "state" else 1,
            _int_or_zero(record.get("seen")),
            record.get("cause"),
        )
        if at in unique and unique[at] != record:
            raise HistoryError(
                f"the history holds two different records of run {run} at its change {record['op']}: it was altered"
            )
        unique[at] = record
    return [_joined(unique[at], parts, run) for at in sorted(unique, key=lambda at: at[:3])]


def _joined(record: dict, parts: dict[tuple, dict[int, str]], run: str) -> dict:
    """A state written in parts, its model joined from them (checked against its digest); any other record as it is.
    A state whose parts are missing or do not check out keeps no model: a rebuild that needs it says so."""
    if record["kind"] != "state" or record.get("model") is not None or type(record.get("parts")) is not int:
        return record
    given = parts.get((record["op"], _int_or_zero(record.get("seen")), record.get("cause")), {})
    try:
        model = b"".join(base64.b64decode(given[i], validate=True) for i in range(record["parts"]))
    except (KeyError, ValueError):
        return {**record, "model": None, "missing": "some of its parts are missing"}
    if hashlib.sha256(model).hexdigest() != record.get("sha256"):
        return {**record, "model": None, "missing": "its parts do not match its digest (altered)"}
    return {**record, "model": orjson.loads(model)}


def _checked(change, run: str) -> list:
    if not (
        isinstance(change, list)
        and len(change) == 5
        and change[0] in ("s", "j")
        and type(change[1]) is int
        and type(change[2]) is int
    ):
        raise HistoryError(f"run {run}: a change does not read ({str(change)[:80]})")
    return change


def rebuild(records: list[dict], run: str, seen: int | None = None, version: int | None = None):
    """The learner of run ``run`` as it was before its event ``seen`` (after ``seen - 1`` events), or as it was
    once it reached ``version`` (the change that made it, none after), from the ``records`` of its task in any
    order (:func:`_in_order`). Its ``explain_step(x, y)`` of event ``seen`` (with the event's own label) gives the
    prediction, score and parts the service published: a scaler sees x, and admits a labeled event's new
    features, before the perceptron scores it, as in the service.
    HistoryError, naming the run and what is missing, when the records cannot rebuild it."""
    if (seen is None) == (version is None):
        raise ValueError("rebuild takes seen or version")
    wanted = f"its event {seen}" if seen is not None else f"version {version}"
    # what bounds the model wanted: a change's seen (index 1) or version (index 2), a state's field of that name
    if seen is not None:
        at, name, limit = 1, "seen", seen - 1
    else:
        assert version is not None  # (one of the two, checked above)
        at, name, limit = 2, "version", version

    def beyond(value) -> bool:
        return type(value) is not int or value > limit

    state: dict | None = None
    changes: list[list] = []
    done = False  # past the model wanted, or (version) the change that made it was taken
    lost: dict | None = None  # a gap since the state: a change left out before the model wanted
    for record in _in_order(records, run):
        if done:
            break
        if record["kind"] == "state":
            if beyond(record.get(name)):
                break
            state, changes, lost = record, [], None
            done = version is not None and record.get("version") == version
        elif state is None or record["op"] < state["op"]:
            continue
        elif record["kind"] == "gap":
            if beyond(record.get(name)):
                done = True  # the change left out came after the model wanted
            else:
                lost = record  # unless a later state (the batch's end writes one) comes before the model wanted
        elif lost is not None:
            continue
        else:
            before = state.get("version") if not changes else changes[-1][2]
            for change in record.get("changes") or ():
                change = _checked(change, run)
                if beyond(change[at]):
                    done = True
                    break
                changes.append(change)
                if version is not None and change[2] == version and before != version:
                    done = True
                    break
                before = change[2]
    if state is None:
        raise HistoryError(f"the history holds no state of run {run} at or before {wanted}")
    if lost is not None:
        raise HistoryError(
            f"the history of run {run} cannot rebuild {wanted}: its change at version {lost.get('version')} "
            f"(event {lost.get('seen')}) was left out ({lost.get('why')}); the next state rebuilds the versions "
            "after it"
        )
    if version is not None and not done and (changes[-1][2] if changes else state.get("version")) != version:
        raise HistoryError(f"the history of run {run} does not reach version {version}")
    if state.get("model") is None:
        raise HistoryError(
            f"run {run}'s state at version {state.get('version')} cannot be read: {state.get('missing', 'no model')}"
        )
    try:
        learner = learner_from_state(state["model"])
        for kind, _, _, x, y in changes:
            if kind == "s":
                learner.step(x, y)
            else:
                learner.relabel(x, y, False)
    except (ValueError, TypeError, KeyError) as exc:
        raise HistoryError(f"run {run}: the history does not replay to {wanted} ({exc})") from None
    return learner


def runs_at(records: list[dict], version: int) -> list[str]:
    """The runs whose history holds ``version`` (a state or a change that made it), in the order the records came:
    a version a crash made the service learn again (at-least-once) is in two runs, each its own model."""
    runs: dict[str, None] = {}
    for record in records:
        changes = record.get("changes") if record["kind"] == "changes" else None
        made = [c for c in changes or () if isinstance(c, list) and len(c) == 5 and c[2] == version]
        if made or (record["kind"] in ("state", "gap") and record.get("version") == version):
            runs[record["run"]] = None
    return list(runs)

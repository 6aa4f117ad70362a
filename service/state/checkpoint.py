"""The checkpoint document: whose it is, what it holds, and the checks before it is trusted.

A checkpoint is one JSON document (never pickle: a store that unpickles what
it reads lets anyone who can write to it run code). It records its *owner*
(the consumer group, the input topic and its id, the Kafka cluster's id and
the task: the whole model, or one partition's replica), the positions the
model reflects, and the model. Everything read back is input: any exception
while decoding or checking it makes the checkpoint *damaged* (an older one is
tried), never a traceback.

Integrity: a SHA-256 of the canonical body catches damage. Authenticity: with
a key (``--checkpoint-key``) an HMAC-SHA256 of the same bytes is added, and a
reader with the key refuses an unsigned or badly signed checkpoint as damaged.
Without a key, whoever can write the store can write a checkpoint: protect the
state directory and the checkpoint topic (README "Security").

>>> owner = Owner(group_id="g", input_topic="points")
>>> cp = Checkpoint(seq=3, positions={("points", 0): 17}, model={"kind": "perceptron"}, dimension=2,
...                 meta={"variant": "plain"}, owner=owner)
>>> decode_checkpoint(encode_checkpoint(cp)) == cp
True
>>> decode_checkpoint(encode_checkpoint(cp)[:-9])
Traceback (most recent call last):
...
perceptron_stream.state.checkpoint.CheckpointError: the checkpoint is not valid JSON (truncated or corrupt): ...
>>> signed = encode_checkpoint(cp, key=b"k" * 32)
>>> decode_checkpoint(signed, key=b"k" * 32) == cp
True
>>> decode_checkpoint(encode_checkpoint(cp), key=b"k" * 32)
Traceback (most recent call last):
...
perceptron_stream.state.checkpoint.SignatureError: the checkpoint is not signed, and --checkpoint-key is set: written without the key, or forged
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

log = logging.getLogger(__name__)

FORMAT = 2
#: Version 0.1's checkpoints: no owner, SHA-256 over Python's json with sorted keys.
LEGACY_FORMAT = 1
KIND = "perceptron-stream.checkpoint"
#: The largest checkpoint a store reads; a bigger file is refused without reading it.
MAX_CHECKPOINT_BYTES = 64 * 1024 * 1024
#: The task of the one model of ``--model-scope group``.
GROUP_TASK = "model"
#: How many checkpoints of a task a store keeps: the newest, and older ones to fall back to when it is damaged.
KEEP_CHECKPOINTS = 3

_INT64 = 1 << 63
_PARTITION_LIMIT = 1 << 31


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: corrupt, truncated, unsigned, or of an incompatible setup."""


class SignatureError(CheckpointError):
    """A checkpoint whose checksum holds but whose signature does not: unsigned (``unsigned``) or signed with
    another key, or forged. ``seq`` is the number it claims (not vouched for): a new model's checkpoints
    supersede it (``--start-over``)."""

    reason = "key"  # perceptron_rejected_state_total's (reason_of)

    def __init__(self, message: str, seq: int = 0, unsigned: bool = False):
        super().__init__(message)
        self.seq, self.unsigned = seq, unsigned


class KeyPolicyError(CheckpointError):
    """Every checkpoint of this model in the store fails the signature check (:class:`SignatureError`) and none is
    usable: the group runs with another ``--checkpoint-key`` policy (unsigned, or another key) than this instance.
    A bad setting, not damage: see :class:`~perceptron_stream.runtime.restore.Restorer`."""

    def __init__(self, message: str, highest_seq: int = 0, unsigned: bool = False):
        super().__init__(message)
        self.highest_seq, self.unsigned = highest_seq, unsigned


class ForeignStateError(RuntimeError):
    """The store holds checkpoints of another model (group, topic, cluster) and none of this one.

    Never used silently: the service stops naming what differs, unless told
    to start over (``--start-over``); ``highest_seq`` lets a new model's
    checkpoints supersede them.
    """

    def __init__(self, message: str, highest_seq: int = 0):
        super().__init__(message)
        self.highest_seq = highest_seq


@dataclass(frozen=True)
class Owner:
    """Whose a checkpoint is. ``cluster_id`` and ``topic_id`` are None where the brokers report none.

    >>> a = Owner("g", "points", cluster_id="c1", topic_id="t1")
    >>> a.differences(Owner("g", "points", cluster_id="c2", topic_id="t1"))
    ["the Kafka cluster's id is c2, this one's is c1"]
    """

    group_id: str
    input_topic: str
    task: str = GROUP_TASK
    cluster_id: str | None = None
    topic_id: str | None = None

    def differences(self, other: Owner) -> list[str]:
        """What differs in ``other`` (a checkpoint's owner) from this expected owner, as phrases."""
        out = []
        if other.group_id != self.group_id:
            out.append(f"it belongs to consumer group {other.group_id!r}, not {self.group_id!r}")
        if other.input_topic != self.input_topic:
            out.append(f"it was learned from input topic {other.input_topic!r}, not {self.input_topic!r}")
        if other.task != self.task:
            out.append(f"it is the state of {other.task!r}, not of {self.task!r}")
        if self.cluster_id and other.cluster_id != self.cluster_id:
            out.append(f"the Kafka cluster's id is {other.cluster_id}, this one's is {self.cluster_id}")
        if self.topic_id and other.topic_id != self.topic_id:
            out.append(
                f"topic {self.input_topic} had id {other.topic_id} and now has id {self.topic_id} "
                "(deleted and created again, or another cluster)"
            )
        return out

    def to_json(self) -> dict:
        return {
            "group_id": self.group_id,
            "input_topic": self.input_topic,
            "task": self.task,
            "cluster_id": self.cluster_id,
            "topic_id": self.topic_id,
        }


@dataclass(frozen=True)
class Checkpoint:
    seq: int
    positions: dict[tuple[str, int], int]  # (topic, partition) -> next offset to read
    model: dict
    dimension: int | None = None  # the dense dimension the decoder fixed
    meta: dict = field(default_factory=dict)  # settings the model depends on (variant, standardize...)
    created: float = 0.0
    owner: Owner | None = None  # None: a version 0.1 checkpoint, which did not record it
    task: dict = field(default_factory=dict)  # the task's own book-keeping beside the model (mixing, ...)
    #: read back with a signature (HMAC) present: written with --checkpoint-key (checked when the reader has one)
    signed: bool = field(default=False, compare=False)
    #: read back after skipping these unusable ones (damaged, unsigned, another model's...), said in the restore's
    #: WARNING
    fell_back_from: tuple[str, ...] = field(default=(), compare=False)
    #: those of ``fell_back_from`` that may have been a newer checkpoint of this model (:func:`newest_usable`'s
    #: rule): only they let the restorer's stale check restore one behind the group's committed offsets
    newer_skipped: tuple[str, ...] = field(default=(), compare=False)


def owner_of(cp: Checkpoint) -> Owner:
    """``cp``'s owner, which a checkpoint must have to be written (only version 0.1's, read, have none)."""
    if cp.owner is None:
        raise ValueError("a checkpoint needs its owner to be written")
    return cp.owner


def _canonical(body: dict) -> bytes:
    return orjson.dumps(body, option=orjson.OPT_SORT_KEYS)


def _legacy_canonical(body: dict) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def encode_checkpoint(cp: Checkpoint, key: bytes | None = None) -> bytes:
    """The checkpoint as JSON bytes with its SHA-256, and its HMAC-SHA256 when ``key`` is given."""
    owner = owner_of(cp)
    body = {
        "kind": KIND,
        "format": FORMAT,
        "seq": cp.seq,
        "created": cp.created,
        "owner": owner.to_json(),
        "positions": [[t, p, o] for (t, p), o in sorted(cp.positions.items())],
        "dimension": cp.dimension,
        "meta": cp.meta,
        "model": cp.model,
        "task": cp.task,
    }
    canonical = _canonical(body)
    body["sha256"] = hashlib.sha256(canonical).hexdigest()
    if key is not None:
        body["hmac"] = hmac.new(key, canonical, hashlib.sha256).hexdigest()
    return orjson.dumps(body)


def decode_checkpoint(data: bytes, key: bytes | None = None) -> Checkpoint:
    """The checkpoint in ``data``, checked; CheckpointError for anything else, whatever the bytes.

    orjson parses (it refuses nesting deeper than 1024 and non-finite numbers
    instead of recursing or overflowing); every field is then checked for type
    and range before anything uses it.
    """
    try:
        return _decode(data, key)
    except CheckpointError:
        raise
    except Exception as exc:  # whatever a hostile document provokes is damage, not a crash
        raise CheckpointError(f"the checkpoint cannot be read: {exc.__class__.__name__}: {str(exc)[:200]}") from None


def _decode(data: bytes, key: bytes | None) -> Checkpoint:
    if len(data) > MAX_CHECKPOINT_BYTES:
        raise refused(
            f"the checkpoint is {len(data)} bytes, more than the {MAX_CHECKPOINT_BYTES} a checkpoint may have",
            "too_large",
        )
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise CheckpointError(f"the checkpoint is not valid JSON (truncated or corrupt): {exc}") from None
    if not isinstance(body, dict) or body.get("kind") != KIND:
        raise CheckpointError("the data is not a perceptron-stream checkpoint")
    fmt = body.get("format")
    if fmt not in (FORMAT, LEGACY_FORMAT) or type(fmt) is not int:
        raise CheckpointError(
            f"checkpoint format {_short(fmt)} is not supported (this version reads formats 1 and {FORMAT})"
        )
    digest, signature = body.pop("sha256", None), body.pop("hmac", None)
    canonical = _canonical(body) if fmt == FORMAT else _legacy_canonical(body)
    if type(digest) is not str or not hmac.compare_digest(digest, hashlib.sha256(canonical).hexdigest()):
        raise CheckpointError("the checkpoint's checksum does not match its content (corrupt)")
    if key is not None:
        seq: Any = body.get("seq")  # JSON: only for the message and a new model's numbering
        claimed = seq if type(seq) is int else 0
        if signature is None:
            raise SignatureError(
                "the checkpoint is not signed, and --checkpoint-key is set: written without the key, or forged",
                claimed,
                unsigned=True,
            )
        if type(signature) is not str or not hmac.compare_digest(
            signature, hmac.new(key, canonical, hashlib.sha256).hexdigest()
        ):
            raise SignatureError(
                "the checkpoint's signature does not match: written with another --checkpoint-key, or forged", claimed
            )
    return Checkpoint(
        seq=_int(body, "seq", 0, _INT64),
        positions=_positions(body.get("positions")),
        model=_dict(body, "model"),
        dimension=None if body.get("dimension") is None else _int(body, "dimension", 1, _INT64),
        meta=_dict(body, "meta"),
        created=_finite(body, "created"),
        owner=_owner(body.get("owner")) if fmt == FORMAT else None,
        task=_dict(body, "task") if "task" in body else {},
        signed=signature is not None,
    )


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def refused(message: str, reason: str) -> CheckpointError:
    """A CheckpointError that says why it refused (``reason``, as perceptron_rejected_state_total counts it: too_large,
    settings, non_finite...); any other CheckpointError is damage (:func:`reason_of`)."""
    error = CheckpointError(message)
    error.reason = reason  # type: ignore[attr-defined]  # read by reason_of, with its default
    return error


def reason_of(error: BaseException) -> str:
    """Why ``error`` refused a checkpoint: the reason :func:`refused` gave it, else damaged.

    >>> reason_of(refused("too long", "too_large")), reason_of(CheckpointError("corrupt"))
    ('too_large', 'damaged')
    """
    return getattr(error, "reason", "damaged")


def _malformed(name: str, value, wanted: str) -> CheckpointError:
    return CheckpointError(
        f"the checkpoint is missing or has a malformed field: {name} must be {wanted}, got {_short(value)}"
    )


def _int(body: dict, name: str, low: int, high: int) -> int:
    value = body.get(name)
    if type(value) is not int or not low <= value < high:
        raise _malformed(name, value, f"an integer in [{low}, {high})")
    return value


def _finite(body: dict, name: str) -> float:
    value: Any = body.get(name)  # JSON: checked below
    if type(value) not in (int, float) or not math.isfinite(value):
        raise _malformed(name, value, "a finite number")
    return float(value)


def _dict(body: dict, name: str) -> dict:
    value = body.get(name)
    if type(value) is not dict:
        raise _malformed(name, value, "an object")
    return value


def _positions(value) -> dict[tuple[str, int], int]:
    if type(value) is not list:
        raise _malformed("positions", value, "a list of [topic, partition, offset]")
    out = {}
    for item in value:
        ok = (
            type(item) is list
            and len(item) == 3
            and type(item[0]) is str
            and type(item[1]) is int
            and type(item[2]) is int
            and 0 <= item[1] < _PARTITION_LIMIT
            and 0 <= item[2] < _INT64
        )
        if not ok or (item[0], item[1]) in out:
            raise _malformed("positions", item, "unique [topic, partition >= 0, offset >= 0] triples")
        out[(item[0], item[1])] = item[2]
    return out


def _owner(value) -> Owner:
    if type(value) is not dict:
        raise _malformed("owner", value, "an object")
    names = ("group_id", "input_topic", "task", "cluster_id", "topic_id")
    texts: dict[str, Any] = {n: value.get(n) for n in names}  # JSON: checked below
    for n in names[:3]:
        if type(texts[n]) is not str or not texts[n]:
            raise _malformed(f"owner.{n}", texts[n], "a non-empty string")
    for n in names[3:]:
        if texts[n] is not None and type(texts[n]) is not str:
            raise _malformed(f"owner.{n}", texts[n], "a string or null")
    return Owner(**texts)


def behind(positions: dict[tuple[str, int], int], committed: dict[tuple[str, int], int]) -> list[str]:
    """Where ``positions`` (a checkpoint's) lie before the offsets the group ``committed``, as phrases.

    The service commits only checkpointed positions, after the checkpoint is
    saved: the newest checkpoint is at or ahead of the committed offsets (ahead
    when a crash came between the save and the commit). One behind them is an
    older checkpoint put back where a newer one was (a replayed record, a store
    restored from a backup), or the fallback from a damaged newest one.
    A partition the group committed nothing on, or the checkpoint never read, is not compared.

    >>> behind({("points", 0): 40, ("points", 1): 9}, {("points", 0): 200, ("points", 1): 9})
    ['points partition 0 at offset 40, the group committed 200']
    """
    return [
        f"{t} partition {p} at offset {o}, the group committed {committed[(t, p)]}"
        for (t, p), o in sorted(positions.items())
        if (t, p) in committed and o < committed[(t, p)]
    ]


def newest_usable(
    candidates: Iterable[tuple[str, Checkpoint | CheckpointError]],
    accept: Callable[[Checkpoint], object] | None,
    where: str,
    expected: Owner | None = None,
    on_reject: Callable[[str], object] | None = None,
    keyed: bool = False,
) -> Checkpoint | None:
    """The first checkpoint of ``candidates`` (newest first, each decoded or the error it gave) that is
    ``expected``'s and that ``accept`` takes.

    ``accept`` raises CheckpointError for one this version cannot use (a model
    it cannot read, other settings): the next older one is tried. A checkpoint
    of another owner is skipped. None when there are no candidates at all;
    ForeignStateError when there are only other owners' ones; KeyPolicyError
    when every unusable one failed the signature check (the group runs with
    another --checkpoint-key policy); CheckpointError
    when there are some of this owner and none is usable: starting over from
    zero weights must be an operator's decision, not an accident. A version 0.1
    checkpoint (no owner) is returned for the caller to vouch for (see
    ``Application``).

    What was skipped, and why, is said once: in the WARNING of the one restored,
    or in the error raised. (Said as each was skipped too, the same reason came
    two or three times, one ERROR a checkpoint and the refusal, each "trying an
    older one" when none was left to try.) ``on_reject`` is told the reason of
    each one skipped (perceptron_rejected_state_total: foreign, or :func:`reason_of`).

    Those skipped that may have been a newer checkpoint of this model are
    also kept in ``newer_skipped``: they alone let a checkpoint behind the
    group's committed offsets be restored (the restorer's stale check), as
    the fallback from a damaged newest one. A skipped one counts when it is
    a decoded checkpoint of this owner with a higher seq that ``accept``
    refused, or, without a key (``keyed`` false), a damaged record (the
    local store's files come newest first by name, so one skipped was
    written after; a damaged record of the Kafka store says no seq, so any
    may have been the newest).
    Another model's checkpoint never counts, nor with --checkpoint-key an
    unsigned, badly signed or damaged record: anyone who can write the
    store can write one, and with junk beside an old signed checkpoint
    replay it (issue 35). Without a key nothing is vouched for anyway.
    """
    reject = on_reject or (lambda reason: None)
    problems, foreign, highest = [], [], 0
    skipped: list[str] = []
    maybe_newer: list[tuple[int | None, str]] = []  # (its seq, None: not known; what was said of it)
    signature_errors: list[SignatureError] = []
    for name, cp in candidates:
        refused_seq = None  # a decoded checkpoint's seq, when ``accept`` refused it
        if isinstance(cp, Checkpoint):
            highest = max(highest, cp.seq)
            differs = expected.differences(cp.owner) if expected is not None and cp.owner is not None else []
            if differs:
                log.debug("checkpoint %s in %s is not this model's: %s", name, where, "; ".join(differs))
                foreign.append(f"{name}: {'; '.join(differs)}")
                reject("foreign")
                skipped.append(f"checkpoint {name} in {where} is not this model's: {'; '.join(differs)}")
                continue
            if accept is not None:
                try:
                    accept(cp)
                except CheckpointError as exc:
                    refused_seq, cp = cp.seq, exc
        if isinstance(cp, CheckpointError):
            log.debug("checkpoint %s in %s is unusable: %s", name, where, cp)
            if isinstance(cp, SignatureError):
                signature_errors.append(cp)
            problems.append(f"{name}: {cp}")
            skipped.append(f"checkpoint {name} in {where} is unusable: {cp}")
            if refused_seq is not None:
                maybe_newer.append((refused_seq, skipped[-1]))
            elif not keyed and not isinstance(cp, SignatureError):
                maybe_newer.append((None, skipped[-1]))
            reject(reason_of(cp))
            continue
        if skipped:
            log.warning(
                "restored checkpoint %s from %s, skipping %d unusable one(s): %s",
                name,
                where,
                len(skipped),
                " | ".join(skipped),
            )
            newer = tuple(said for seq, said in maybe_newer if seq is None or seq > cp.seq)
            return replace(cp, fell_back_from=tuple(skipped), newer_skipped=newer)
        return cp
    if foreign and not problems:
        raise ForeignStateError(f"the checkpoints in {where} are not this model's: " + " | ".join(foreign), highest)
    if problems and len(signature_errors) == len(problems):
        raise KeyPolicyError(
            f"no checkpoint in {where} passes the --checkpoint-key check: " + "; ".join(problems),
            max([highest] + [e.seq for e in signature_errors]),
            unsigned=all(e.unsigned for e in signature_errors),
        )
    if problems:
        raise CheckpointError(f"no usable checkpoint in {where}: " + "; ".join(problems + foreign))
    return None

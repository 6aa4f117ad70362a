"""The checkpoint document and its integrity check.

>>> cp = Checkpoint(seq=3, positions={("points", 0): 17}, model={"kind": "perceptron"}, dimension=2, meta={"variant": "plain"})
>>> decode_checkpoint(encode_checkpoint(cp)) == cp
True
>>> decode_checkpoint(encode_checkpoint(cp)[:-9])
Traceback (most recent call last):
...
service.state.checkpoint.CheckpointError: the checkpoint is not valid JSON (truncated or corrupt): ...
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

FORMAT = 1
KIND = "perceptron-stream.checkpoint"


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: corrupt, truncated or from an incompatible setup."""


@dataclass(frozen=True)
class Checkpoint:
    seq: int
    positions: dict[tuple[str, int], int]  # (topic, partition) -> next offset to read
    model: dict
    dimension: int | None = None  # the dense dimension the decoder fixed
    meta: dict = field(default_factory=dict)  # settings the model depends on (variant, standardize...)
    created: float = 0.0


def _digest(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def encode_checkpoint(cp: Checkpoint) -> bytes:
    body = {
        "kind": KIND,
        "format": FORMAT,
        "seq": cp.seq,
        "created": cp.created,
        "positions": [[t, p, o] for (t, p), o in sorted(cp.positions.items())],
        "dimension": cp.dimension,
        "meta": cp.meta,
        "model": cp.model,
    }
    body["sha256"] = _digest(body)
    return json.dumps(body, separators=(",", ":")).encode()


def decode_checkpoint(data: bytes) -> Checkpoint:
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"the checkpoint is not valid JSON (truncated or corrupt): {exc}") from None
    if not isinstance(body, dict) or body.get("kind") != KIND:
        raise CheckpointError("the data is not a perceptron-stream checkpoint")
    if body.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint format {body.get('format')!r} is not supported (this version reads format {FORMAT})")
    digest = body.pop("sha256", None)
    if digest != _digest(body):
        raise CheckpointError("the checkpoint's checksum does not match its content (corrupt)")
    try:
        return Checkpoint(
            seq=int(body["seq"]),
            positions={(str(t), int(p)): int(o) for t, p, o in body["positions"]},
            model=body["model"],
            dimension=body["dimension"],
            meta=body["meta"],
            created=float(body["created"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"the checkpoint is missing or has a malformed field: {exc}") from None


def newest_usable(candidates: Iterable[tuple[str, Checkpoint | CheckpointError]], accept: Callable[[Checkpoint], None] | None,
                  where: str) -> Checkpoint | None:
    """The first checkpoint of ``candidates`` (newest first, each decoded or the error it gave) that ``accept`` takes.

    ``accept`` raises CheckpointError for one this version cannot use (a model
    it cannot read): the next older one is tried. None when there are no
    candidates at all; CheckpointError when there are some and none is
    usable: starting over from zero weights must be an operator's decision,
    not an accident.
    """
    problems = []
    for name, cp in candidates:
        if not isinstance(cp, CheckpointError) and accept is not None:
            try:
                accept(cp)
            except CheckpointError as exc:
                cp = exc
        if isinstance(cp, CheckpointError):
            log.error("checkpoint %s in %s is unusable: %s; trying an older one", name, where, cp)
            problems.append(f"{name}: {cp}")
            continue
        if problems:
            log.warning("restored checkpoint %s from %s, skipping %d unusable one(s)", name, where, len(problems))
        return cp
    if problems:
        raise CheckpointError(f"no usable checkpoint in {where}: " + "; ".join(problems))
    return None

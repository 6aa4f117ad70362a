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
from dataclasses import dataclass, field

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

"""Checkpoints in a compacted Kafka topic, for pods without a disk.

Each checkpoint is one record keyed ``<group>/<slot>`` with ``slot = seq mod
keep``: compaction keeps the newest record of each key, so the last ``keep``
checkpoints survive it and a damaged newest one has older ones to fall back to.
"""

from __future__ import annotations

import logging

from service.kafka import CompactedTopic
from service.state.checkpoint import Checkpoint, CheckpointError, decode_checkpoint, encode_checkpoint

log = logging.getLogger(__name__)


class KafkaStore:
    def __init__(self, topic: CompactedTopic, group_id: str, keep: int = 3):
        self.topic, self.prefix, self.keep = topic, f"{group_id}/".encode(), keep

    def lock(self) -> None:
        """Nothing to lock in a topic; the service checks the consumer group instead."""

    def save(self, cp: Checkpoint) -> None:
        self.topic.put(self.prefix + str(cp.seq % self.keep).encode(), encode_checkpoint(cp))

    def load(self) -> Checkpoint | None:
        latest: dict[bytes, bytes] = {}
        for key, value in self.topic.read_all():
            # "<group>/<slot>" exactly: group "a" must not read group "a/1"'s "a/1/0"
            if key is not None and key.startswith(self.prefix) and key[len(self.prefix):].isdigit():
                latest[key] = value  # later records of a key replace earlier ones, as compaction would
        good, problems = [], []
        for key, value in latest.items():
            try:
                good.append(decode_checkpoint(value or b""))
            except CheckpointError as exc:
                log.error("checkpoint %s in %s is unusable: %s", key.decode(errors="replace"), self.topic.topic, exc)
                problems.append(f"{key.decode(errors='replace')}: {exc}")
        if good:
            newest = max(good, key=lambda cp: cp.seq)
            if problems:
                log.warning("restored checkpoint %d from %s, skipping %d unusable one(s)", newest.seq, self.topic.topic, len(problems))
            return newest
        if problems:
            raise CheckpointError(f"no usable checkpoint in topic {self.topic.topic}: " + "; ".join(problems))
        return None

    def close(self) -> None:
        self.topic.close()

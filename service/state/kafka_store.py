"""Checkpoints in a compacted Kafka topic, for pods without a disk.

Each checkpoint is one record keyed ``<group>/<slot>`` with ``slot = seq mod
keep``: compaction keeps the newest record of each key, so the last ``keep``
checkpoints survive it and a damaged newest one has older ones to fall back to.
"""

from __future__ import annotations

from collections.abc import Callable

from service.kafka import CompactedTopic
from service.state.checkpoint import Checkpoint, CheckpointError, decode_checkpoint, encode_checkpoint, newest_usable


class KafkaStore:
    def __init__(self, topic: CompactedTopic, group_id: str, keep: int = 3):
        self.topic, self.prefix, self.keep = topic, f"{group_id}/".encode(), keep

    def lock(self) -> None:
        """Nothing to lock in a topic; the service checks the consumer group instead."""

    def save(self, cp: Checkpoint) -> None:
        self.topic.put(self.prefix + str(cp.seq % self.keep).encode(), encode_checkpoint(cp))

    def load(self, accept: Callable[[Checkpoint], None] | None = None) -> Checkpoint | None:
        """The newest checkpoint of this group that decodes and that ``accept`` takes (see :func:`newest_usable`)."""
        prefix = self.prefix
        # "<group>/<slot>" exactly: group "a" must not read group "a/1"'s "a/1/0"
        latest = self.topic.read_latest(lambda key: key.startswith(prefix) and key[len(prefix):].isdigit())
        decoded = []
        for key, value in latest.items():
            try:
                decoded.append((key.decode(), decode_checkpoint(value or b"")))
            except CheckpointError as exc:
                decoded.append((key.decode(), exc))
        # the damaged ones first (reported: any may have been the newest), then newest first
        decoded.sort(key=lambda item: -item[1].seq if isinstance(item[1], Checkpoint) else float("-inf"))
        return newest_usable(decoded, accept, f"topic {self.topic.topic}")

    def close(self) -> None:
        self.topic.close()

"""Checkpoints in a compacted Kafka topic, for pods without a disk.

Each checkpoint is one record keyed by its task's slot ``seq mod keep``:
``<group>/<slot>`` for the one model of a group, ``<group>/<task>/<slot>``
for a partition's replica. Compaction keeps the newest record of each key, so
the last ``keep`` checkpoints survive it and a damaged newest one has older
ones to fall back to. Only those slot keys are read (a record under any other
key is not the service's), and only the last value of each is held in memory
while the topic is read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from perceptron_stream.state.checkpoint import (
    GROUP_TASK,
    KEEP_CHECKPOINTS,
    Checkpoint,
    CheckpointError,
    Owner,
    decode_checkpoint,
    encode_checkpoint,
    newest_usable,
    owner_of,
)

#: The largest record the checkpoint producer sends and the service's checkpoint topic takes.
MAX_RECORD_BYTES = 16 * 1024 * 1024
#: Room for the record's key and headers within MAX_RECORD_BYTES.
_RECORD_OVERHEAD = 64 * 1024


class CheckpointTooLargeError(RuntimeError):
    """A checkpoint larger than the Kafka store can write: the model, not the brokers, must change."""


class KafkaStore:
    def __init__(self, topic, group_id: str, keep: int = KEEP_CHECKPOINTS):
        self.topic, self.group_id, self.keep = topic, group_id, keep
        self.key: bytes | None = None  # --checkpoint-key: sign what is written, refuse what is not signed with it
        self.on_reject: Callable[[str], object] | None = None  # (reason): a checkpoint read back and refused
        self._batch: set[bytes] | None = None  # within reading(): the slot keys of its tasks
        self._batch_latest: dict[bytes, bytes | None] | None = None  # and what the one read of them found

    def slot_keys(self, task: str) -> list[bytes]:
        """The record keys of ``task``'s slots (the group's model keeps version 0.1's ``<group>/<slot>``)."""
        prefix = f"{self.group_id}/" if task == GROUP_TASK else f"{self.group_id}/{task}/"
        return [f"{prefix}{slot}".encode() for slot in range(self.keep)]

    def lock(self, task: str) -> None:
        """Nothing to lock in a topic; the service checks the consumer group instead."""

    def unlock(self, task: str | None = None) -> None:
        """Nothing to unlock."""

    def save(self, cp: Checkpoint) -> None:
        _, key, value = self.record(cp)
        self.topic.put(key, value)

    def record(self, cp: Checkpoint) -> tuple[str, bytes, bytes]:
        """(topic, key, value) of the record :meth:`save` writes for ``cp``: what exactly-once sends in its
        transaction instead (the same slot key, encoding and size limit)."""
        value = encode_checkpoint(cp, self.key)
        if len(value) > MAX_RECORD_BYTES - _RECORD_OVERHEAD:
            features = len(cp.model.get("features", cp.model.get("perceptron", {}).get("features", [])))
            raise CheckpointTooLargeError(
                f"checkpoint {cp.seq} is {len(value):,} bytes, more than the {MAX_RECORD_BYTES - _RECORD_OVERHEAD:,} a "
                f"record of the Kafka state store may have (the model holds {features:,} features): lower "
                "--max-model-features, hash the features (--hash-features), or use --state-store local"
            )
        return self.topic.topic, self.slot_keys(owner_of(cp).task)[cp.seq % self.keep], value

    def load(
        self,
        task: str,
        expected: Owner | None = None,
        accept: Callable[[Checkpoint], object] | None = None,
        legacy: bool = False,
        committed: dict[tuple[str, int], int] | None = None,
    ) -> Checkpoint | None:
        """The newest checkpoint of ``task`` that is ``expected``'s, decodes and that ``accept`` takes
        (see :func:`newest_usable`). ``legacy`` changes nothing: version 0.1 used the same keys.

        ``committed`` (exactly-once: the group's committed offsets): only a checkpoint whose positions are
        committed offsets counts, the others are left out unreported. Under exactly-once a checkpoint is committed
        in the same transaction as its positions, and the topic's reader (service/kafka/compacted.py) reads
        committed records only, so an aborted transaction's record never reaches here; this check keeps out what
        the reader cannot tell apart: a checkpoint whose positions the group never committed (one an at-least-once
        run saved just before it crashed, ahead of its commit): exactly-once resumes only from a state whose
        positions the group holds.
        """
        latest = self._latest(set(self.slot_keys(task)))
        decoded: list[tuple[str, Checkpoint | CheckpointError]] = []
        for key, value in latest.items():
            try:
                cp = decode_checkpoint(value or b"", self.key)
            except CheckpointError as exc:
                decoded.append((key.decode(), exc))
                continue
            if committed is None or all(committed.get(tp) == o for tp, o in cp.positions.items()):
                decoded.append((key.decode(), cp))
        # the damaged ones first (reported: any may have been the newest), then newest first
        decoded.sort(key=lambda item: -item[1].seq if isinstance(item[1], Checkpoint) else float("-inf"))
        return newest_usable(
            decoded, accept, f"topic {self.topic.topic}", expected, self.on_reject, self.key is not None
        )

    @contextmanager
    def reading(self, tasks: list[str]) -> Iterator[None]:
        """Within it, :meth:`load` of any of ``tasks`` answers from one read of the topic for them all, made at the
        first load (not on entering: an exactly-once restore reads the group's offsets first, then the
        checkpoints). Each read of the topic costs a consumer of its own, its metadata and its fetches to the end
        (0.2-0.7 s even when the topic is empty): the partitions one rebalance assigns are restored with one. The
        values read wait for their task's load, which takes them (a second load of a task reads the topic again)."""
        self._batch, self._batch_latest = {key for task in tasks for key in self.slot_keys(task)}, None
        try:
            yield
        finally:
            self._batch, self._batch_latest = None, None

    def _latest(self, keys: set[bytes]) -> dict[bytes, bytes | None]:
        """The last value of each of ``keys`` (those the topic has), read now or in :meth:`reading`'s one read."""
        if self._batch is None or not keys <= self._batch:
            return self.topic.read_latest(keys)
        if self._batch_latest is None:
            self._batch_latest = self.topic.read_latest(self._batch)
        self._batch -= keys
        return {key: self._batch_latest.pop(key) for key in keys if key in self._batch_latest}

    def pending_dir(self, task: str) -> Path | None:  # the Store protocol's: None here
        """No disk of its own: the pending tables are rebuilt from the pending changelog in a cache directory."""
        return None

    def adopt_legacy(self, task: str) -> None:
        """Nothing to move: version 0.1's records are under the same keys."""

    def close(self) -> None:
        self.topic.close()

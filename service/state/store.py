"""What a checkpoint store is: the one interface the runtime uses, whichever store the operator chose.

Two stores satisfy it: :class:`~perceptron_stream.state.local.LocalStore` (a directory)
and :class:`~perceptron_stream.state.kafka_store.KafkaStore` (a compacted topic). The
runtime asks the store, never its type, what differs between them: where a
task's pending tables live (:meth:`Store.pending_dir`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol, runtime_checkable

from perceptron_stream.state.checkpoint import Checkpoint, Owner


@runtime_checkable
class Store(Protocol):
    #: --checkpoint-key: sign what is written, refuse what is not signed with it
    key: bytes | None
    #: told the reason of each checkpoint read back and refused (perceptron_rejected_state_total{kind="checkpoint"})
    on_reject: Callable[[str], object] | None

    def lock(self, task: str) -> None:
        """Take ``task``'s state for this process, or fail (StateLockedError) naming the holder."""

    def unlock(self, task: str | None = None) -> None:
        """Give ``task``'s state back (every task's without one)."""

    def save(self, cp: Checkpoint) -> None:
        """Write ``cp`` durably, keeping the last few of its task."""

    def load(
        self,
        task: str,
        expected: Owner | None = None,
        accept: Callable[[Checkpoint], object] | None = None,
        legacy: bool = False,
    ) -> Checkpoint | None:
        """The newest usable checkpoint of ``task`` (see :func:`~perceptron_stream.state.checkpoint.newest_usable`)."""

    def reading(self, tasks: list[str]) -> AbstractContextManager[None]:
        """A context within which loads of ``tasks`` may share one read of the store (several partitions restored
        at once)."""

    def adopt_legacy(self, task: str) -> None:
        """Take version 0.1's checkpoints as ``task``'s (the caller vouched for them)."""

    def pending_dir(self, task: str) -> Path | None:
        """Where ``task``'s pending tables live beside its checkpoints; None when the store keeps no files there
        (the tables are then rebuilt from the pending changelog in a cache directory)."""

    def close(self) -> None:
        """Release what the store holds (locks, clients)."""

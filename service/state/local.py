"""Checkpoints in a local directory: temp file, fsync, rename; the last few kept.

The directory is locked (``flock``) while a service uses it, so a second
instance pointed at the same state fails at start-up instead of forking the
model.

>>> import tempfile
>>> from service.state.checkpoint import Checkpoint
>>> store = LocalStore(tempfile.mkdtemp(), keep=2)
>>> for seq in (1, 2, 3):
...     store.save(Checkpoint(seq=seq, positions={("points", 0): seq * 10}, model={}))
>>> [p.name for p in store.files()]
['checkpoint-000000000003.json', 'checkpoint-000000000002.json']
>>> store.load().positions
{('points', 0): 30}
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Callable
from pathlib import Path

from service.state.checkpoint import Checkpoint, CheckpointError, decode_checkpoint, encode_checkpoint, newest_usable

log = logging.getLogger(__name__)


class StateLockedError(RuntimeError):
    """Another instance holds the state directory."""


class LocalStore:
    def __init__(self, directory: str | Path, keep: int = 3):
        self.directory = Path(directory)
        self.keep = keep
        self._lock_fd: int | None = None

    def lock(self) -> None:
        """Take the directory for this process, or fail naming the holder."""
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise StateLockedError(
                f"state directory {self.directory} is in use by pid {holder}: one instance runs per model; "
                "stop it or give this one another --state-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing releases the flock
            self._lock_fd = None

    def files(self) -> list[Path]:
        """Checkpoint files, newest first."""
        return sorted(self.directory.glob("checkpoint-*.json"), reverse=True)

    def save(self, cp: Checkpoint) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.directory / f"checkpoint-{cp.seq:012d}.json"
        temp = final.with_suffix(".tmp")
        with open(temp, "wb") as f:
            f.write(encode_checkpoint(cp))
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, final)
        dir_fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # make the rename itself durable
        finally:
            os.close(dir_fd)
        for old in self.files()[self.keep:]:
            old.unlink(missing_ok=True)

    def load(self, accept: Callable[[Checkpoint], None] | None = None) -> Checkpoint | None:
        """The newest checkpoint that decodes and that ``accept`` takes (see :func:`newest_usable`)."""

        def candidates():
            for path in self.files():
                try:
                    yield path.name, decode_checkpoint(path.read_bytes())
                except (CheckpointError, OSError) as exc:
                    yield path.name, CheckpointError(str(exc))

        try:
            return newest_usable(candidates(), accept, str(self.directory))
        except CheckpointError as exc:
            raise CheckpointError(f"{exc} (move them away to start from zero weights)") from None

    def close(self) -> None:
        self.unlock()

"""Checkpoints in a local directory: temp file, fsync, rename; the last few kept.

Layout: ``<state dir>/<group>/<task>/checkpoint-<seq>.json``, the group's
name made safe for a file name (:func:`group_dirname`), so that several models
can share a state directory without ever reading each other's checkpoints
(Kafka Streams scopes its state directory by application id the same way).
Version 0.1 wrote ``<state dir>/checkpoint-<seq>.json``: those files are found
(:meth:`LocalStore.legacy_files`) and moved under the group once the service
vouches that they are this group's (:meth:`LocalStore.adopt_legacy`).

Only regular files are read or written: a symlink, FIFO or device where a
checkpoint or the lock belongs is refused without opening it for reading or
writing (a FIFO would block the start-up; a symlink would write elsewhere).

A model's directory is locked (``flock``) while a service uses it, so a second
instance pointed at the same state fails at start-up instead of forking the
model.

>>> import tempfile
>>> from perceptron_stream.state.checkpoint import Checkpoint, Owner
>>> owner = Owner("g", "points")
>>> store = LocalStore(tempfile.mkdtemp(), "g", keep=2)
>>> for seq in (1, 2, 3):
...     store.save(Checkpoint(seq=seq, positions={("points", 0): seq * 10}, model={}, owner=owner))
>>> [p.name for p in store.files("model")]
['checkpoint-000000000003.json', 'checkpoint-000000000002.json']
>>> store.load("model", owner).positions
{('points', 0): 30}
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import re
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

from perceptron_stream.state.checkpoint import (
    KEEP_CHECKPOINTS,
    MAX_CHECKPOINT_BYTES,
    Checkpoint,
    CheckpointError,
    KeyPolicyError,
    Owner,
    decode_checkpoint,
    encode_checkpoint,
    newest_usable,
    owner_of,
)

log = logging.getLogger(__name__)

_NAME = re.compile(r"checkpoint-\d{12}\.json")
_NO_FOLLOW = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class StateLockedError(RuntimeError):
    """Another instance holds the state directory."""


def group_dirname(group_id: str) -> str:
    """A file name for a consumer group: percent-encoded, hashed when too long for a file system.

    >>> group_dirname("perceptron-stream"), group_dirname("a/b"), group_dirname(".."), len(group_dirname("x" * 500))
    ('perceptron-stream', 'a%2Fb', '%2E%2E', 200)
    """
    name = quote(group_id, safe="-_.")
    if name in (".", ".."):
        name = name.replace(".", "%2E")
    if len(name) > 200:
        name = name[:135] + "~" + hashlib.sha256(group_id.encode()).hexdigest()
    return name


def _open_regular(path: Path, flags: int) -> int:
    """A descriptor of the regular file at ``path``; OSError for anything else, which is never opened for I/O.

    O_NONBLOCK makes opening a FIFO return at once instead of waiting for a
    writer, O_NOFOLLOW refuses a symlink (ELOOP); fstat then refuses what is not
    a regular file before a byte is read or written.
    """
    try:
        fd = os.open(path, flags | _NO_FOLLOW, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(
                errno.ELOOP, "a symbolic link, refused (state files must be regular files)", str(path)
            ) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, f"not a regular file ({stat.filemode(mode)})", str(path))
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: Path, limit: int = MAX_CHECKPOINT_BYTES) -> bytes:
    """The bytes of the regular file at ``path`` (at most ``limit``: larger is an OSError)."""
    fd = _open_regular(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise OSError(errno.EFBIG, f"{size} bytes, more than the {limit} a checkpoint may have", str(path))
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(limit + 1)
    finally:
        os.close(fd)


class LocalStore:
    def __init__(self, directory: str | Path, group_id: str, keep: int = KEEP_CHECKPOINTS):
        self.root = Path(directory)
        self.group_id = group_id
        self.directory = self.root / group_dirname(group_id)
        self.keep = keep
        self.key: bytes | None = None  # --checkpoint-key: sign what is written, refuse what is not signed with it
        self.on_reject: Callable[[str], object] | None = None  # (reason): a checkpoint read back and refused
        self._locks: dict[str, int] = {}

    def task_dir(self, task: str) -> Path:
        return self.directory / task

    def pending_dir(self, task: str) -> Path:
        """A task's pending tables live beside its checkpoints: the same disk keeps both."""
        return self.task_dir(task)

    # locking -------------------------------------------------------------
    def lock(self, task: str) -> None:
        """Take the task's directory for this process, or fail naming the holder."""
        if task in self._locks:
            return
        directory = self.task_dir(task)
        directory.mkdir(parents=True, exist_ok=True)
        try:
            fd = _open_regular(directory / "LOCK", os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            raise StateLockedError(
                f"cannot use the lock file {directory / 'LOCK'}: {exc.strerror or exc}; "
                "remove what is there (it must be a regular file)"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise StateLockedError(
                f"state directory {directory} is in use by pid {holder}: one instance runs per model (its group id "
                "and its state); stop that one, or run another model with another --group-id (and --state-dir), or "
                "run every instance with --model-scope partition and a --state-dir they share"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._locks[task] = fd

    def unlock(self, task: str | None = None) -> None:
        for name in [task] if task is not None else list(self._locks):
            fd = self._locks.pop(name, None)
            if fd is not None:
                os.close(fd)  # closing releases the flock

    # checkpoints ---------------------------------------------------------
    def files(self, task: str) -> list[Path]:
        """Checkpoint files of ``task``, newest first (by name: the sequence number)."""
        return _checkpoint_files(self.task_dir(task))

    def legacy_files(self) -> list[Path]:
        """Version 0.1's checkpoints, in the state directory itself, newest first."""
        return _checkpoint_files(self.root)

    def save(self, cp: Checkpoint) -> None:
        task = owner_of(cp).task
        directory = self.task_dir(task)
        directory.mkdir(parents=True, exist_ok=True)
        final = directory / f"checkpoint-{cp.seq:012d}.json"
        temp = final.with_suffix(".tmp")
        if os.path.lexists(temp):
            os.unlink(temp)  # a leftover of a write cut short, or something planted: never written through
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(encode_checkpoint(cp, self.key))
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, final)  # replaces a symlink or FIFO of that name; never follows it
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # make the rename itself durable
        finally:
            os.close(dir_fd)
        for old in self.files(task)[self.keep :]:
            old.unlink(missing_ok=True)

    def load(
        self,
        task: str,
        expected: Owner | None = None,
        accept: Callable[[Checkpoint], object] | None = None,
        legacy: bool = False,
    ) -> Checkpoint | None:
        """The newest checkpoint of ``task`` that is ``expected``'s, decodes and that ``accept`` takes
        (see :func:`newest_usable`); with ``legacy``, version 0.1's files when the task has none."""
        files = self.files(task)
        where = self.task_dir(task)
        if not files and legacy and self.legacy_files():
            files, where = self.legacy_files(), self.root
        try:
            return newest_usable(
                self._decoded(files), accept, str(where), expected, self.on_reject, self.key is not None
            )
        except KeyPolicyError:  # a setting to fix, not files to move away
            raise
        except CheckpointError as exc:
            raise CheckpointError(f"{exc} (move them away to start from zero weights)") from None

    def _decoded(self, files: list[Path]) -> Iterator[tuple[str, Checkpoint | CheckpointError]]:
        for path in files:
            try:
                yield path.name, decode_checkpoint(read_regular(path), self.key)
            except CheckpointError as exc:  # as it is: a signature's failure (SignatureError) is told apart
                yield path.name, exc
            except OSError as exc:
                yield path.name, CheckpointError(str(exc))

    @contextmanager
    def reading(self, tasks: list[str]) -> Iterator[None]:
        """Nothing to share: each task's files are read by its own load (a few files in a directory)."""
        yield

    def adopt_legacy(self, task: str) -> None:
        """Move version 0.1's checkpoints under this group's ``task`` (the caller vouched for them)."""
        directory = self.task_dir(task)
        directory.mkdir(parents=True, exist_ok=True)
        for path in self.legacy_files():
            os.replace(path, directory / path.name)
        log.info("moved the checkpoints of version 0.1's layout from %s to %s", self.root, directory)

    def close(self) -> None:
        self.unlock()


def _checkpoint_files(directory: Path) -> list[Path]:
    """``checkpoint-<12 digits>.json`` entries of ``directory``, newest first.

    Whatever has that name is listed (a symlink, a FIFO, a directory), to be
    refused by :func:`read_regular` and reported as damaged.
    """
    try:
        with os.scandir(directory) as entries:
            names = [e.name for e in entries if _NAME.fullmatch(e.name)]
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [directory / n for n in sorted(names, reverse=True)]

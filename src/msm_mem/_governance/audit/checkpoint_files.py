"""The files of per-commit checkpoints: where they live (:class:`CheckpointPlace`), the signed
head written before each commit, and the log lines appended after it (see :mod:`.log`).
Plain file operations, one concern each; reading never creates anything."""

from __future__ import annotations

import fcntl
import functools
import os
from dataclasses import dataclass
from pathlib import Path

from ..._errors import InvalidInput
from .checkpoint import Checkpoint

__all__ = ["CheckpointPlace", "log_file", "publish", "read_head", "read_tail", "write_head"]


def log_file(path: Path) -> Path:
    """A checkpoint log named directly (``*.jsonl``) or the ``checkpoints.jsonl`` of a folder."""
    path = Path(path)
    return path if path.suffix == ".jsonl" else path / "checkpoints.jsonl"


@dataclass(frozen=True, slots=True)
class CheckpointPlace:
    """Where a store's checkpoints live: the log, its signed head file beside it, a witness.

    ``log`` and ``witness`` are files (``*.jsonl``) or folders holding ``checkpoints.jsonl``;
    the head file is the log's name with the suffix ``.head``.
    """

    log: Path
    witness: Path | None = None

    @classmethod
    def of(cls, directory: Path, checkpoints: str | Path | None, witness: str | Path | None) -> CheckpointPlace:
        """The place for a store ``directory``: ``DIR/audit/`` unless ``checkpoints`` names one."""
        log = log_file(Path(checkpoints) if checkpoints is not None else Path(directory) / "audit")
        return cls(log, None if witness is None else log_file(Path(witness)))

    @property
    def head(self) -> Path:
        """The signed head file: the checkpoint of the latest commit, written before it commits."""
        return self.log.with_suffix(".head")

    @property
    def witness_head(self) -> Path | None:
        """The witness's signed head file, written before each commit like :attr:`head`: the
        witness is never behind an acknowledged write, so one that is was rolled back."""
        return None if self.witness is None else self.witness.with_suffix(".head")

    def head_of(self, chain: int) -> Path:
        """:attr:`head` of audit chain ``chain`` of a store of several (``.<chain>.head``; chain
        0's is :attr:`head`)."""
        return self.head if chain == 0 else self.log.with_suffix(f".{chain}.head")

    def witness_head_of(self, chain: int) -> Path | None:
        """:attr:`witness_head` of audit chain ``chain`` (as :meth:`head_of`)."""
        if self.witness is None or chain == 0:
            return self.witness_head
        return self.witness.with_suffix(f".{chain}.head")


@functools.lru_cache(maxsize=4)
def _line(checkpoint: Checkpoint) -> bytes:
    """The log line of ``checkpoint`` (canonical JSON and a newline). Kept for the last few: a
    commit writes the same checkpoint to the head file, the log and the witness, and equal
    checkpoints (frozen, compared field by field) have the same canonical JSON."""
    return checkpoint.to_json() + b"\n"


def publish(path: Path, checkpoint: Checkpoint) -> None:
    """Append ``checkpoint`` to the log at ``path`` without reading it back (one write).

    The per-commit path: the head it signs was written before the commit by :func:`write_head`
    (fsynced), so this append needs no fsync of its own; it creates the file (0600) and its
    folder when missing. The whole line is appended or OSError raised with the log as it was
    (a full disk): an append is never half done.
    """
    path = Path(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # processes sharing the log append one line at a time
        _cut_torn_tail(fd)
        size = os.fstat(fd).st_size
        line = _line(checkpoint)
        try:
            done = 0
            while done < len(line):  # a full disk writes part of a line, then refuses the rest
                done += os.write(fd, line[done:])
        except OSError:
            os.ftruncate(fd, size)  # no torn line left behind: the append did not happen
            raise
    finally:
        os.close(fd)


def _cut_torn_tail(fd: int) -> None:
    """Cut off a last line left without its newline (an append a crash interrupted: it was never
    acknowledged), so the next line does not join it."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return
    start = max(0, size - 65536)
    tail = os.pread(fd, size - start, start)
    os.ftruncate(fd, start + tail.rfind(b"\n") + 1)


def write_head(path: Path, checkpoint: Checkpoint) -> None:
    """Replace the signed head file at ``path`` with ``checkpoint`` and make it durable.

    Written inside the transaction of a commit, before it commits: a head that then fails to
    commit names a chain the store does not have, and the next write replaces it. Written over
    the old line in place (cut to the new length only when that is shorter) and synced with
    ``fdatasync``: an unchanged size changes no metadata the file system must journal, where
    truncating and writing it anew changed the size twice at every commit. A crash during the
    write leaves a line that does not parse, or whose form or signature does not hold, which
    :func:`read_head` and the checks after it treat as no head, as they did a truncated file.
    """
    path = Path(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    line = _line(checkpoint)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        done = 0
        while done < len(line):
            done += os.pwrite(fd, line[done:], done)
        if os.fstat(fd).st_size > len(line):
            os.ftruncate(fd, len(line))
        os.fdatasync(fd)
    finally:
        os.close(fd)


def read_head(path: Path) -> Checkpoint | None:
    """The checkpoint of the signed head file, or None when it is missing or torn (a write
    interrupted before its commit, so the store does not rely on it). Reads only."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return None
    if not data.endswith(b"\n"):
        return None
    try:
        checkpoint = Checkpoint.from_json(data[:-1])
    except InvalidInput:
        return None
    return checkpoint if checkpoint.to_json() == data[:-1] else None


def read_tail(path: Path, max_bytes: int = 4096) -> Checkpoint | None:
    """The last complete checkpoint line of the log at ``path`` (None: missing, empty or torn).
    Reads at most the last ``max_bytes``: the write path's check of the signed head."""
    try:
        with Path(path).open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            data = handle.read()
    except FileNotFoundError:
        return None
    lines = data.split(b"\n")
    for line in reversed(lines[1:-1] if size > max_bytes else lines[:-1]):
        try:
            return Checkpoint.from_json(line)
        except InvalidInput:
            return None
    return None

"""Private files: everything a memory directory holds is readable by its owner only.

Directories are created 0700 and files 0600 (the umask can only narrow these modes), so a
store's database, its write-ahead log (SQLite gives it the database file's mode), vector caches,
keys, checkpoints and settings are never readable by group or others.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ._errors import InvalidInput

__all__ = ["PRIVATE_DIR", "PRIVATE_FILE", "private_dir", "private_file", "read_private", "write_private"]

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


def private_dir(path: Path) -> Path:
    """Create ``path`` (and missing parents) with mode 0700 for the leaf; an existing directory
    keeps its mode. Returns ``path``."""
    path.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    return path


def private_file(path: Path) -> Path:
    """Make ``path`` mode 0600, creating it empty first when it does not exist. Returns ``path``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, PRIVATE_FILE)
    try:
        os.fchmod(fd, PRIVATE_FILE)  # an existing file keeps its mode through O_CREAT
    finally:
        os.close(fd)
    return path


def read_private(path: Path, what: str, *, missing_ok: bool = False) -> bytes | None:
    """The bytes of ``path``, ``what`` it is naming it in every error (InvalidInput): it must be
    a regular file (a symbolic link is not followed) that neither group nor others may read or
    write. A missing file is None with ``missing_ok``, else an error."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError as exc:
        if missing_ok:
            return None
        raise InvalidInput(f"{what} {path} does not exist") from exc
    except OSError as exc:  # ELOOP for a symbolic link, EACCES...
        raise InvalidInput(f"{what} {path} cannot be opened: {exc.strerror}") from exc
    try:
        st = os.fstat(fd)  # the opened file itself: no race with a swapped path
        if not stat.S_ISREG(st.st_mode):
            raise InvalidInput(f"{what} {path} is not a regular file")
        if st.st_mode & 0o077:
            raise InvalidInput(
                f"{what} {path} has mode {stat.S_IMODE(st.st_mode):04o}; "
                "it must not be accessible by group or others (chmod 600)"
            )
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def write_private(path: Path, data: bytes, *, replace: bool) -> None:
    """Write ``data`` to ``path`` (0600, fsynced, then its folder, made 0700 when missing):
    atomically by rename when ``replace``, else only when the file does not exist yet
    (FileExistsError, nothing written)."""
    private_dir(path.parent)
    target = path.with_name(f".{path.name}.tmp") if replace else path
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if replace else os.O_EXCL), PRIVATE_FILE)
    try:
        done = 0
        while done < len(data):
            done += os.write(fd, data[done:])
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        target.unlink(missing_ok=True)
        raise
    os.close(fd)
    if replace:
        os.replace(target, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)

"""Reading files named by outside input: regular files only, bounded, optionally inside a root.

A path from a manifest or an API call may name a FIFO (whose open blocks until a writer
comes), a device (``/dev/zero`` never ends), a symlink or ``..`` that leaves the folder it was
meant to stay in, or a file far too large. :func:`read_regular` refuses each before reading:

- the path is checked as text first (length, no NUL);
- with a ``root``, the path is resolved (symlinks and ``..``) and must lie inside the resolved
  root; the resolved path is what is opened, with ``O_NOFOLLOW`` on its last component;
- it is ``stat``-ed and must be a regular file (a FIFO or device is never opened), then opened
  with ``O_NONBLOCK`` (an open never waits) and ``fstat``-ed again (the file cannot have been
  swapped for a FIFO in between);
- its size must be at most ``max_bytes``, and at most ``max_bytes`` are read (a file that grew
  meanwhile is refused, not read to its end).

Regular files on local disks do not block on read, so no read timeout is needed; a hung
network mount can still stall a read, which no timeout in this process could undo.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ._errors import InvalidInput
from ._limits import check_path

__all__ = ["inside", "read_regular", "regular_path"]

_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)


def _as_path(path: object, error: type[InvalidInput]) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise error(f"a file path must be a string or a path, got {type(path).__name__}")
    text = os.fspath(path)
    if not isinstance(text, str):
        raise error("a file path must be text, not bytes")
    try:
        check_path("file path", text)
    except InvalidInput as exc:
        raise error(f"{text[:200]!r}: {exc}") from None
    if not text:
        raise error("a file path must not be empty")
    return Path(text)


def inside(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> bool:
    """Whether ``path``, with every symlink and ``..`` resolved, lies inside ``root`` (also
    resolved). A path that does not exist is resolved as far as it does."""
    try:
        real = Path(os.path.realpath(path))
        base = Path(os.path.realpath(root))
    except (OSError, ValueError):
        return False
    return real == base or base in real.parents


def _resolve(p: Path, root: str | os.PathLike[str] | None, error: type[InvalidInput]) -> Path:
    if root is None:
        return p
    if not inside(p, root):
        raise error(f"{p}: outside the allowed folder {os.fspath(root)} (after resolving links and '..')")
    return Path(os.path.realpath(p))


def _stat_regular(p: Path, label: Path, error: type[InvalidInput]) -> os.stat_result:
    try:
        st = p.stat()
    except FileNotFoundError:
        raise error(f"{label}: file does not exist") from None
    except OSError as exc:
        raise error(f"{label}: cannot be read ({exc.strerror or exc})") from None
    if stat.S_ISDIR(st.st_mode):
        raise error(f"{label}: is a directory, not a regular file")
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{label}: not a regular file (a FIFO, socket or device is never read)")
    return st


def _check_size(size: int, max_bytes: int, label: Path, error: type[InvalidInput]) -> None:
    if size > max_bytes:
        raise error(f"{label}: file is larger than the limit of {max_bytes:,} bytes ({size:,})")


def regular_path(
    path: object,
    *,
    max_bytes: int,
    root: str | os.PathLike[str] | None = None,
    error: type[InvalidInput] = InvalidInput,
) -> Path:
    """The path to hand a decoder that opens files itself (video): checked like
    :func:`read_regular` (resolved inside ``root``, a regular file, at most ``max_bytes``)
    without reading it."""
    label = _as_path(path, error)
    target = _resolve(label, root, error)
    _check_size(_stat_regular(target, label, error).st_size, max_bytes, label, error)
    return target


def read_regular(
    path: object,
    *,
    max_bytes: int,
    root: str | os.PathLike[str] | None = None,
    error: type[InvalidInput] = InvalidInput,
    head: int | None = None,
) -> bytes:
    """The bytes of the regular file at ``path`` (see the module docstring), or only its first
    ``head`` bytes; ``error`` (an :class:`InvalidInput` subclass) is raised, naming the path,
    for anything refused."""
    label = _as_path(path, error)
    target = _resolve(label, root, error)
    _check_size(_stat_regular(target, label, error).st_size, max_bytes, label, error)
    flags = _OPEN_FLAGS | (getattr(os, "O_NOFOLLOW", 0) if root is not None else 0)
    try:
        fd = os.open(target, flags)
    except OSError as exc:
        raise error(f"{label}: cannot be read ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{label}: not a regular file (a FIFO, socket or device is never read)")
        _check_size(st.st_size, max_bytes, label, error)
        want = max_bytes + 1 if head is None else min(head, max_bytes + 1)
        chunks: list[bytes] = []
        total = 0
        while total < want:
            chunk = os.read(fd, min(1 << 20, want - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        _check_size(total, max_bytes, label, error)
        return b"".join(chunks)
    except OSError as exc:
        raise error(f"{label}: cannot be read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)

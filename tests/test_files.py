"""Tests of msm_mem._files: only bounded regular files, inside a root when one is given."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from msm_mem import InvalidInput
from msm_mem._files import inside, read_regular, regular_path


def _within_seconds(fn: object, seconds: float = 5.0) -> BaseException | None:
    """Run ``fn`` in a thread; fail the test if it does not return in time (a FIFO would hang)."""
    box: list[BaseException | None] = [None]

    def run() -> None:
        try:
            fn()  # type: ignore[operator]
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            box[0] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "the read blocked"
    return box[0]


def test_regular_file_is_read(tmp_path: Path) -> None:
    """A regular file comes back whole, or only its head."""
    p = tmp_path / "a.bin"
    p.write_bytes(b"0123456789")
    assert read_regular(p, max_bytes=10) == b"0123456789"
    assert read_regular(p, max_bytes=10, head=4) == b"0123"


def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    """A FIFO with no writer is refused at once, not opened and waited on."""
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    exc = _within_seconds(lambda: read_regular(fifo, max_bytes=100))
    assert isinstance(exc, InvalidInput) and "not a regular file" in str(exc) and "pipe.png" in str(exc)


def test_device_is_refused(tmp_path: Path) -> None:
    """/dev/zero (endless) is a device: refused before a byte is read."""
    with pytest.raises(InvalidInput, match="not a regular file"):
        read_regular("/dev/zero", max_bytes=100)


def test_oversized_file_is_refused(tmp_path: Path) -> None:
    """A file over the byte limit is refused from its size, before it is read."""
    p = tmp_path / "big.bin"
    p.write_bytes(b"x" * 101)
    with pytest.raises(InvalidInput, match="larger than the limit of 100 bytes"):
        read_regular(p, max_bytes=100)
    with pytest.raises(InvalidInput, match="larger than the limit"):
        regular_path(p, max_bytes=100)


def test_missing_directory_empty_and_nul_paths(tmp_path: Path) -> None:
    """Missing files, directories, empty paths and NUL bytes are clear errors."""
    with pytest.raises(InvalidInput, match="does not exist"):
        read_regular(tmp_path / "nope", max_bytes=10)
    with pytest.raises(InvalidInput, match="directory"):
        read_regular(tmp_path, max_bytes=10)
    with pytest.raises(InvalidInput, match="empty"):
        read_regular("", max_bytes=10)
    with pytest.raises(InvalidInput, match="NUL"):
        read_regular("a\x00b", max_bytes=10)
    with pytest.raises(InvalidInput, match="string or a path"):
        read_regular(3, max_bytes=10)


def test_root_refuses_dotdot_absolute_and_symlink_escapes(tmp_path: Path) -> None:
    """Inside a root, '..', an absolute path elsewhere and a symlink out are all refused."""
    root, outside = tmp_path / "root", tmp_path / "secret.txt"
    root.mkdir()
    outside.write_bytes(b"secret")
    (root / "ok.bin").write_bytes(b"ok")
    (root / "link.bin").symlink_to(outside)
    (root / "inner.bin").symlink_to(root / "ok.bin")
    assert read_regular(root / "ok.bin", max_bytes=10, root=root) == b"ok"
    assert read_regular(root / "inner.bin", max_bytes=10, root=root) == b"ok"  # a link that stays inside
    for escape in (root / ".." / "secret.txt", outside, root / "link.bin"):
        with pytest.raises(InvalidInput, match="outside the allowed folder"):
            read_regular(escape, max_bytes=10, root=root)
    assert read_regular(root / "link.bin", max_bytes=10) == b"secret"  # without a root: the caller's file


def test_inside_resolves_links_and_dotdot(tmp_path: Path) -> None:
    """inside() compares resolved paths: the root itself counts, a sibling with a common prefix does not."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data2").mkdir()
    assert inside(tmp_path / "data", tmp_path / "data")
    assert inside(tmp_path / "data" / "x" / ".." / "y", tmp_path / "data")
    assert not inside(tmp_path / "data2" / "y", tmp_path / "data")
    assert not inside(tmp_path / "data" / ".." / "y", tmp_path / "data")

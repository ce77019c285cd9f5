"""Private files: everything a memory directory holds is readable by its owner only.

Directories are created 0700 and files 0600 (the umask can only narrow these modes), so a
store's database, its write-ahead log (SQLite gives it the database file's mode), vector caches,
keys, checkpoints and settings are never readable by group or others.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["PRIVATE_DIR", "PRIVATE_FILE", "private_dir", "private_file"]

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

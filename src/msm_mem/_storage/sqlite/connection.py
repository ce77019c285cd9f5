"""The embedded store's connections: how one is opened, the store's under its lock, and the
side connection of the writes of audit rows alone.

Every governed read writes its audit events, and a group of them commits with two syncs to
disk (the signed head file and SQLite's WAL). On the store's one connection that commit held
the connection's lock from ``BEGIN`` to ``COMMIT``, so every read of the process, on every
thread, waited for both syncs. A batch of nothing but audit rows changes none of what the store
caches (its change mark, :mod:`.changes`, tells the other connections so), so it needs neither
the caches nor the connection they are kept beside: it runs on a second connection of the
store (opened at the first such write), in writer order like every write (the writer's thread
lock, then ``flock``, then SQLite's write lock), while reads go on over the first connection
and see the rows once they are committed (WAL: readers neither block a writer nor wait for
it). The writing thread sends every statement of its transaction (the audit head, the row
digests, the rows) to that connection and takes no lock a reader holds, so no reader waits for
it and it never waits for a reader that waits for it. Every other write runs on the first
connection under its lock, as its caches follow it.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path
from typing import Protocol

from ..._errors import StoreError
from ..batch import WriteBatch

__all__ = ["BUSY_TIMEOUT_MS", "Held", "Writing", "audit_only", "connect", "connect_read_only", "writable"]


#: how long a writer waits for another process's write transaction before failing cleanly
BUSY_TIMEOUT_MS = 30_000


def connect(path: Path, durable: bool) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
    conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    # checkpoint the WAL every 32 MiB rather than SQLite's 4 MiB: index pages that consecutive
    # group commits rewrite are copied into the database once, not once per commit or two
    conn.execute("PRAGMA wal_autocheckpoint=8192")
    return conn


def connect_read_only(path: Path) -> sqlite3.Connection:
    """A read-only connection for a store on read-only media or without write permission.

    ``mode=ro`` first (it sees a write-ahead log left beside the database); where SQLite cannot
    use the log read-only and there is none to see, ``immutable=1``."""
    uri = path.resolve().as_uri()
    try:
        conn = sqlite3.connect(f"{uri}?mode=ro", uri=True, isolation_level=None, check_same_thread=False)
        conn.execute("SELECT count(*) FROM meta").fetchone()
        return conn
    except sqlite3.DatabaseError:
        wal = path.with_name(path.name + "-wal")
        if wal.exists() and wal.stat().st_size > 0:
            raise
    conn = sqlite3.connect(f"{uri}?immutable=1", uri=True, isolation_level=None, check_same_thread=False)
    conn.execute("SELECT count(*) FROM meta").fetchone()
    return conn


def writable(path: Path) -> bool:
    return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)


def audit_only(batch: WriteBatch) -> bool:
    """Whether ``batch`` holds nothing to store but audit rows (given, or chained at the write)."""
    return not batch.restore and not any(
        getattr(batch, name) for name in batch.__dataclass_fields__ if name not in ("audit", "restore")
    )


class Writing(threading.local):
    """The side connection while this thread writes audit rows alone; None otherwise."""

    conn: sqlite3.Connection | None = None


class _Owner(Protocol):
    """What :class:`Held` uses of the store that owns it."""

    _lock: threading.RLock
    _closed: bool
    _conn: sqlite3.Connection
    _writing: Writing


class Held:
    """The store's connection under its lock (re-entrant), refused once closed; on the thread
    writing audit rows alone, the side connection, without the lock.

    A plain context manager rather than a generator one: every read takes it, often nested,
    and this costs what taking the lock costs."""

    __slots__ = ("_store",)

    def __init__(self, store: _Owner) -> None:
        self._store = store

    def __enter__(self) -> sqlite3.Connection:
        store = self._store
        side = store._writing.conn
        if side is not None:
            if store._closed:  # closed while this writer waited for its turn
                raise StoreError("the store is closed")
            return side
        store._lock.acquire()
        if store._closed:
            store._lock.release()
            raise StoreError("the store is closed")
        return store._conn

    def __exit__(self, *exc: object) -> None:
        if self._store._writing.conn is None:  # the side connection took no lock
            self._store._lock.release()

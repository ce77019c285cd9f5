"""The embedded store's connections: how one is opened, the store's under its lock, the side
connection of the writes of audit rows alone, and the SQLite dialect that holds them
(:class:`SqliteDialect`: how the shared SQL runs on them, how a write transaction starts).

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

import fcntl
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..._errors import InvalidInput, StoreError, WriteConflict
from ..batch import WriteBatch
from ..sql_core import Rows, update_sql
from .changes import ChangeMark
from .schema import DB_NAME
from .upgrade import add_tenant

__all__ = [
    "BUSY_TIMEOUT_MS",
    "Held",
    "SqliteDialect",
    "Writing",
    "audit_only",
    "connect",
    "connect_read_only",
    "writable",
]


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
    # a deleted or rewritten row's bytes are overwritten with zeros, in its page and in the pages
    # freed: nothing an erasure or an update removed stays in the file's free space
    conn.execute("PRAGMA secure_delete=ON")
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


class Held:
    """The store's connection under its lock (re-entrant), refused once closed; on the thread
    writing audit rows alone, the side connection, without the lock.

    A plain context manager rather than a generator one: every read takes it, often nested,
    and this costs what taking the lock costs."""

    __slots__ = ("_dialect",)

    def __init__(self, dialect: SqliteDialect) -> None:
        self._dialect = dialect

    def __enter__(self) -> sqlite3.Connection:
        dialect = self._dialect
        side = dialect.writing.conn
        if side is not None:
            if dialect.closed:  # closed while this writer waited for its turn
                raise StoreError("the store is closed")
            return side
        dialect.lock.acquire()
        if dialect.closed:
            dialect.lock.release()
            raise StoreError("the store is closed")
        return dialect.conn

    def __exit__(self, *exc: object) -> None:
        if self._dialect.writing.conn is None:  # the side connection took no lock
            self._dialect.lock.release()


class SqliteDialect:
    """How the shared SQL runs on the embedded store: its connection behind a lock, the side
    connection of audit rows alone, the writers' queue and ``BEGIN IMMEDIATE`` transactions.
    Thread-safe."""

    # ``+pos``, an expression: SQLite, without table statistics, takes an equality on the
    # tenant (one value in a store) for a selective one, and would read a patient's records by
    # walking the whole (tenant, pos) key in order rather than the patient index and a sort
    order: Mapping[str, str] = {
        "episodic": "+pos",
        "visual": "+pos",
        "semantic": "rowid",
        "claims": "rowid",
        "entities": "rowid",
        "relationships": "rowid",
    }
    holds_nul = True
    integrity_error: type[Exception] = sqlite3.IntegrityError
    disconnected: tuple[type[Exception], ...] = ()

    def __init__(
        self,
        conn: sqlite3.Connection,
        directory: Path,
        changes: ChangeMark,
        follow: Callable[[], None],
        *,
        legacy: bool,
    ) -> None:
        """``conn`` is the store's connection in ``directory``; ``changes`` its change mark;
        ``follow`` is called first inside each write transaction of that connection, to follow
        what other processes committed (the caches); ``legacy``: a store of schema 1 or 2,
        opened for its upgrade only."""
        self.conn = conn
        self.directory = directory
        self.lock = threading.RLock()
        self.closed = False
        self.read_only = False
        self.legacy = legacy
        self.writing = Writing()  # the side connection, on the thread writing audit rows alone
        self._changes = changes
        self._follow = follow
        self._held = Held(self)
        self._side: sqlite3.Connection | None = None
        self._side_lock = threading.Lock()
        self._durable = int(conn.execute("PRAGMA synchronous").fetchone()[0]) >= 2  # FULL or EXTRA
        self._turn = threading.Lock()  # one writer of this process waits for the write lock
        self._turn_fd: int | None = None

    def on_side(self) -> bool:
        """Whether this thread writes audit rows alone on the side connection."""
        return self.writing.conn is not None

    @contextmanager
    def side(self) -> Iterator[None]:
        """This thread's statements go to the side connection (opened at its first use)."""
        with self._side_lock:
            if self.closed:
                raise StoreError("the store is closed")
            if self._side is None:
                self._side = connect(self.directory / DB_NAME, self._durable)
        self.writing.conn = self._side  # used only inside the writer's turn, taken next
        try:
            yield
        finally:
            self.writing.conn = None

    def close(self, flush: Callable[[], None]) -> None:
        """Run ``flush`` and close the connections, after a write of this process in progress."""
        with self._turn, self.lock:
            if self.closed:
                return
            flush()
            self.conn.close()
            if self._side is not None:
                self._side.close()
            self.closed = True
            if self._turn_fd is not None:
                os.close(self._turn_fd)
                self._turn_fd = None

    def db(self) -> Held:
        return self._held

    def q(self, sql: str, args: Sequence[Any] = ()) -> Rows:
        return (self.writing.conn or self.conn).execute(sql, args)

    def many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        (self.writing.conn or self.conn).executemany(sql, rows)

    def flush(self) -> None:
        """Nothing to do: every statement was answered when it ran."""

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """``BEGIN IMMEDIATE``: writers of every process queue on SQLite's write lock (waiting
        at most :data:`BUSY_TIMEOUT_MS`); inside it the caches first follow what others committed."""
        side = self.writing.conn  # audit rows alone: nothing cached to follow or to update
        conn = side or self.conn
        if self.read_only:
            raise StoreError(f"{self.directory} is opened read-only (read-only media or no write permission)")
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise StoreError(f"the store is busy or cannot be written, nothing was written: {exc}") from exc
        try:
            if side is None:
                self._follow()  # moves the change generation past every earlier change elsewhere
            yield
            seen = self._changes.seen() if side is None else None
            conn.execute("COMMIT")
            if seen is not None:
                self._changes.committed(seen)
        except sqlite3.IntegrityError as exc:
            self._rollback()
            if getattr(exc, "sqlite_errorname", "") in ("SQLITE_CONSTRAINT_PRIMARYKEY", "SQLITE_CONSTRAINT_UNIQUE"):
                raise WriteConflict(
                    f"a record with this id is stored already (by another writer first), nothing was written: {exc}"
                ) from exc
            raise InvalidInput(f"write refused by the store: {exc}") from exc
        except sqlite3.OperationalError as exc:  # a full disk, an I/O error: at COMMIT too
            self._rollback()
            raise StoreError(f"the write failed and was rolled back, nothing was written: {exc}") from exc
        except BaseException:
            self._rollback()
            raise

    def lock_lanes(self, lanes: Sequence[int]) -> None:
        """A SQLite store has one lane, which its writer lock covers."""
        if list(lanes) != [0]:
            raise StoreError("a SQLite store has one lane")

    @contextmanager
    def writer_turn(self) -> Iterator[None]:
        """Writers queue here (a thread lock, then ``flock`` on ``DIR/writer.lock``) before they
        take the connection's lock and SQLite's: a process waiting for another's commit keeps
        serving reads, and the kernel hands the turn on as soon as it is free, where SQLite's
        own busy wait sleeps and polls (a busy process could starve the others). Only an order:
        SQLite's write lock still guards the data; no lock file (read-only media), no queue."""
        with self._turn:
            fd = self._turn_file()
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                if fd is not None:
                    fcntl.flock(fd, fcntl.LOCK_UN)

    def _turn_file(self) -> int | None:
        if self._turn_fd is None and not self.read_only:
            try:
                self._turn_fd = os.open(self.directory / "writer.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except OSError:
                return None
        return self._turn_fd

    def _rollback(self) -> None:
        conn = self.writing.conn or self.conn
        if conn.in_transaction:  # SQLite may have rolled back itself (SQLITE_FULL)
            conn.execute("ROLLBACK")

    def truncate_wal(self) -> bool:
        """Copy the WAL into the database and truncate it to zero bytes (after an erasure: its
        frames hold the pages as they were before). False when a reader of another connection
        still needs frames (the WAL is then emptied at a later checkpoint)."""
        busy, _, _ = self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        return not busy

    def reconnect_after_loss(self) -> None:
        raise StoreError("this store has no connection to lose")

    def add_tenant(self, tenant: str) -> None:
        add_tenant(self.conn, tenant)
        self.legacy = False

    def rewrite(self, table: str, sets: Mapping[str, object], tenant: str, record_id: str, patient_id: str) -> None:
        self.q(update_sql(table, list(sets)), (*sets.values(), tenant, record_id))

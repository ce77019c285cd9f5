"""The embedded store: one directory, SQLite (WAL) as the store of record, FAISS as a cache.

Layout of a store directory::

    DIR/msm-mem.sqlite         the store of record: records, vectors (float32 blobs), meta
    DIR/index/episodic.faiss   rebuildable IndexFlatIP caches, with a .json sidecar saying
    DIR/index/visual.faiss     how many rows they cover and the fingerprint of the last one
    DIR/index/episodic.graph   the HNSW graphs (8-bit codes of the vectors) when
    DIR/index/visual.graph     population_search="hnsw"; fingerprinted in the sidecar
    DIR/writer.lock            where writers of several processes queue (``flock``; empty)

A write is one SQLite transaction (``BEGIN IMMEDIATE`` ... ``COMMIT``, ``synchronous=FULL`` by
default) and the in-memory index changes only after it commits, so a crash loses at most the
write that was not yet acknowledged. On open, index files that are missing, stale or do not
match the database are caught up or rebuilt from the rows. What SQLite adds to the shared SQL
store: the FAISS search (``vectors.py``), the key table (``keys.py``) and read caches of the
decoded rows every turn reads (``readcache.py``, the reads it serves in ``cached_reads.py``),
kept exact with the change mark that triggers keep on the cached tables (``changes.py``):
another process's commit of audit rows alone (a read's events) empties nothing.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

from ..._errors import InvalidInput, StoreError
from ..._private import private_dir, private_file
from ..._records import Vector
from ..._settings import DEFAULT_EF_SEARCH, DEFAULT_TENANT, PopulationSearch, check_population_search, check_tenant
from ..._tier_records import ConsentRecord
from ..base import AuditChainer, VectorKind
from ..batch import WriteBatch
from ..codec import FieldCodec
from ..sql_core import Rows, insert_sql
from ..sql_rows import initial_meta, schema_problem
from ..sql_write import Moved
from .cached_reads import CachedReads
from .changes import ChangeMark, install
from .connection import Held, Writing, audit_only, connect, connect_read_only, writable
from .keys import SqliteKeyTable
from .readcache import ReadCache
from .schema import DB_NAME, FORMAT, SCHEMA, SCHEMA_VERSION
from .upgrade import add_indexes, add_tenant, read_meta
from .vectors import FaissVectors

__all__ = ["SqliteStore"]


class SqliteStore(CachedReads):
    """The embedded store of record. Thread-safe: one connection behind a lock, and a side
    connection for the writes of audit rows alone (``connection.py``)."""

    # ``+pos``, an expression: SQLite, without table statistics, takes an equality on the
    # tenant (one value in a store) for a selective one, and would read a patient's records by
    # walking the whole (tenant, pos) key in order rather than the patient index and a sort
    ORDER: ClassVar[dict[str, str]] = {
        "episodic": "+pos",
        "visual": "+pos",
        "semantic": "rowid",
        "claims": "rowid",
        "entities": "rowid",
        "relationships": "rowid",
    }
    HOLDS_NUL: ClassVar[bool] = True
    CURRENT_SCHEMA: ClassVar[str] = SCHEMA_VERSION
    INTEGRITY_ERROR: ClassVar[type[Exception]] = sqlite3.IntegrityError

    def __init__(
        self,
        directory: Path,
        conn: sqlite3.Connection,
        codec: FieldCodec | None = None,
        population_search: PopulationSearch = "exact",
        ef_search: int = DEFAULT_EF_SEARCH,
        tenant: str | None = None,
    ) -> None:
        self.population_search = check_population_search(population_search, ef_search)
        self.tenant, meta, self._legacy = read_meta(conn, directory, tenant)
        self.directory = directory
        self._conn = conn
        self._lock = threading.RLock()
        self._closed = False
        self._held = Held(self)
        self._writing = Writing()  # the side connection, on the thread writing audit rows alone
        self._side: sqlite3.Connection | None = None
        self._side_lock = threading.Lock()
        self._durable = int(conn.execute("PRAGMA synchronous").fetchone()[0]) >= 2  # FULL or EXTRA
        self._turn = threading.Lock()  # one writer of this process waits for the write lock
        self._turn_fd: int | None = None
        self._changes = ChangeMark(conn, None if self._legacy else self.tenant)
        self._cache = ReadCache(conn, self._changes.current)
        self._keys = SqliteKeyTable(conn, self._lock, self.tenant, self._changes.current, on_shred=self._cache.clear)
        self._consent_cache: dict[str, list[ConsentRecord]] = {}
        self._consent_version = -1
        self.read_only = False
        self._init_codec(codec)
        self.dim = int(meta["dim"])
        self.encoder_name = meta["encoder"]
        self.store_id = meta["store_id"]
        self.schema_version = meta.get("schema", "")
        self._vectors = FaissVectors(
            conn,
            self._lock,
            lambda: self._closed,
            lambda: self._writing.conn is not None,
            directory=directory,
            dim=self.dim,
            tenant=self.tenant,
            changes=self._changes,
            ef_search=ef_search if population_search == "hnsw" else None,
            load=not self._legacy,  # schema 1 or 2, opened for its upgrade only: nothing is searched
        )

    # opening ------------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        directory: str | Path,
        *,
        dim: int,
        encoder: str,
        codec: FieldCodec | None = None,
        durable: bool = True,
        population_search: PopulationSearch = "exact",
        ef_search: int = DEFAULT_EF_SEARCH,
        tenant: str = DEFAULT_TENANT,
    ) -> SqliteStore:
        """Create a new store in ``directory`` (created if needed; must not hold a store).

        PHI fields are refused until an encrypting ``codec`` is given here or to :meth:`use_codec`.
        ``population_search``: ``"exact"`` (default) or ``"hnsw"`` with search depth ``ef_search``
        (``vectors.py``); patient-scoped search is exact either way. ``tenant``: of every row."""
        check_population_search(population_search, ef_search)
        check_tenant(tenant)
        directory = Path(directory)
        if not isinstance(dim, int) or dim < 1:
            raise InvalidInput(f"dim must be a positive integer, got {dim!r}")
        if directory.exists() and not directory.is_dir():
            raise StoreError(f"{directory} exists and is not a directory")
        if (directory / DB_NAME).exists():
            raise StoreError(f"{directory} already holds a store")
        private_dir(directory)
        conn = connect(private_file(directory / DB_NAME), durable)  # the WAL takes the file's mode
        conn.executescript(SCHEMA)
        conn.execute("BEGIN")
        rows = [("format", FORMAT), ("schema", SCHEMA_VERSION), ("dim", str(dim)), ("encoder", encoder)]
        rows += [("store_id", uuid.uuid4().hex), *initial_meta()]
        conn.executemany(insert_sql("meta"), [(*row, tenant) for row in rows])
        conn.execute("COMMIT")
        try:
            install(conn, tenant)
        except BaseException:  # the store is made; its first writable open installs the marks
            conn.close()
            raise
        return cls(directory, conn, codec, population_search, ef_search)

    @classmethod
    def open(
        cls,
        directory: str | Path,
        *,
        codec: FieldCodec | None = None,
        durable: bool = True,
        upgrading: bool = False,
        population_search: PopulationSearch = "exact",
        ef_search: int = DEFAULT_EF_SEARCH,
        tenant: str | None = None,
    ) -> SqliteStore:
        """Open an existing store; a directory that is not one raises :class:`StoreError`, and
        so does a store of an older schema unless ``upgrading`` (for :meth:`upgrade` only).

        PHI fields are refused until an encrypting ``codec`` is given here or to :meth:`use_codec`.
        ``population_search`` and ``ef_search`` as for :meth:`create` (a cache of the other mode
        is converted on open). A ``tenant`` given must be the store's (an older one gets it)."""
        check_population_search(population_search, ef_search)
        directory = Path(directory)
        db = directory / DB_NAME
        if not db.is_file():
            raise StoreError(f"{directory} is not an msm-mem store (no {DB_NAME}); run `msm-mem init`")
        read_only = not writable(db)
        try:
            conn = connect_read_only(db) if read_only else connect(db, durable)
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.DatabaseError as exc:
            where = " (opened read-only: the file or its directory is not writable)" if read_only else ""
            raise StoreError(f"{db} is not a readable msm-mem database{where}: {exc}") from exc
        if meta.get("format") != FORMAT:
            conn.close()
            raise StoreError(f"{db} is not an msm-mem store (format {meta.get('format')!r})")
        problem = schema_problem(meta.get("schema"), SCHEMA_VERSION, upgrading)
        if problem:
            conn.close()
            raise StoreError(f"{db}: {problem}".replace("DIR", str(directory)))
        try:
            store = cls(directory, conn, codec, population_search, ef_search, tenant)
        except BaseException:
            conn.close()
            raise
        store.read_only = read_only
        if not read_only and not store._legacy:  # a store made before the change mark or an index gets it now
            try:
                with store._db():
                    install(conn, store.tenant)
                    add_indexes(conn)
            except sqlite3.IntegrityError as exc:
                store.close()
                raise StoreError(f"{db}: an index of the schema cannot be made, the rows break it: {exc}") from exc
            except sqlite3.OperationalError as exc:
                store.close()
                raise StoreError(f"{db}: the store is busy or cannot be written: {exc}") from exc
        if tenant is not None and store.tenant != tenant:
            store.close()
            raise InvalidInput(f"{directory} is the store of tenant {store.tenant!r}, not {tenant!r}")
        return store

    def flush(self) -> None:
        """Persist the FAISS caches (atomic replace); the database is always durable already.
        A cache that cannot be written (a full disk, read-only media) is rebuilt on open. A
        population graph's rebuild in flight is waited for first, and saved (``graph.py``)."""
        if self.read_only:
            return
        with self._db():
            self._vectors.save()

    def close(self) -> None:
        with self._turn, self._lock:  # after a write of this process in progress, if any
            if self._closed:
                return
            self.flush()
            self._conn.close()
            if self._side is not None:
                self._side.close()
            self._closed = True
            if self._turn_fd is not None:
                os.close(self._turn_fd)
                self._turn_fd = None

    def write(
        self,
        batch: WriteBatch,
        chain: AuditChainer | None = None,
        *,
        before_commit: Callable[[], None] | None = None,
    ) -> None:
        """:meth:`Store.write`; a batch of audit rows alone is written on the side connection
        (``connection.py``), so the reads of other threads do not wait for its commit."""
        if self.read_only or not audit_only(batch):
            super().write(batch, chain, before_commit=before_commit)
            return
        with self._side_lock:
            if self._closed:
                raise StoreError("the store is closed")
            if self._side is None:
                self._side = connect(self.directory / DB_NAME, self._durable)
        self._writing.conn = self._side  # used only inside the writer's turn, taken next
        try:
            super().write(batch, chain, before_commit=before_commit)
        finally:
            self._writing.conn = None

    def keys(self) -> SqliteKeyTable:
        return self._keys

    # vector search (``vectors.py``) ----------------------------------------------------------

    def search(self, kind: VectorKind, z: Vector, k: int, scope: str | None) -> list[tuple[str, float]]:
        return self._vectors.search(kind, z, k, scope)

    def search_many(
        self, z: Vector, requests: Sequence[tuple[VectorKind, int]], scope: str | None
    ) -> list[list[tuple[str, float]]]:
        return self._vectors.search_many(z, requests, scope)

    def max_cosine(self, z: Vector, kinds: Sequence[VectorKind], scope: str) -> float | None:
        return self._vectors.max_cosine(z, kinds, scope)

    def use_codec(self, codec: FieldCodec) -> None:
        with self._lock:
            super().use_codec(codec)
            self._cache.clear()

    # the dialect ---------------------------------------------------------------------------

    def _db(self) -> Held:
        return self._held

    def _q(self, sql: str, args: Sequence[Any] = ()) -> Rows:
        return (self._writing.conn or self._conn).execute(sql, args)

    def _many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        (self._writing.conn or self._conn).executemany(sql, rows)

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """``BEGIN IMMEDIATE``: writers of every process queue on SQLite's write lock (waiting
        at most :data:`BUSY_TIMEOUT_MS`); inside it the caches first follow what others committed."""
        side = self._writing.conn  # audit rows alone: nothing cached to follow or to update
        conn = side or self._conn
        if self.read_only:
            raise StoreError(f"{self.directory} is opened read-only (read-only media or no write permission)")
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise StoreError(f"the store is busy or cannot be written, nothing was written: {exc}") from exc
        try:
            if side is None:
                self._vectors.follow_others()  # moves the change generation past every earlier change elsewhere
            yield
            seen = self._changes.seen() if side is None else None
            conn.execute("COMMIT")
            if seen is not None:
                self._changes.committed(seen)
        except sqlite3.IntegrityError as exc:
            self._rollback()
            raise InvalidInput(f"write refused by the store: {exc}") from exc
        except sqlite3.OperationalError as exc:  # a full disk, an I/O error: at COMMIT too
            self._rollback()
            raise StoreError(f"the write failed and was rolled back, nothing was written: {exc}") from exc
        except BaseException:
            self._rollback()
            raise

    @contextmanager
    def _writer_turn(self) -> Iterator[None]:
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
        conn = self._writing.conn or self._conn
        if conn.in_transaction:  # SQLite may have rolled back itself (SQLITE_FULL)
            conn.execute("ROLLBACK")

    def _positions(self) -> dict[VectorKind, int]:
        return self._vectors.positions()

    def _vectors_added(self, kind: VectorKind, start: int, rows: list[tuple[Any, ...]]) -> None:
        self._vectors.vectors_added(kind, start, rows)

    def _add_tenant(self) -> None:
        add_tenant(self._conn, self.tenant)
        self._legacy = False
        self._cache.clear()  # the upgrade rewrites visual tags in this transaction

    def _committed(self, batch: WriteBatch, moved: list[Moved]) -> None:
        self._cache.committed(batch)
        if batch.consents or batch.revocations:
            self._consent_cache.clear()
        self._vectors.follow(batch, moved)

    # what other connections committed (the reads the caches serve: ``cached_reads.py``) ----

    def sync(self) -> None:
        """See what other connections committed (a grant, a revocation, a shred by the CLI while
        a server runs): empty the consent and key caches when the database changed. Called at
        the start of every governed turn and audit write, so caches never outlive one."""
        with self._db():
            self._vectors.follow_others()
            version = self._changes.current()
            if version != self._consent_version:
                self._consent_cache.clear()
                self._consent_version = version
            self._keys.sync(version)

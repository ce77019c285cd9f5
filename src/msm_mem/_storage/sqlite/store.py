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
match the database are caught up or rebuilt from the rows. The parts SQLite gives the shared
SQL store: its dialect and connections (``connection.py``), the FAISS vector part
(``vectors.py``), the key table (``keys.py``) and the read cache of the decoded rows every turn
reads (``readcache.py``, served by ``cached_reads.py``), kept exact with the change mark that
triggers keep on the cached tables (``changes.py``): another process's commit of audit rows
alone (a read's events) empties nothing.
"""

from __future__ import annotations

import logging
import sqlite3
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from ..._errors import InvalidInput, StoreError
from ..._private import private_dir, private_file
from ..._settings import DEFAULT_EF_SEARCH, DEFAULT_TENANT, PopulationSearch, check_population_search, check_tenant
from ..base import AuditChainer
from ..batch import WriteBatch
from ..codec import FieldCodec
from ..sql_core import SqlTables, insert_sql
from ..sql_rows import initial_meta, schema_problem
from ..sql_store import SqlStore
from ..sql_write import Moved
from .cached_reads import CachedReads
from .changes import ChangeMark, install
from .connection import SqliteDialect, audit_only, connect, connect_read_only, writable
from .keys import SqliteKeyTable
from .readcache import ReadCache
from .schema import DB_NAME, FORMAT, SCHEMA, SCHEMA_VERSION
from .upgrade import add_indexes, read_meta
from .vectors import FaissVectors

__all__ = ["SqliteStore"]

_log = logging.getLogger("msm_mem")


class SqliteStore(SqlStore):
    """The embedded store of record, built from parts over one SQLite connection: the dialect
    (``connection.py``), the FAISS vector part (``vectors.py``), the key table (``keys.py``)
    and the read cache (``cached_reads.py``). Thread-safe: one connection behind a lock, and a
    side connection for the writes of audit rows alone (``connection.py``)."""

    CURRENT_SCHEMA: ClassVar[str] = SCHEMA_VERSION
    _sql: SqliteDialect
    _vectors: FaissVectors

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
        found_tenant, meta, legacy = read_meta(conn, directory, tenant)
        self.directory = directory
        self._conn = conn
        self._changes = ChangeMark(conn, None if legacy else found_tenant)
        self._sql = SqliteDialect(conn, directory, self._changes, lambda: self._vectors.follow_others(), legacy=legacy)
        self._cached = CachedReads(self._sql, ReadCache(conn, self._changes.current))
        self._keys = SqliteKeyTable(
            conn, self._sql.lock, found_tenant, self._changes.current, on_shred=self._cached.clear
        )
        tables = SqlTables(self._sql, found_tenant)
        if codec is not None:
            tables.use_codec(codec)  # (nothing cached yet)
        dim = int(meta["dim"])
        self._vectors = FaissVectors(
            conn,
            self._sql.lock,
            lambda: self._sql.closed,
            self._sql.on_side,
            directory=directory,
            dim=dim,
            tenant=found_tenant,
            changes=self._changes,
            ef_search=ef_search if population_search == "hnsw" else None,
            load=not legacy,  # schema 1 or 2, opened for its upgrade only: nothing is searched
        )
        super().__init__(
            tables,
            cache=self._cached,
            vectors=self._vectors,
            keys=self._keys,
            committed=self._committed,
            dim=dim,
            encoder_name=meta["encoder"],
            store_id=meta["store_id"],
            schema_version=meta.get("schema", ""),
        )

    @property
    def read_only(self) -> bool:
        """Whether the store was opened read-only (read-only media or no write permission)."""
        return self._sql.read_only

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
        store._sql.read_only = read_only
        if not read_only and not store._sql.legacy:  # a store made before the change mark or an index gets it now
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
        self._sql.close(self.flush)  # after a write of this process in progress, if any

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
        with self._sql.side():
            super().write(batch, chain, before_commit=before_commit)

    def upgrade(
        self,
        chain: AuditChainer,
        reencode: Callable[[str, str, str], str | None],
        *,
        before_commit: Callable[[], None],
        check: Callable[[], None] | None = None,
    ) -> int:
        """:meth:`Store.upgrade`; the read cache is emptied first (the upgrade rewrites visual tags)."""
        with self._db():
            self._cached.clear()
        return super().upgrade(chain, reencode, before_commit=before_commit, check=check)

    def keys(self) -> SqliteKeyTable:
        return self._keys

    def use_codec(self, codec: FieldCodec) -> None:
        with self._sql.lock:
            super().use_codec(codec)
            self._cached.clear()

    def _committed(self, batch: WriteBatch, moved: list[Moved]) -> None:
        """Follow a batch this store has just committed: the read caches, the vector indexes."""
        self._cached.committed(batch)
        self._vectors.follow(batch, moved)
        if batch.erase:
            self._vectors.rebuild()
            if not self._sql.truncate_wal():
                _log.warning("the WAL is still read by another connection; a later checkpoint empties it")

    # what other connections committed (the reads the caches serve: ``cached_reads.py``) ----

    def sync(self) -> None:
        """See what other connections committed (a grant, a revocation, a shred by the CLI while
        a server runs): empty the consent and key caches when the database changed. Called at
        the start of every governed turn and audit write, so caches never outlive one."""
        with self._db():
            self._vectors.follow_others()
            version = self._changes.current()
            self._cached.sync(version)
            self._keys.sync(version)

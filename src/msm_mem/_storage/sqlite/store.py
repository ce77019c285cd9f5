"""The embedded store: one directory, SQLite (WAL) as the store of record, FAISS as a cache.

Layout of a store directory::

    DIR/msm-mem.sqlite         the store of record: records, vectors (float32 blobs), meta
    DIR/index/episodic.faiss   rebuildable IndexFlatIP caches, with a .json sidecar saying
    DIR/index/visual.faiss     how many rows they cover and the fingerprint of the last one

A write is one SQLite transaction (``BEGIN IMMEDIATE`` ... ``COMMIT``, ``synchronous=FULL`` by
default) and the in-memory index changes only after it commits, so a crash loses at most the
write that was not yet acknowledged. On open, index files that are missing, stale or do not
match the database are caught up or rebuilt from the rows. What SQLite adds to the shared SQL
store: the FAISS search (``vectors.py``), the key table (``keys.py``) and read caches of the
decoded rows every turn reads (``readcache.py``, consent records), kept exact with SQLite's
``PRAGMA data_version``.
"""

from __future__ import annotations

import sqlite3
import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

from ..._errors import InvalidInput, StoreError
from ..._private import private_dir, private_file
from ..._records import SemanticState
from ..._tier_records import ConsentRecord, Entity
from ..base import VectorKind
from ..batch import WriteBatch
from ..codec import FieldCodec
from ..sql_core import Rows
from ..sql_store import SqlStore
from ..sql_write import Moved
from .keys import SqliteKeyTable, data_version
from .readcache import ReadCache
from .schema import DB_NAME, FORMAT, SCHEMA, SCHEMA_VERSION
from .vectors import FaissVectors

__all__ = ["SqliteStore"]


def _connect(path: Path, durable: bool) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
    conn.execute("PRAGMA busy_timeout=5000")
    # checkpoint the WAL every 32 MiB rather than SQLite's 4 MiB: index pages that consecutive
    # group commits rewrite are copied into the database once, not once per commit or two
    conn.execute("PRAGMA wal_autocheckpoint=8192")
    return conn


class _Held:
    """The store's connection under its lock (re-entrant), refused once closed.

    A plain context manager rather than a generator one: every read takes it, often nested,
    and this costs what taking the lock costs."""

    __slots__ = ("_store",)

    def __init__(self, store: SqliteStore) -> None:
        self._store = store

    def __enter__(self) -> sqlite3.Connection:
        store = self._store
        store._lock.acquire()
        if store._closed:
            store._lock.release()
            raise StoreError("the store is closed")
        return store._conn

    def __exit__(self, *exc: object) -> None:
        self._store._lock.release()


class SqliteStore(FaissVectors, SqlStore):
    """The embedded store of record. Thread-safe (one connection behind a lock)."""

    ORDER: ClassVar[dict[str, str]] = {
        "episodic": "pos",
        "visual": "pos",
        "semantic": "rowid",
        "claims": "rowid",
        "entities": "rowid",
        "relationships": "rowid",
    }
    HOLDS_NUL: ClassVar[bool] = True
    INTEGRITY_ERROR: ClassVar[type[Exception]] = sqlite3.IntegrityError

    def __init__(self, directory: Path, conn: sqlite3.Connection, codec: FieldCodec | None = None) -> None:
        self.directory = directory
        self._conn = conn
        self._lock = threading.RLock()
        self._closed = False
        self._held = _Held(self)
        self._cache = ReadCache(conn)
        self._keys = SqliteKeyTable(conn, self._lock, on_shred=self._cache.clear)
        self._consent_cache: dict[str, list[ConsentRecord]] = {}
        self._consent_version = -1
        self._init_codec(codec)
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        missing = {"dim", "encoder", "tenant"} - set(meta)
        if missing:
            raise StoreError(f"{directory} is an incomplete msm-mem store (meta lacks {sorted(missing)})")
        self.dim = int(meta["dim"])
        self.encoder_name = meta["encoder"]
        self.tenant = meta["tenant"]
        self._open_indexes()

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
    ) -> SqliteStore:
        """Create a new store in ``directory`` (created if needed; must not hold a store).

        PHI fields are refused until an encrypting ``codec`` is given here or to :meth:`use_codec`."""
        directory = Path(directory)
        if not isinstance(dim, int) or dim < 1:
            raise InvalidInput(f"dim must be a positive integer, got {dim!r}")
        if directory.exists() and not directory.is_dir():
            raise StoreError(f"{directory} exists and is not a directory")
        if (directory / DB_NAME).exists():
            raise StoreError(f"{directory} already holds a store")
        private_dir(directory)
        conn = _connect(private_file(directory / DB_NAME), durable)  # the WAL takes the file's mode
        conn.executescript(SCHEMA)
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO meta VALUES (?, ?)",
            [
                ("format", FORMAT),
                ("schema", SCHEMA_VERSION),
                ("dim", str(dim)),
                ("encoder", encoder),
                ("tenant", uuid.uuid4().hex),
            ],
        )
        conn.execute("COMMIT")
        return cls(directory, conn, codec)

    @classmethod
    def open(cls, directory: str | Path, *, codec: FieldCodec | None = None, durable: bool = True) -> SqliteStore:
        """Open an existing store; a directory that is not one raises :class:`StoreError`.

        PHI fields are refused until an encrypting ``codec`` is given here or to :meth:`use_codec`."""
        directory = Path(directory)
        db = directory / DB_NAME
        if not db.is_file():
            raise StoreError(f"{directory} is not an msm-mem store (no {DB_NAME}); run `msm-mem init`")
        try:
            conn = _connect(db, durable)
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{db} is not a readable msm-mem database: {exc}") from exc
        if meta.get("format") != FORMAT:
            conn.close()
            raise StoreError(f"{db} is not an msm-mem store (format {meta.get('format')!r})")
        if meta.get("schema") != SCHEMA_VERSION:
            conn.close()
            raise StoreError(f"{db} has schema {meta.get('schema')!r}, expected {SCHEMA_VERSION}")
        return cls(directory, conn, codec)

    def flush(self) -> None:
        """Persist the FAISS caches (atomic replace); the database is always durable already."""
        with self._db():
            self._save_indexes()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self.flush()
            self._conn.close()
            self._closed = True

    def keys(self) -> SqliteKeyTable:
        return self._keys

    def use_codec(self, codec: FieldCodec) -> None:
        with self._lock:
            super().use_codec(codec)
            self._cache.clear()

    # the dialect ---------------------------------------------------------------------------

    def _db(self) -> _Held:
        return self._held

    def _q(self, sql: str, args: Sequence[Any] = ()) -> Rows:
        return self._conn.execute(sql, args)

    def _many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self._conn.executemany(sql, rows)

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
            conn.execute("COMMIT")
        except sqlite3.IntegrityError as exc:
            conn.execute("ROLLBACK")
            raise InvalidInput(f"write refused by the store: {exc}") from exc
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _positions(self) -> dict[VectorKind, int]:
        return dict(self._next)

    def _committed(self, batch: WriteBatch, moved: list[Moved]) -> None:
        self._cache.committed(batch)
        if batch.consents or batch.revocations:
            self._consent_cache.clear()
        self._follow(batch, moved)

    # cached reads --------------------------------------------------------------------------

    def sync(self) -> None:
        """See what other connections committed (a grant, a revocation, a shred by the CLI while
        a server runs): empty the consent and key caches when the database changed. Called at
        the start of every governed turn and audit write, so caches never outlive one."""
        with self._db():
            version = data_version(self._conn)
            if version != self._consent_version:
                self._consent_cache.clear()
                self._consent_version = version
            self._keys.sync(version)

    def semantic_active(self, patient_id: str, category: str | None = None) -> list[SemanticState]:
        with self._db():
            states = self._cache.semantic(patient_id, lambda: self._load_semantic(patient_id))
        return states if category is None else [s for s in states if s.category == category]

    def entities(self, patient_id: str) -> list[Entity]:
        with self._db():
            return self._cache.entities(patient_id, lambda: self._load_entities(patient_id))

    def consents(self, patient_id: str | None = None) -> list[ConsentRecord]:
        with self._db():
            if patient_id is None:
                return self._load_consents(None)
            if patient_id not in self._consent_cache:
                if len(self._consent_cache) > 10_000:
                    self._consent_cache.clear()
                self._consent_cache[patient_id] = self._load_consents(patient_id)
            return list(self._consent_cache[patient_id])

"""The embedded store: one directory, SQLite (WAL) as the store of record, FAISS as a cache.

Layout of a store directory::

    DIR/msm-mem.sqlite         the store of record: records, vectors (float32 blobs), meta
    DIR/index/episodic.faiss   rebuildable IndexFlatIP caches, with a .json sidecar saying
    DIR/index/visual.faiss     how many rows they cover and the fingerprint of the last one

A write is one SQLite transaction (``BEGIN IMMEDIATE`` ... ``COMMIT``, ``synchronous=FULL`` by
default) and the in-memory index changes only after it commits, so a crash loses at most the
write that was not yet acknowledged. On open, index files that are missing, stale or do not
match the database are caught up or rebuilt from the rows.
"""

from __future__ import annotations

import sqlite3
import threading
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from .._errors import IllegalTransition, InvalidInput, NotFound, StoreError
from .._records import EpisodicRecord, SemanticState, State, Vector, VisualRecord
from . import _sql
from ._readcache import ReadCache
from .base import FieldCodec, PlainCodec, StateChange, Store, VectorKind, WriteBatch
from .sqlite_gov import GOV_SCHEMA, GovernanceTables, insert_versions
from .sqlite_keys import SqliteKeyTable
from .vector_index import VectorIndex, vector_sha

__all__ = ["SqliteStore"]

DB_NAME = "msm-mem.sqlite"
FORMAT = "msm-mem-store"
SCHEMA_VERSION = "1"
_RETIRED = "\x00retired"  # scope of superseded / retracted vectors: never searched

SCHEMA = """
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE episodic(
  pos INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, patient_id TEXT NOT NULL,
  study_id TEXT NOT NULL, timestamp REAL NOT NULL, z BLOB NOT NULL, question TEXT NOT NULL,
  answer TEXT NOT NULL, decision TEXT NOT NULL, media_path TEXT NOT NULL,
  media_description TEXT NOT NULL, state TEXT NOT NULL, confidence REAL NOT NULL,
  evidence_tier TEXT NOT NULL, source TEXT NOT NULL, created_at REAL NOT NULL, decay_at REAL,
  supersedes TEXT);
CREATE INDEX episodic_patient ON episodic(patient_id, study_id);
CREATE TABLE visual(
  pos INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, patient_id TEXT NOT NULL,
  timestamp REAL NOT NULL, z BLOB NOT NULL, media_path TEXT NOT NULL, visual_tag TEXT NOT NULL,
  source_episode_id TEXT NOT NULL, state TEXT NOT NULL, confidence REAL NOT NULL,
  evidence_tier TEXT NOT NULL, source TEXT NOT NULL, created_at REAL NOT NULL, decay_at REAL,
  supersedes TEXT);
CREATE INDEX visual_patient ON visual(patient_id);
CREATE TABLE semantic(
  id TEXT PRIMARY KEY, patient_id TEXT NOT NULL, category TEXT NOT NULL,
  version INTEGER NOT NULL, state TEXT NOT NULL, created_at REAL NOT NULL, supersedes TEXT,
  evidence_tier TEXT NOT NULL, impressions TEXT NOT NULL);
CREATE UNIQUE INDEX semantic_one_active ON semantic(patient_id, category) WHERE state = 'active';
CREATE INDEX semantic_key ON semantic(patient_id, category, version);
"""


def _connect(path: Path, durable: bool) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
    conn.execute("PRAGMA busy_timeout=5000")
    # checkpoint the WAL every 32 MiB rather than SQLite's 4 MiB: index pages that consecutive
    # group commits rewrite are copied into the database once, not once per commit or two
    conn.execute("PRAGMA wal_autocheckpoint=8192")
    return conn


class SqliteStore(GovernanceTables, Store):
    """The embedded store of record. Thread-safe (one connection behind a lock)."""

    def __init__(self, directory: Path, conn: sqlite3.Connection, codec: FieldCodec) -> None:
        self.directory = directory
        self._conn = conn
        self._codec = codec
        self._lock = threading.RLock()
        self._closed = False
        self._cache = ReadCache(conn)
        self._keys = SqliteKeyTable(conn, self._lock, on_shred=self._cache.clear)
        self._consent_cache = {}
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        missing = {"dim", "encoder", "tenant"} - set(meta)
        if missing:
            raise StoreError(f"{directory} is an incomplete msm-mem store (meta lacks {sorted(missing)})")
        self.dim = int(meta["dim"])
        self.encoder_name = meta["encoder"]
        self.tenant = meta["tenant"]
        self._index: dict[VectorKind, VectorIndex] = {}
        self._ids: dict[VectorKind, list[str]] = {}  # position -> record id
        self._next: dict[VectorKind, int] = {}
        for kind in ("episodic", "visual"):
            self._index[kind], self._ids[kind] = self._open_index(kind)
            self._next[kind] = self._index[kind].ntotal

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
        """Create a new store in ``directory`` (created if needed; must not hold a store)."""
        directory = Path(directory)
        if not isinstance(dim, int) or dim < 1:
            raise InvalidInput(f"dim must be a positive integer, got {dim!r}")
        if directory.exists() and not directory.is_dir():
            raise StoreError(f"{directory} exists and is not a directory")
        if (directory / DB_NAME).exists():
            raise StoreError(f"{directory} already holds a store")
        directory.mkdir(parents=True, exist_ok=True)
        conn = _connect(directory / DB_NAME, durable)
        conn.executescript(SCHEMA + GOV_SCHEMA)
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
        return cls(directory, conn, codec or PlainCodec())

    @classmethod
    def open(cls, directory: str | Path, *, codec: FieldCodec | None = None, durable: bool = True) -> SqliteStore:
        """Open an existing store; a directory that is not one raises :class:`StoreError`."""
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
        return cls(directory, conn, codec or PlainCodec())

    def _index_path(self, kind: VectorKind) -> Path:
        return self.directory / "index" / f"{kind}.faiss"

    def _blob_at(self, kind: VectorKind, pos: int) -> bytes | None:
        row = self._conn.execute(f"SELECT z FROM {kind} WHERE pos = ?", (pos,)).fetchone()
        return None if row is None else bytes(row[0])

    def _open_index(self, kind: VectorKind) -> tuple[VectorIndex, list[str]]:
        count = self._conn.execute(f"SELECT COUNT(*) FROM {kind}").fetchone()[0]
        loaded = VectorIndex.load(self._index_path(kind), self.dim)
        index, start = VectorIndex(self.dim), 0
        if loaded is not None:
            cached, side = loaded
            n = cached.ntotal
            tail = self._blob_at(kind, n - 1) if n else b""
            if n <= count and (n == 0 or (tail is not None and side.get("last_sha") == vector_sha(tail))):
                index, start = cached, n
        scopes: list[str] = []
        ids: list[str] = []
        for rid, pid, state in self._conn.execute(f"SELECT id, patient_id, state FROM {kind} ORDER BY pos"):
            ids.append(rid)
            scopes.append(pid if state in (State.ACTIVE, State.ANONYMIZED) else _RETIRED)
        index.add_scopes_only(scopes[:start], 0)
        cursor = self._conn.execute(f"SELECT z FROM {kind} WHERE pos >= ? ORDER BY pos", (start,))
        pos = start
        while chunk := cursor.fetchmany(8192):
            mat = np.frombuffer(b"".join(bytes(r[0]) for r in chunk), dtype=np.float32)
            index.add(mat.reshape(len(chunk), self.dim), scopes[pos : pos + len(chunk)])
            pos += len(chunk)
        if pos != count:
            raise StoreError(f"{kind}: rows are not numbered 0..{count - 1}; the store is damaged")
        return index, ids

    def flush(self) -> None:
        """Persist the FAISS caches (atomic replace); the database is always durable already."""
        with self._lock:
            self._check_open()
            (self.directory / "index").mkdir(exist_ok=True)
            for kind, index in self._index.items():
                n = index.ntotal
                tail = self._blob_at(kind, n - 1) if n else b""
                index.save(self._index_path(kind), vector_sha(tail or b""))

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self.flush()
            self._conn.close()
            self._closed = True

    def keys(self) -> SqliteKeyTable:
        return self._keys

    # writing ------------------------------------------------------------------------------

    def _check_vector(self, z: Vector, what: str) -> None:
        _sql.check_vector(z, self.dim, what)

    def write(self, batch: WriteBatch) -> None:
        for e in batch.episodes:
            self._check_vector(e.z, f"episode {e.episode_id}")
        for v in batch.visuals:
            self._check_vector(v.z, f"visual {v.visual_id}")
        with self._lock:
            self._check_open()
            moves: list[tuple[VectorKind, int, str, str, str]] = []
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                moves = self._apply(batch)
                conn.execute("COMMIT")
            except sqlite3.IntegrityError as exc:
                conn.execute("ROLLBACK")
                raise InvalidInput(f"write refused by the store: {exc}") from exc
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            self._after_commit(batch, moves)

    def _apply(self, batch: WriteBatch) -> list[tuple[VectorKind, int, str, str, str]]:
        conn, codec = self._conn, self._codec
        e_pos, v_pos = self._next["episodic"], self._next["visual"]
        if batch.episodes:
            conn.executemany(
                f"INSERT INTO episodic VALUES ({','.join('?' * len(_sql.EPISODIC_COLUMNS))})",
                [_sql.episode_to_row(e, e_pos + i, codec) for i, e in enumerate(batch.episodes)],
            )
        if batch.visuals:
            conn.executemany(
                f"INSERT INTO visual VALUES ({','.join('?' * len(_sql.VISUAL_COLUMNS))})",
                [_sql.visual_to_row(v, v_pos + i, codec) for i, v in enumerate(batch.visuals)],
            )
        moves = [m for c in batch.changes if (m := self._apply_change(c)) is not None]
        self._apply_governance(batch)
        insert_versions(
            conn,
            "semantic",
            "category",
            batch.semantic,
            ident=lambda s: s.state_id,
            key=lambda s: s.category,
            to_row=lambda s: _sql.semantic_to_row(s, codec),
            restore=batch.restore,
        )
        return moves

    def _apply_change(self, c: StateChange) -> tuple[VectorKind, int, str, str, str] | None:
        conn = self._conn
        table = c.table
        if table not in _sql.CHANGEABLE:
            raise InvalidInput(f"unknown table {table!r}")
        row = conn.execute(
            f"SELECT patient_id, state{', pos' if table in ('episodic', 'visual') else ''} FROM {table} WHERE id = ?",
            (c.record_id,),
        ).fetchone()
        if row is None:
            raise NotFound(f"no {table} record {c.record_id!r}")
        if row[1] != c.expect.value:
            raise IllegalTransition(f"{table} record {c.record_id!r} is {row[1]}, expected {c.expect.value}")
        old_pid = row[0]
        sets = _sql.change_sets(c, old_pid, self._codec)
        new_pid, new_id = str(sets["patient_id"]), str(sets["id"])
        assignments = ", ".join(f"{k} = ?" for k in sets)
        conn.execute(f"UPDATE {table} SET {assignments} WHERE id = ?", (*sets.values(), c.record_id))
        if table not in ("episodic", "visual"):
            return None
        live = c.to in (State.ACTIVE, State.ANONYMIZED)
        kind: VectorKind = "episodic" if table == "episodic" else "visual"
        old_scope = old_pid if c.expect in (State.ACTIVE, State.ANONYMIZED) else _RETIRED
        return (kind, int(row[2]), old_scope, new_pid if live else _RETIRED, new_id)

    def use_codec(self, codec: FieldCodec) -> None:
        with self._lock:
            self._cache.clear()
            self._codec = codec

    def _after_commit(self, batch: WriteBatch, moves: list[tuple[VectorKind, int, str, str, str]]) -> None:
        self._cache.committed(batch)
        if batch.episodes:
            mat = np.stack([e.z for e in batch.episodes])
            self._index["episodic"].add(mat, [e.patient_id for e in batch.episodes])
            self._ids["episodic"].extend(e.episode_id for e in batch.episodes)
            self._next["episodic"] += len(batch.episodes)
        if batch.visuals:
            mat = np.stack([v.z for v in batch.visuals])
            self._index["visual"].add(mat, [v.patient_id for v in batch.visuals])
            self._ids["visual"].extend(v.visual_id for v in batch.visuals)
            self._next["visual"] += len(batch.visuals)
        for kind, pos, old, new, new_id in moves:
            self._ids[kind][pos] = new_id
            if old != new:
                self._index[kind].move(pos, old, new)

    # reading ------------------------------------------------------------------------------

    def search(self, kind: VectorKind, z: Vector, k: int, scope: str | None) -> list[tuple[str, float]]:
        return self.search_many(z, [(kind, k)], scope)[0]

    def search_many(
        self, z: Vector, requests: Sequence[tuple[VectorKind, int]], scope: str | None
    ) -> list[list[tuple[str, float]]]:
        _sql.check_vector(z, self.dim, "query")
        with self._lock:
            if self._closed:
                raise StoreError("the store is closed")
            if scope is None:
                return [self._search_population(kind, z, k) for kind, k in requests]
            if scope == _RETIRED:
                return [[] for _ in requests]
            neg_z = -z
            return [self._index[kind].top_k(neg_z, k, scope, self._ids[kind]) for kind, k in requests]

    def max_cosine(self, z: Vector, kinds: Sequence[VectorKind], scope: str) -> float | None:
        _sql.check_vector(z, self.dim, "query")
        if scope == _RETIRED:
            return None
        with self._lock:
            if self._closed:
                raise StoreError("the store is closed")
            scores = [s for kind in kinds if (s := self._index[kind].max_score(z, scope)) is not None]
        return max(scores) if scores else None

    def _search_population(self, kind: VectorKind, z: Vector, k: int) -> list[tuple[str, float]]:
        index = self._index[kind]
        hits = index.search(z, k + self._retired_count(kind), None)
        retired = set(index.positions(_RETIRED).tolist())
        ids = self._ids[kind]
        return [(ids[p], s) for p, s in hits if p not in retired][:k]

    def _retired_count(self, kind: VectorKind) -> int:
        return int(self._index[kind].positions(_RETIRED).size)

    def find_episodes(self, ids: Sequence[str]) -> dict[str, EpisodicRecord]:
        return self._find("episodic", ids, _sql.episode_from_row)

    def _find(self, table: str, ids: Sequence[str], conv: Any) -> dict[str, Any]:
        found: dict[str, Any] = {}
        unique = list(dict.fromkeys(ids))
        with self._lock:
            self._check_open()
            for start in range(0, len(unique), 500):
                part = unique[start : start + 500]
                marks = ",".join("?" * len(part))
                for row in self._conn.execute(f"SELECT * FROM {table} WHERE id IN ({marks})", part):
                    found[row[1]] = conv(row, self._codec)
        return found

    def _get(self, table: str, ids: Sequence[str], conv: Any) -> list[Any]:
        if not ids:
            return []
        found = self._find(table, ids, conv)
        missing = [i for i in ids if i not in found]
        if missing:
            raise NotFound(f"no {table} record {missing[0]!r}")
        return [found[i] for i in ids]

    def get_episodes(self, ids: Sequence[str]) -> list[EpisodicRecord]:
        return self._get("episodic", ids, _sql.episode_from_row)

    def get_visuals(self, ids: Sequence[str]) -> list[VisualRecord]:
        return self._get("visual", ids, _sql.visual_from_row)

    def semantic_active(self, patient_id: str, category: str | None = None) -> list[SemanticState]:
        with self._lock:
            self._check_open()
            states = self._cache.semantic(patient_id, lambda: self._load_semantic(patient_id))
        return states if category is None else [s for s in states if s.category == category]

    def _load_semantic(self, patient_id: str) -> list[SemanticState]:
        rows = self._conn.execute(
            "SELECT * FROM semantic WHERE patient_id = ? AND state = 'active' ORDER BY category", (patient_id,)
        ).fetchall()
        return [_sql.semantic_from_row(r, self._codec) for r in rows]

    def semantic_history(self, patient_id: str, category: str) -> list[SemanticState]:
        with self._lock:
            self._check_open()
            rows = self._conn.execute(
                "SELECT * FROM semantic WHERE patient_id = ? AND category = ? ORDER BY version",
                (patient_id, category),
            ).fetchall()
            return [_sql.semantic_from_row(r, self._codec) for r in rows]

    def _iter(self, table: str, conv: Any, order: str) -> Iterator[Any]:
        offset = 0
        while True:
            with self._lock:
                self._check_open()
                rows = self._conn.execute(
                    f"SELECT * FROM {table} ORDER BY {order} LIMIT 1000 OFFSET ?", (offset,)
                ).fetchall()
                records = [conv(r, self._codec) for r in rows]
            yield from records
            if len(rows) < 1000:
                return
            offset += len(rows)

    def iter_episodes(self) -> Iterator[EpisodicRecord]:
        return self._iter("episodic", _sql.episode_from_row, "pos")

    def iter_visuals(self) -> Iterator[VisualRecord]:
        return self._iter("visual", _sql.visual_from_row, "pos")

    def iter_semantic(self) -> Iterator[SemanticState]:
        return self._iter("semantic", _sql.semantic_from_row, "patient_id, category, version")

    def count(self, kind: Literal["episodic", "visual", "semantic"]) -> int:
        if kind not in ("episodic", "visual", "semantic"):
            raise InvalidInput(f"unknown table {kind!r}")
        with self._lock:
            self._check_open()
            return int(self._conn.execute(f"SELECT COUNT(*) FROM {kind}").fetchone()[0])

    def patients(self) -> list[str]:
        with self._lock:
            self._check_open()
            rows = self._conn.execute(
                "SELECT patient_id FROM episodic UNION SELECT patient_id FROM visual"
                " UNION SELECT patient_id FROM semantic"
            ).fetchall()
        return sorted(r[0] for r in rows if r[0])

    def has_patient(self, patient_id: str) -> bool:
        with self._lock:
            self._check_open()
            for table in ("episodic", "semantic", "visual"):
                q = f"SELECT 1 FROM {table} WHERE patient_id = ? LIMIT 1"
                if self._conn.execute(q, (patient_id,)).fetchone():
                    return bool(patient_id)
        return False

    def record_ids(self, table: str, patient_id: str) -> list[str]:
        if table not in ("episodic", "visual", "semantic", "claims"):
            raise InvalidInput(f"unknown table {table!r}")
        with self._lock:
            self._check_open()
            rows = self._conn.execute(
                f"SELECT id, state FROM {table} WHERE patient_id = ? ORDER BY rowid", (patient_id,)
            )
            return [r[0] for r in rows if r[1] in ("active", "superseded")]

    def studies(self, patient_id: str) -> set[str]:
        with self._lock:
            self._check_open()
            rows = self._conn.execute("SELECT study_id FROM episodic WHERE patient_id = ?", (patient_id,)).fetchall()
        return {r[0] for r in rows if r[0]}

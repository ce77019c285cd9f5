"""The embedded store's vector search: FAISS indexes over the vectors of the database.

The i-th episodic (visual) row has vector position i in its index. Each position carries a
scope: the patient id of a live (ACTIVE or ANONYMIZED) record, or :data:`RETIRED` for one that
is superseded or retracted, which no search returns. The indexes are caches: they are saved
beside the database by :meth:`FaissVectors.flush` and caught up or rebuilt from the rows on open.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..._errors import StoreError
from ..._private import private_dir
from ..._records import State, Vector
from ..base import VectorKind
from ..batch import WriteBatch
from ..rows import check_vector
from ..sql_write import Moved
from .vector_index import VectorIndex, vector_sha

__all__ = ["RETIRED", "FaissVectors"]

RETIRED = "\x00retired"  # scope of superseded / retracted vectors: never searched
_LIVE = (State.ACTIVE, State.ANONYMIZED)


class FaissVectors:
    """Search, and the indexes following the committed writes (mixed into the SQLite store)."""

    directory: Path
    dim: int
    _conn: sqlite3.Connection
    _lock: threading.RLock
    _closed: bool
    _index: dict[VectorKind, VectorIndex]
    _ids: dict[VectorKind, list[str]]  # position -> record id
    _next: dict[VectorKind, int]

    def _open_indexes(self) -> None:
        self._index, self._ids, self._next = {}, {}, {}
        for kind in ("episodic", "visual"):
            self._index[kind], self._ids[kind] = self._open_index(kind)
            self._next[kind] = self._index[kind].ntotal

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
            scopes.append(pid if state in _LIVE else RETIRED)
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

    def _save_indexes(self) -> None:
        private_dir(self.directory / "index")
        for kind, index in self._index.items():
            n = index.ntotal
            tail = self._blob_at(kind, n - 1) if n else b""
            index.save(self._index_path(kind), vector_sha(tail or b""))

    def _follow(self, batch: WriteBatch, moved: list[Moved]) -> None:
        """Follow a committed batch: its vectors at the next positions, its state changes."""
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
        for m in moved:
            old = m.old_patient_id if m.expect in _LIVE else RETIRED
            new = m.new_patient_id if m.to in _LIVE else RETIRED
            self._ids[m.kind][m.pos] = m.new_id
            if old != new:
                self._index[m.kind].move(m.pos, old, new)

    def search(self, kind: VectorKind, z: Vector, k: int, scope: str | None) -> list[tuple[str, float]]:
        return self.search_many(z, [(kind, k)], scope)[0]

    def search_many(
        self, z: Vector, requests: Sequence[tuple[VectorKind, int]], scope: str | None
    ) -> list[list[tuple[str, float]]]:
        check_vector(z, self.dim, "query")
        with self._lock:
            if self._closed:
                raise StoreError("the store is closed")
            if scope is None:
                return [self._search_population(kind, z, k) for kind, k in requests]
            if scope == RETIRED:
                return [[] for _ in requests]
            neg_z = -z
            return [self._index[kind].top_k(neg_z, k, scope, self._ids[kind]) for kind, k in requests]

    def max_cosine(self, z: Vector, kinds: Sequence[VectorKind], scope: str) -> float | None:
        check_vector(z, self.dim, "query")
        if scope == RETIRED:
            return None
        with self._lock:
            if self._closed:
                raise StoreError("the store is closed")
            scores = [s for kind in kinds if (s := self._index[kind].max_score(z, scope)) is not None]
        return max(scores) if scores else None

    def _search_population(self, kind: VectorKind, z: Vector, k: int) -> list[tuple[str, float]]:
        index = self._index[kind]
        retired = index.positions(RETIRED)
        hits = index.search(z, k + int(retired.size), None)
        skip = set(retired.tolist())
        ids = self._ids[kind]
        return [(ids[p], s) for p, s in hits if p not in skip][:k]

"""The embedded store's vector search: FAISS indexes over the vectors of the database.

The i-th episodic (visual) row has vector position i in its index. Each position carries a
scope: the patient id of a live (ACTIVE or ANONYMIZED) record, or :data:`RETIRED` for one that
is superseded or retracted, which no search returns. The indexes are caches: they are saved
beside the database by :meth:`FaissVectors.save` and caught up or rebuilt from the rows on open.
Population search is exact by default; with ``population_search="hnsw"`` it is an HNSW graph
(``graph.py``) built and kept in step the same way (its file fingerprinted in the sidecar).

The store of record vouches for its caches: every write that adds vectors also advances, in
its transaction, a running digest of them (``meta``: ``vectors_<kind>`` = ``count:sha256``,
``d_i = sha256(d_{i-1} || blob_i)`` from 32 zero bytes). On open the cached vectors plus the
rows past them must reproduce that digest, or the cache is thrown away and rebuilt from the
rows (a stale, truncated or overwritten cache file never serves a search). A change by another
process to the vector tables (the store's change marks, ``changes.py``: commits of audit rows
alone do not count) is followed before the next turn and inside every write: the rows appended
are read past the index's end and the rows updated, which the moved mark names, read again;
when it cannot name them (a delete, a new epoch), the scope and id of every position.

An erasure (``erase.py``) replaces vectors by zero vectors in place: in its transaction the
running digest is recomputed over every stored vector and the ``vectors_erased`` mark of
``meta`` is given a new random value; once it commits, the indexes and graphs are rebuilt from
the rows and saved at once, so no cache file keeps an erased vector. Every other handle sees
the mark move at its next follow and rebuilds its indexes from the rows as well; until then it
never saves its caches (they may still hold an erased vector).
"""

from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ..._errors import StoreError
from ..._private import private_dir
from ..._records import State, Vector
from ..base import VectorKind
from ..batch import WriteBatch
from ..rows import EPISODIC_COLUMNS, VISUAL_COLUMNS, check_vector
from ..sql_core import UPSERT_META
from ..sql_write import Moved
from .changes import ChangeMark, moved_positions
from .vector_index import VectorIndex, graph_path, vector_sha

__all__ = ["RETIRED", "FaissVectors"]

RETIRED = "\x00retired"  # scope of superseded / retracted vectors: never searched
_LIVE = (State.ACTIVE, State.ANONYMIZED)
_KINDS: tuple[VectorKind, VectorKind] = ("episodic", "visual")
_Z: dict[VectorKind, int] = {"episodic": EPISODIC_COLUMNS.index("z"), "visual": VISUAL_COLUMNS.index("z")}
_GENESIS = bytes(32)
_log = logging.getLogger("msm_mem")


def chain_digest(digest: bytes, blobs: Sequence[bytes]) -> bytes:
    """Continue the running digest of stored vectors over ``blobs`` (float32 bytes, in order)."""
    sha = hashlib.sha256
    for blob in blobs:
        digest = sha(digest + blob).digest()
    return digest


def _digest_key(kind: VectorKind) -> str:
    return f"vectors_{kind}"


#: the ``meta`` key an erasure gives a new random value (see the module)
ERASED_KEY = "vectors_erased"


class FaissVectors:
    """The SQLite store's vector search part: the FAISS caches over its connection's rows, and
    those caches following the committed writes (its own, and other processes')."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        lock: threading.RLock,
        closed: Callable[[], bool],
        on_side: Callable[[], bool],
        *,
        directory: Path,
        dim: int,
        tenant: str,
        changes: ChangeMark,
        ef_search: int | None,
        load: bool = True,
    ) -> None:
        """``conn`` is the store's connection and ``lock`` its lock; ``closed`` says whether the
        store is closed, ``on_side`` whether this thread writes audit rows alone on the side
        connection (it places no vector). ``ef_search`` None: exact population search, else the
        HNSW graph's search depth. ``load`` False (a store opened for its upgrade only): no
        index is opened and nothing is searched."""
        self.directory = directory
        self.dim = dim
        self.tenant = tenant
        self._conn = conn
        self._lock = lock
        self._is_closed = closed
        self._on_side = on_side
        self._changes = changes
        self._ef_search = ef_search
        self._seen_version = changes.current()  # before reading the rows: a later change is followed
        self._seen_moved = changes.moved()
        # before reading the rows, as the marks above (a store opened for its upgrade has none)
        self._seen_erased = self._erased_mark() if load else None
        self._index: dict[VectorKind, VectorIndex] = {}
        self._ids: dict[VectorKind, list[str]] = {}  # position -> record id
        self._next: dict[VectorKind, int] = {}
        if load:
            self._open_indexes()

    def _open_indexes(self) -> None:
        """Every kind's index, its rows, vectors and recorded digest read in one read snapshot:
        another process appending meanwhile is followed later (the marks were read before),
        never seen half (rows counted in one snapshot, vectors read in the next)."""
        self._index, self._ids, self._next = {}, {}, {}
        with self._snapshot():
            for kind in _KINDS:
                self._index[kind], self._ids[kind] = self._open_index(kind)
                self._next[kind] = self._index[kind].ntotal

    @contextmanager
    def _snapshot(self) -> Iterator[None]:
        """One read transaction around several reads (none when a transaction is open already)."""
        if self._conn.in_transaction:
            yield
            return
        self._conn.execute("BEGIN")
        try:
            yield
        finally:
            if self._conn.in_transaction:
                self._conn.execute("COMMIT")

    def _erased_mark(self) -> str | None:
        row = self._conn.execute(
            "SELECT value FROM meta WHERE tenant = ? AND key = ?", (self.tenant, ERASED_KEY)
        ).fetchone()
        return None if row is None else str(row[0])

    def vectors_erased(self, kind: VectorKind) -> None:
        """Inside an erasure's transaction, after vectors of ``kind`` were replaced by zero
        vectors: the running digest recomputed over every stored vector, the erased mark moved."""
        rows = self._conn.execute(f"SELECT z FROM {kind} WHERE tenant = ? ORDER BY pos", (self.tenant,))
        count, digest = 0, _GENESIS
        while chunk := rows.fetchmany(8192):
            digest = chain_digest(digest, [bytes(r[0]) for r in chunk])
            count += len(chunk)
        self._conn.execute(UPSERT_META, (_digest_key(kind), f"{count}:{digest.hex()}", self.tenant))
        self._conn.execute(UPSERT_META, (ERASED_KEY, os.urandom(16).hex(), self.tenant))

    def rebuild(self) -> None:
        """After this handle's erasure committed: every index and graph rebuilt from the rows and
        saved, so no cache file keeps an erased vector. A cache that cannot be written (a full
        disk) is deleted instead: the next open rebuilds it from the rows."""
        self._seen_erased = self._erased_mark()
        self._rebuild_from_rows()
        try:
            self._write_indexes()
        except (OSError, RuntimeError) as exc:  # FAISS reports a failed write as RuntimeError
            _log.warning("the vector caches were not saved after an erasure (%s); deleting them", exc)
            for kind in _KINDS:
                path = self._index_path(kind)
                for stale in (path, graph_path(path), path.with_suffix(".json")):
                    stale.unlink(missing_ok=True)

    def _rebuild_from_rows(self) -> None:
        for kind in list(self._index):
            with self._snapshot():
                built = self._load_rows(kind, VectorIndex(self.dim, self._ef_search), 0, None, link=False)
            assert built is not None  # no digest is checked: only more vectors than rows gives None
            built[0].link()
            self._index[kind], self._ids[kind] = built
            self._next[kind] = built[0].ntotal

    def _index_path(self, kind: VectorKind) -> Path:
        return self.directory / "index" / f"{kind}.faiss"

    def _blob_at(self, kind: VectorKind, pos: int) -> bytes | None:
        row = self._conn.execute(f"SELECT z FROM {kind} WHERE tenant = ? AND pos = ?", (self.tenant, pos)).fetchone()
        return None if row is None else bytes(row[0])

    def _recorded_digest(self, kind: VectorKind) -> tuple[int, bytes] | None:
        """``(count, digest)`` the database records for its vectors (None in a store made before)."""
        row = self._conn.execute(
            "SELECT value FROM meta WHERE tenant = ? AND key = ?", (self.tenant, _digest_key(kind))
        ).fetchone()
        if row is None:
            return None
        count, digest = str(row[0]).split(":", 1)
        return int(count), bytes.fromhex(digest)

    def positions(self, lane: int = 0, lanes: int = 1) -> dict[VectorKind, int]:
        """The next vector position of each kind (inside the write transaction): the rows every
        writer has committed, which the indexes must have followed. A SQLite store has one lane."""
        if lanes != 1:
            raise StoreError("a SQLite store has one lane")
        if self._on_side():  # audit rows alone: no vector is placed
            return dict(self._next)
        stored = {
            kind: int(
                self._conn.execute(
                    f"SELECT COALESCE(MAX(pos) + 1, 0) FROM {kind} WHERE tenant = ?", (self.tenant,)
                ).fetchone()[0]
            )
            for kind in _KINDS
        }
        if stored != self._next:
            raise StoreError(f"the vector index does not follow the rows ({self._next} vs {stored})")
        return stored

    def vector_rows(self, kind: VectorKind, rows: list[tuple[object, ...]]) -> Sequence[Sequence[object]]:
        """Rows as SQLite takes them: the ``z`` blob is stored as given."""
        return rows

    def vectors_added(self, kind: VectorKind, start: int, rows: list[tuple[object, ...]]) -> None:
        """Inside the write transaction, after inserting vector rows at ``start``: advance the
        running digest of the stored vectors."""
        recorded = self._recorded_digest(kind)
        if recorded is None or recorded[0] != start:  # first write since the digest was introduced
            old = self._conn.execute(
                f"SELECT z FROM {kind} WHERE tenant = ? AND pos < ? ORDER BY pos", (self.tenant, start)
            )
            recorded = (start, chain_digest(_GENESIS, [bytes(r[0]) for r in old]))
        digest = chain_digest(recorded[1], [bytes(r[_Z[kind]]) for r in rows])  # type: ignore[call-overload]
        self._conn.execute(UPSERT_META, (_digest_key(kind), f"{start + len(rows)}:{digest.hex()}", self.tenant))

    def _open_index(self, kind: VectorKind) -> tuple[VectorIndex, list[str]]:
        recorded = self._recorded_digest(kind)
        loaded = VectorIndex.load(self._index_path(kind), self.dim, self._ef_search) if recorded is not None else None
        if loaded is not None:
            cached = loaded[0]
            view = cached.vectors()
            prefix = chain_digest(_GENESIS, [view[i].tobytes() for i in range(cached.ntotal)])
            built = self._load_rows(kind, cached, cached.ntotal, prefix, link=False)
            if built is not None:
                built[0].link()  # a graph rebuilt from the vectors (load), once they are vouched for
                return built
            _log.warning("the %s vector cache does not match the store; rebuilding it from the rows", kind)
        elif recorded is not None and self._index_path(kind).is_file():
            _log.warning("the %s vector cache is unreadable or damaged; rebuilding it from the rows", kind)
        built = self._load_rows(kind, VectorIndex(self.dim, self._ef_search), 0, _GENESIS, link=False)
        if built is None:
            raise StoreError(
                f"{kind}: the stored vectors do not match the digest recorded with them; the store is damaged"
            )
        built[0].link()  # the graph built once over every row, not at each doubling while they load
        return built

    def _load_rows(
        self, kind: VectorKind, index: VectorIndex, start: int, digest: bytes | None, link: bool = True
    ) -> tuple[VectorIndex, list[str]] | None:
        """``index`` (holding the vectors of positions ``< start``, whose running digest is
        ``digest``) with the scopes of every row and the vectors past ``start`` added (linked
        into its graph as they come only with ``link``); None when the result does not
        reproduce the digest the database records (``digest`` None: not checked) or the index
        holds more vectors than there are rows."""
        recorded = self._recorded_digest(kind) if digest is not None else None
        scopes: list[str] = []
        ids: list[str] = []
        rows = self._conn.execute(
            f"SELECT id, patient_id, state FROM {kind} WHERE tenant = ? ORDER BY pos", (self.tenant,)
        )
        for rid, pid, state in rows:
            ids.append(rid)
            scopes.append(pid if state in _LIVE else RETIRED)
        count = len(ids)
        if start > count:
            return None
        index.set_scopes(scopes[:start])
        cursor = self._conn.execute(
            f"SELECT z FROM {kind} WHERE tenant = ? AND pos >= ? ORDER BY pos", (self.tenant, start)
        )
        pos = start
        while chunk := cursor.fetchmany(8192):
            blobs = [bytes(r[0]) for r in chunk]
            if digest is not None:
                digest = chain_digest(digest, blobs)
            mat = np.frombuffer(b"".join(blobs), dtype=np.float32)
            index.add(mat.reshape(len(chunk), self.dim), scopes[pos : pos + len(chunk)], link)
            pos += len(chunk)
        if pos != count:
            raise StoreError(f"{kind}: rows are not numbered 0..{count - 1}; the store is damaged")
        if digest is not None and recorded is not None and recorded != (count, digest):
            return None
        return index, ids

    def follow_others(self) -> None:
        """Follow what other processes committed since we last looked (the caller holds the
        lock): the rows they appended are read past the index's end and the rows they updated
        (the moved mark names them, ``changes.py``) read again; when the mark cannot name them
        (a delete, a new epoch), the scope and id of every position are read again."""
        version = self._changes.current()
        if version == self._seen_version:
            return
        erased = self._erased_mark() if self._index else None
        if erased != self._seen_erased:  # another handle erased vectors: none may stay here
            self._rebuild_from_rows()
            self._seen_version, self._seen_moved, self._seen_erased = version, self._changes.moved(), erased
            return
        moved = self._changes.moved()
        updated = moved_positions(self._seen_moved, moved)
        for kind in list(self._index):  # none in a store opened for its upgrade
            index = self._index[kind]
            if updated is not None:
                start = index.ntotal
                self._append_others(kind, index)
                self._reread(kind, index, sorted({p for p in updated[kind] if p < start}))
                continue
            with self._snapshot():
                built = self._load_rows(kind, index, index.ntotal, None)
                if built is None:  # fewer rows than vectors: only a restore from a backup does that
                    built = self._load_rows(kind, VectorIndex(self.dim, self._ef_search), 0, None)
            assert built is not None
            self._index[kind], self._ids[kind] = built
            self._next[kind] = built[0].ntotal
        self._seen_version, self._seen_moved = version, moved

    def _append_others(self, kind: VectorKind, index: VectorIndex) -> None:
        """The rows other processes appended past the index's end."""
        start = index.ntotal
        cursor = self._conn.execute(
            f"SELECT pos, id, patient_id, state, z FROM {kind} WHERE tenant = ? AND pos >= ? ORDER BY pos",
            (self.tenant, start),
        )
        while chunk := cursor.fetchmany(8192):
            if int(chunk[0][0]) != start or int(chunk[-1][0]) != start + len(chunk) - 1:
                raise StoreError(f"{kind}: rows are not numbered {start}..; the store is damaged")
            mat = np.frombuffer(b"".join(bytes(r[4]) for r in chunk), dtype=np.float32)
            index.add(mat.reshape(len(chunk), self.dim), [r[2] if r[3] in _LIVE else RETIRED for r in chunk])
            self._ids[kind].extend(str(r[1]) for r in chunk)
            start += len(chunk)
        self._next[kind] = index.ntotal

    def _reread(self, kind: VectorKind, index: VectorIndex, positions: list[int]) -> None:
        """The scope and id of the given positions, read again (rows other processes updated)."""
        for first in range(0, len(positions), 500):
            chunk = positions[first : first + 500]
            marks = ",".join("?" * len(chunk))
            rows = self._conn.execute(
                f"SELECT pos, id, patient_id, state FROM {kind} WHERE tenant = ? AND pos IN ({marks})",
                (self.tenant, *chunk),
            ).fetchall()
            if len(rows) != len(chunk):
                raise StoreError(f"{kind}: rows the index holds are gone; the store is damaged")
            for pos, rid, pid, state in rows:
                self._ids[kind][int(pos)] = str(rid)
                index.rescope(int(pos), pid if state in _LIVE else RETIRED)

    def save(self) -> None:
        """Persist the caches; a failure (a full disk, read-only media) only costs a rebuild.
        Caches that have not followed an erasure by another handle are not saved."""
        if self._index and self._erased_mark() != self._seen_erased:
            return  # they may hold an erased vector; the next open rebuilds them from the rows
        try:
            self._write_indexes()
        except (OSError, RuntimeError) as exc:  # FAISS reports a failed write as RuntimeError
            _log.warning("the vector caches were not saved (%s); they will be rebuilt on open", exc)
            for kind in _KINDS:
                for tmp in (
                    self._index_path(kind).with_suffix(".faiss.tmp"),
                    graph_path(self._index_path(kind)).with_suffix(".graph.tmp"),
                    self._index_path(kind).with_suffix(".json.tmp"),
                ):
                    try:
                        tmp.unlink(missing_ok=True)
                    except OSError:
                        pass

    def _write_indexes(self) -> None:
        private_dir(self.directory / "index")
        for kind, index in self._index.items():
            n = index.ntotal
            tail = self._blob_at(kind, n - 1) if n else b""
            index.save(self._index_path(kind), vector_sha(tail or b""))

    def follow(self, batch: WriteBatch, moved: list[Moved]) -> None:
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
            if self._is_closed():
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
            if self._is_closed():
                raise StoreError("the store is closed")
            scores = [s for kind in kinds if (s := self._index[kind].max_score(z, scope)) is not None]
        return max(scores) if scores else None

    def _search_population(self, kind: VectorKind, z: Vector, k: int) -> list[tuple[str, float]]:
        ids = self._ids[kind]
        return [(ids[p], s) for p, s in self._index[kind].population(z, k, RETIRED)]

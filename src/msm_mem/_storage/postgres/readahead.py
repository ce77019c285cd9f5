"""The reads of a batch of governed turns on the server store: one round trip, not one per read.

Every governed turn reads its patient's consent records and data key (when it begins), then
the active semantic states, the active claims and the finding entities (when it
consolidates); on a server each read is a round trip. :meth:`ReadAhead.prefetch` reads all of
them for a whole batch of patients with the batched statements below, sent in one pipeline
inside one read-only ``REPEATABLE READ`` transaction (so one snapshot), and keeps the rows
(still encrypted) until the next :meth:`~msm_mem._storage.base.Store.sync`, the next write
transaction of this store, a shred or a codec change. The reads of those patients are then
answered from these rows, converted as the per-patient read converts them, so they return
what that read would have returned at the moment of the prefetch (the same records, in the
same order; the same errors, raised by the same read).

The batched statements are the per-patient statements of ``sql_records.py`` and
``sql_tiers.py`` with ``patient_id = ?`` widened to ``= ANY(?)`` (one array of patients); the
rows are split per patient in Python, in the statement's order. They are the only SQL of this
module, kept together in :data:`BATCHED`.

The searches (:meth:`ReadAhead.search`, its statement built once in ``_search_cursor``) live
here too. The novelty check of each turn (the top score over the patient's E and over its V
vectors) sends both searches in one pipeline (:meth:`ReadAhead.search_many`): one round trip a
turn. When the batch names its turns' query vectors (``queries``: the offline ingest and any
caller of ``begin_many(..., novelty=...)`` know them before the turns begin), those searches
go in the read-ahead's pipeline too, in the same snapshot, as one statement a kind (the single
search as a lateral join over the arrays of patients and query vectors, ``_novelty_cursor``),
and a turn's novelty check is then answered from them (matched by patient, kind and the
query's exact bytes; top 1 only): no round trip of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import psycopg
from psycopg.pq import TransactionStatus

from ..._errors import InvalidInput
from ..._records import SemanticState, Vector
from ..._tier_records import Claim, ConsentRecord, Entity
from .. import rows as r
from .. import tier_rows as g
from ..base import VectorKind
from ..rows import check_vector
from ..sql_core import Rows
from ..sql_store import SqlStore
from .keys import PgKeyTable
from .pgvector import Vec, Vecs
from .schema import LIVE

__all__ = ["BATCHED", "KINDS", "ReadAhead", "hits"]

#: the batched reads, one statement per table (``%s``: the tenant, then an array of patient ids); the column at
#: index 1 of each row is the patient's id (``patient_ref`` for keys)
BATCHED: dict[str, str] = {
    "keys": "SELECT * FROM keys WHERE tenant = %s AND patient_ref = ANY(%s)",
    "consents": "SELECT * FROM consents WHERE tenant = %s AND (patient_id = ANY(%s) OR patient_id = '*')"
    " ORDER BY created_at, id",
    "semantic": "SELECT * FROM semantic WHERE tenant = %s AND patient_id = ANY(%s) AND state = 'active'"
    " ORDER BY category",
    "claims": "SELECT * FROM claims WHERE tenant = %s AND patient_id = ANY(%s) AND state = 'active' ORDER BY key",
    "entities": "SELECT id, patient_id, type, name, created_at, state FROM entities"
    " WHERE tenant = %s AND patient_id = ANY(%s) AND state = 'active' ORDER BY created_at, id",
}
#: the vector kinds a store searches
KINDS: tuple[VectorKind, ...] = ("episodic", "visual")
#: at most this many patients are read ahead (a larger batch reads the rest one by one)
MAX_PATIENTS = 10_000
#: at most this many novelty queries are read ahead (with more, each turn searches by itself)
MAX_QUERIES = 2_000


def hits(rows: list[Any]) -> list[tuple[str, float]]:
    """Search rows ``(id, cosine, pos)`` as hits, best first, ties by insertion order."""
    rows.sort(key=lambda r: (-r[1], r[2]))  # the HNSW path orders by score only
    return [(str(r[0]), float(r[1])) for r in rows]


#: a novelty search read ahead: (patient, vector kind, the query vector's bytes)
_SearchKey = tuple[str, VectorKind, bytes]


def _novelty_pairs(patients: Sequence[str], queries: Sequence[tuple[str, Vector]], dim: int) -> list[tuple[str, bytes]]:
    """The ``(patient, query's bytes)`` of the queries whose novelty searches are read ahead
    (their patient is), each once; none when there are more than :data:`MAX_QUERIES`."""
    kept = set(patients)
    pairs: dict[tuple[str, bytes], None] = {}
    for patient_id, z in queries if len(queries) <= MAX_QUERIES else ():
        if patient_id in kept:
            check_vector(z, dim, "query")
            pairs[(patient_id, z.tobytes())] = None
    return list(pairs)


class _Rows:
    """The rows read ahead, per table and patient (a patient with none has an empty list), and
    the novelty searches read ahead (their hits by :data:`_SearchKey`)."""

    def __init__(
        self, patients: Sequence[str], found: dict[str, list[Any]], searched: dict[_SearchKey, list[tuple[str, float]]]
    ) -> None:
        self.patients = frozenset(patients)
        self.searched = searched
        self._by: dict[str, dict[str, list[Any]]] = {}
        for table, rows in found.items():
            by: dict[str, list[Any]] = {p: [] for p in self.patients}
            for row in rows:
                if table == "consents" and row[1] == "*":  # a consent of every patient: each one's
                    for kept in by.values():
                        kept.append(row)
                elif row[1] in by:
                    by[row[1]].append(row)
            self._by[table] = by

    def of(self, table: str, patient_id: str | None) -> list[Any] | None:
        if patient_id is None or patient_id not in self.patients:
            return None
        return self._by[table][patient_id]


class ReadAhead(SqlStore):
    """The read-ahead of the server store: :meth:`prefetch`, and the reads it answers."""

    _conn: psycopg.Connection[Any]
    _keys: PgKeyTable
    _ahead: _Rows | None = None
    _approximate: bool

    def prefetch(self, patient_ids: Sequence[str], queries: Sequence[tuple[str, Vector]] = ()) -> None:
        """Read ahead what governed turns of these patients read, and the novelty searches of
        ``queries``, in one round trip (see the module). Nothing is read inside an open
        transaction (its writes could roll back)."""
        patients = list(dict.fromkeys(p for p in patient_ids if isinstance(p, str) and "\x00" not in p))
        pairs = _novelty_pairs(patients, queries, self.dim)
        with self._db():
            self._ahead = None
            conn = self._conn  # (the one _db holds)
            if not patients or len(patients) > MAX_PATIENTS or self._in_transaction():
                return
            # sent together, answered at the pipeline's one sync (its end): one round trip; the
            # transaction only makes the reads one snapshot (an error rolls it back at the sync)
            with conn.pipeline():
                conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                cursors = {t: conn.execute(q, (self.tenant, patients), binary=True) for t, q in BATCHED.items()}
                sent = {kind: self._novelty_cursor(kind, pairs) for kind in KINDS} if pairs else {}
                conn.execute("COMMIT")
            found = {table: cur.fetchall() for table, cur in cursors.items()}
            self._keys.prefetched([g.wrapped_key_from_row(row) for row in found.pop("keys")])
            searched: dict[_SearchKey, list[tuple[str, float]]] = {}
            for kind, cur in sent.items():
                searched.update({(p, kind, key): [] for p, key in pairs})  # (no row: the patient has none)
                for i, record_id, score, pos in cur.fetchall():
                    patient_id, key = pairs[i - 1]
                    searched[(patient_id, kind, key)] = hits([(record_id, score, pos)])
            self._ahead = _Rows(patients, found, searched)

    def _in_transaction(self) -> bool:
        return self._conn.info.transaction_status != TransactionStatus.IDLE

    def _forget_ahead(self) -> None:
        self._ahead = None

    def _rows_ahead(self, table: str, patient_id: str | None) -> list[Any] | None:
        """The rows read ahead for the patient, or None when it was not (read it now)."""
        ahead = self._ahead
        return None if ahead is None else ahead.of(table, patient_id)

    # the reads answered from the rows read ahead (each as its per-patient statement would) --

    def _load_consents(self, patient_id: str | None) -> list[ConsentRecord]:
        with self._db():
            rows = self._rows_ahead("consents", patient_id)
            if rows is None:
                return super()._load_consents(patient_id)
            return [g.consent_from_row(row) for row in rows]

    def _load_semantic(self, patient_id: str) -> list[SemanticState]:
        with self._db():
            rows = self._rows_ahead("semantic", patient_id)
            if rows is None:
                return super()._load_semantic(patient_id)
            return [r.semantic_from_row(row, self._codec) for row in rows]

    def _load_entities(self, patient_id: str) -> list[Entity]:
        with self._db():
            rows = self._rows_ahead("entities", patient_id)
            if rows is None:
                return super()._load_entities(patient_id)
            return [g.entity_from_row(row, self._codec) for row in rows]

    def claims_active(self, patient_id: str, key: str | None = None) -> list[Claim]:
        with self._db():
            rows = self._rows_ahead("claims", patient_id)
            if rows is None:
                return super().claims_active(patient_id, key)
            return [g.claim_from_row(row, self._codec) for row in rows if key is None or row[2] == key]

    # the searches of one query vector (the novelty check: E and V) -----------------------

    def search_many(
        self, z: Vector, requests: Sequence[tuple[VectorKind, int]], scope: str | None
    ) -> list[list[tuple[str, float]]]:
        """:meth:`search` for each ``(kind, k)``, the statements sent in one pipeline: one round
        trip; none when every search was read ahead (the novelty check of a turn of a batch)."""
        ahead = self._searched_ahead(z, requests, scope)
        if ahead is not None:
            return ahead
        if len(requests) < 2 or (scope is None and self._approximate):  # (that path sets ef_search first)
            return super().search_many(z, requests, scope)
        check_vector(z, self.dim, "query")
        if scope is not None and "\x00" in scope:
            return [[] for _ in requests]  # no stored patient id holds NUL
        with self._db():
            with self._conn.pipeline():  # answered at its end (one sync), the rows fetched after it
                sent = [self._search_cursor(kind, z, k, scope) if k > 0 else None for kind, k in requests]
            return [[] if cur is None else hits(cur.fetchall()) for cur in sent]

    def _searched_ahead(
        self, z: Vector, requests: Sequence[tuple[VectorKind, int]], scope: str | None
    ) -> list[list[tuple[str, float]]] | None:
        """The hits of every request read ahead for exactly this query and scope, or None when
        one of them was not (top 1 only: what the novelty check asks)."""
        ahead = self._ahead
        if ahead is None or not ahead.searched or scope is None or not isinstance(z, np.ndarray):
            return None
        key = z.tobytes()
        found = []
        for kind, k in requests:
            hits_ahead = ahead.searched.get((scope, kind, key)) if k == 1 else None
            if hits_ahead is None:
                return None
            found.append(list(hits_ahead))
        return found

    # the search statement ----------------------------------------------------------------------------

    def _search(self, kind: VectorKind, z: Vector, k: int, scope: str | None, prefix: str = "") -> list[Any]:
        """Rows ``(id, cosine, pos)`` of the search, or of ``EXPLAIN`` with ``prefix``."""
        return self._search_cursor(kind, z, k, scope, prefix).fetchall()

    def _search_cursor(self, kind: VectorKind, z: Vector, k: int, scope: str | None, prefix: str = "") -> Rows:
        """The search's statement sent; its rows are fetched by the caller (in a pipeline: later)."""
        if kind not in KINDS:
            raise InvalidInput(f"unknown vector kind {kind!r}")
        params: dict[str, Any] = {"q": Vec(z.tobytes()), "k": k, "p": scope, "t": self.tenant}
        with self._db():
            conn = self._conn  # (the one _db holds)
            if scope is None and self._approximate:
                with conn.transaction():
                    conn.execute(f"SET LOCAL hnsw.ef_search = {min(max(4 * k, 40), 1000)}")
                    query = (
                        f"SELECT id, -(z <#> %(q)s), pos FROM {kind} WHERE {LIVE} AND tenant = %(t)s"
                        " ORDER BY z <#> %(q)s LIMIT %(k)s"
                    )
                    return conn.execute(prefix + query, params, binary=True)
            where = LIVE + " AND tenant = %(t)s" + ("" if scope is None else " AND patient_id = %(p)s")
            query = (
                f"WITH c AS MATERIALIZED (SELECT pos, id, z <#> %(q)s AS d FROM {kind} WHERE {where})"
                " SELECT id, -d, pos FROM c ORDER BY d, pos LIMIT %(k)s"
            )
            return conn.execute(prefix + query, params, binary=True)

    def _novelty_cursor(self, kind: VectorKind, pairs: Sequence[tuple[str, bytes]]) -> Rows:
        """The top hit of each ``(patient, query's bytes)`` among the patient's vectors of
        ``kind``, as :meth:`_search_cursor` finds it (k = 1: the same score, ties by position),
        all in one statement: rows ``(i, id, cosine, pos)``, ``i`` the pair's place in
        ``pairs`` from 1, none for a patient without vectors. The ``+ 0`` keeps the ordering
        off the HNSW index (approximate) of a store in that mode, as the single search's
        ``MATERIALIZED`` fence does: ``EXPLAIN`` over 20,000 rows, 90% one patient's, planned
        the ordering by the distance alone as a scan of that index inside the lateral join
        (with ``pos`` as second key it did not, nor in the tests; the fence keeps exactness
        from resting on the planner's choice)."""
        query = (
            "SELECT q.i, h.id, h.s, h.pos FROM unnest(%(p)s::text[], %(z)s) WITH ORDINALITY AS q(p, z, i)"
            f" CROSS JOIN LATERAL (SELECT e.id, -(e.z <#> q.z) AS s, e.pos FROM {kind} e"
            f" WHERE {LIVE} AND e.tenant = %(t)s AND e.patient_id = q.p"
            " ORDER BY (e.z <#> q.z) + 0, e.pos LIMIT 1) h"
        )
        params = {"p": [p for p, _ in pairs], "z": Vecs([key for _, key in pairs]), "t": self.tenant}
        return self._conn.execute(query, params, binary=True)

    def search(self, kind: VectorKind, z: Vector, k: int, scope: str | None) -> list[tuple[str, float]]:
        check_vector(z, self.dim, "query")
        if k <= 0 or (scope is not None and "\x00" in scope):
            return []  # no stored patient id holds NUL
        return hits(self._search(kind, z, k, scope))

    def explain_search(self, kind: VectorKind, z: Vector, k: int, scope: str | None) -> str:
        """The server's plan (``EXPLAIN`` text) of :meth:`search` with these arguments."""
        check_vector(z, self.dim, "query")
        return "\n".join(str(r[0]) for r in self._search(kind, z, max(k, 1), scope, "EXPLAIN "))

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

The novelty searches of the batch's turns (the top score over each patient's E and over its
V vectors) go in the same pipeline when the batch names its turns' query vectors (``queries``:
the offline ingest and any caller of ``begin_many(..., novelty=...)`` know them before the
turns begin), in the same snapshot, as one statement a kind (``search.novelty_cursor``), and a
turn's novelty check is then answered from them by the vector part (``search.py``; matched by
patient, kind and the query's exact bytes; top 1 only): no round trip of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
from psycopg.pq import TransactionStatus

from ..._records import SemanticState, Vector
from ..._tier_records import Claim, ConsentRecord, Entity
from .. import rows as r
from .. import tier_rows as g
from ..base import VectorKind
from ..rows import check_vector
from ..sql_core import SqlTables
from .connection import PgDialect
from .keys import PgKeyTable
from .search import KINDS, hits, novelty_cursor

__all__ = ["BATCHED", "MAX_PATIENTS", "MAX_QUERIES", "ReadAhead"]

T = TypeVar("T")

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
#: at most this many patients are read ahead (a larger batch reads the rest one by one)
MAX_PATIENTS = 10_000
#: at most this many novelty queries are read ahead (with more, each turn searches by itself)
MAX_QUERIES = 2_000


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
        #: records read by id while these rows are kept: ``table -> id -> record``
        self.records: dict[str, dict[str, Any]] = {}
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


class ReadAhead:
    """The read-ahead part of the server store: :meth:`prefetch`, and the reads it answers (the
    store's :class:`~msm_mem._storage.sql_core.PatientCache`, and the novelty searches)."""

    by_id = False

    def __init__(self, dialect: PgDialect, tables: SqlTables, keys: PgKeyTable, *, dim: int) -> None:
        self._sql = dialect
        self._t = tables
        self._keys = keys
        self.dim = dim
        self._ahead: _Rows | None = None

    def prefetch(self, patient_ids: Sequence[str], queries: Sequence[tuple[str, Vector]] = ()) -> None:
        """Read ahead what governed turns of these patients read, and the novelty searches of
        ``queries``, in one round trip (see the module). Nothing is read inside an open
        transaction (its writes could roll back)."""
        patients = list(dict.fromkeys(p for p in patient_ids if isinstance(p, str) and "\x00" not in p))
        pairs = _novelty_pairs(patients, queries, self.dim)
        tenant = self._t.tenant
        with self._sql.db() as conn:
            self._ahead = None
            if not patients or len(patients) > MAX_PATIENTS or self._in_transaction():
                return
            # sent together, answered at the pipeline's one sync (its end): one round trip; the
            # transaction only makes the reads one snapshot (an error rolls it back at the sync)
            with conn.pipeline():
                conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                cursors = {t: conn.execute(q, (tenant, patients), binary=True) for t, q in BATCHED.items()}
                sent = {
                    kind: novelty_cursor(conn, tenant, kind, pairs, by_patient=kind in self._sql.moves)
                    for kind in (KINDS if pairs else ())
                }
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
        return self._sql.conn.info.transaction_status != TransactionStatus.IDLE

    def forget(self) -> None:
        """Drop what was read ahead (a write may change it; other connections may have written)."""
        self._ahead = None

    def _rows_ahead(self, table: str, patient_id: str | None) -> list[Any] | None:
        """The rows read ahead for the patient, or None when it was not (read it now)."""
        ahead = self._ahead
        return None if ahead is None else ahead.of(table, patient_id)

    # the reads answered from the rows read ahead (each as its per-patient statement would) --

    def records(self, table: str, ids: Sequence[str], load: Callable[[Sequence[str]], dict[str, T]]) -> dict[str, T]:
        """While rows are read ahead (no write since), a record read by id is kept and not read
        again: a turn reads its evidence several times (retrieval, fusion, the answer's trail),
        and on a Citus cluster each read by id alone asks every shard."""
        with self._sql.db():
            ahead = self._ahead
            if ahead is None:
                return load(ids)
            kept: dict[str, T] = ahead.records.setdefault(table, {})
            missing = [i for i in dict.fromkeys(ids) if i not in kept]
            if missing:
                kept.update(load(missing))
            return {i: kept[i] for i in ids if i in kept}

    def consents(self, patient_id: str | None, load: Callable[[], list[ConsentRecord]]) -> list[ConsentRecord]:
        with self._sql.db():
            rows = self._rows_ahead("consents", patient_id)
            if rows is None:
                return load()
            return [g.consent_from_row(row) for row in rows]

    def semantic(self, patient_id: str, load: Callable[[], list[SemanticState]]) -> list[SemanticState]:
        with self._sql.db():
            rows = self._rows_ahead("semantic", patient_id)
            if rows is None:
                return load()
            return [r.semantic_from_row(row, self._t.codec) for row in rows]

    def entities(self, patient_id: str, load: Callable[[], list[Entity]]) -> list[Entity]:
        with self._sql.db():
            rows = self._rows_ahead("entities", patient_id)
            if rows is None:
                return load()
            return [g.entity_from_row(row, self._t.codec) for row in rows]

    def claims(self, patient_id: str, key: str | None, load: Callable[[], list[Claim]]) -> list[Claim]:
        with self._sql.db():
            rows = self._rows_ahead("claims", patient_id)
            if rows is None:
                return load()
            return [g.claim_from_row(row, self._t.codec) for row in rows if key is None or row[2] == key]

    def searched(
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

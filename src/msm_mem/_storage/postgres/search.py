"""The server store's vector part: exact (or, when asked, HNSW) search with pgvector.

A search is one statement (``_search_cursor``). The novelty check of each turn (the top score
over the patient's E and over its V vectors) sends both searches in one pipeline
(:meth:`PgVectors.search_many`): one round trip a turn; none when the batch of turns read them
ahead (``readahead.py``, which sends :func:`novelty_cursor` in its pipeline). See ``store.py``
for the statements' plans.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import psycopg

from ..._errors import InvalidInput
from ..._records import Vector
from ..base import VectorKind
from ..rows import EPISODIC_COLUMNS, VISUAL_COLUMNS, check_vector
from ..sql_core import Rows
from .connection import PgDialect
from .pgvector import Vec, Vecs
from .schema import LIVE

__all__ = ["KINDS", "PgVectors", "SearchedAhead", "hits", "novelty_cursor"]

#: the vector kinds a store searches
KINDS: tuple[VectorKind, ...] = ("episodic", "visual")


def hits(rows: list[Any]) -> list[tuple[str, float]]:
    """Search rows ``(id, cosine, pos)`` as hits, best first, ties by insertion order."""
    rows.sort(key=lambda r: (-r[1], r[2]))  # the HNSW path orders by score only
    return [(str(r[0]), float(r[1])) for r in rows]


class _Concatenated:
    """The rows of several cursors, read in turn."""

    def __init__(self, cursors: list[Rows]) -> None:
        self._cursors = cursors

    def fetchall(self) -> list[Any]:
        return [row for cur in self._cursors for row in cur.fetchall()]


def novelty_cursor(
    conn: psycopg.Connection[Any],
    tenant: str,
    kind: VectorKind,
    pairs: Sequence[tuple[str, bytes]],
    *,
    by_patient: bool = False,
) -> Rows | _Concatenated:
    """The top hit of each ``(patient, query's bytes)`` among the patient's vectors of
    ``kind``, as the single search finds it (k = 1: the same score, ties by position), all in
    one statement: rows ``(i, id, cosine, pos)``, ``i`` the pair's place in ``pairs`` from 1,
    none for a patient without vectors. The ``+ 0`` keeps the ordering off the HNSW index
    (approximate) of a store in that mode, as the single search's ``MATERIALIZED`` fence
    does: ``EXPLAIN`` over 20,000 rows, 90% one patient's, planned the ordering by the
    distance alone as a scan of that index inside the lateral join (with ``pos`` as second key
    it did not, nor in the tests; the fence keeps exactness from resting on the planner's
    choice). On a table distributed by the patient (``by_patient``, a Citus cluster) the join
    over several patients cannot be sent to the shards, so each pair is its own statement,
    routed to its patient's shard (sent in the caller's pipeline: still one round trip)."""
    if by_patient:
        one = (
            f"SELECT CAST(%(i)s AS BIGINT), id, -(z <#> %(z)s), pos FROM {kind}"
            f" WHERE {LIVE} AND tenant = %(t)s AND patient_id = %(p)s ORDER BY (z <#> %(z)s) + 0, pos LIMIT 1"
        )
        return _Concatenated(
            [
                conn.execute(one, {"i": i, "z": Vec(key), "t": tenant, "p": p}, binary=True)
                for i, (p, key) in enumerate(pairs, start=1)
            ]
        )
    query = (
        "SELECT q.i, h.id, h.s, h.pos FROM unnest(%(p)s::text[], %(z)s) WITH ORDINALITY AS q(p, z, i)"
        f" CROSS JOIN LATERAL (SELECT e.id, -(e.z <#> q.z) AS s, e.pos FROM {kind} e"
        f" WHERE {LIVE} AND e.tenant = %(t)s AND e.patient_id = q.p"
        " ORDER BY (e.z <#> q.z) + 0, e.pos LIMIT 1) h"
    )
    params = {"p": [p for p, _ in pairs], "z": Vecs([key for _, key in pairs]), "t": tenant}
    return conn.execute(query, params, binary=True)


class SearchedAhead(Protocol):
    """Where searches read ahead are kept (``readahead.py``)."""

    def searched(
        self, z: Vector, requests: Sequence[tuple[VectorKind, int]], scope: str | None
    ) -> list[list[tuple[str, float]]] | None:
        """The hits of every request read ahead for this query and scope, or None."""
        ...


class PgVectors:
    """Search over the vector columns, and where the write path puts new vectors."""

    def __init__(
        self,
        dialect: PgDialect,
        ahead: SearchedAhead,
        *,
        dim: int,
        tenant: str,
        approximate: bool,
        iterative: bool = False,
    ) -> None:
        """``ahead`` answers the novelty searches a batch of turns read ahead; ``approximate``:
        population search by the HNSW index; ``iterative``: the server's pgvector scans that
        index iteratively (0.8 and later), so the tenant filter cannot starve it."""
        self._sql = dialect
        self._ahead = ahead
        self.dim = dim
        self.tenant = tenant
        self.approximate = approximate
        self.iterative = iterative

    def search_many(
        self, z: Vector, requests: Sequence[tuple[VectorKind, int]], scope: str | None
    ) -> list[list[tuple[str, float]]]:
        """:meth:`search` for each ``(kind, k)``, the statements sent in one pipeline: one round
        trip; none when every search was read ahead (the novelty check of a turn of a batch)."""
        ahead = self._ahead.searched(z, requests, scope)
        if ahead is not None:
            return ahead
        if len(requests) < 2 or (scope is None and self.approximate):  # (that path sets ef_search first)
            return [self.search(kind, z, k, scope) for kind, k in requests]
        check_vector(z, self.dim, "query")
        if scope is not None and "\x00" in scope:
            return [[] for _ in requests]  # no stored patient id holds NUL
        with self._sql.db() as conn:
            with conn.pipeline():  # answered at its end (one sync), the rows fetched after it
                sent = [self._search_cursor(kind, z, k, scope) if k > 0 else None for kind, k in requests]
            return [[] if cur is None else hits(cur.fetchall()) for cur in sent]

    def max_cosine(self, z: Vector, kinds: Sequence[VectorKind], scope: str) -> float | None:
        """The top-1 score of :meth:`search_many` over ``kinds``; None when the scope has none."""
        scores = [s for hits in self.search_many(z, [(kind, 1) for kind in kinds], scope) for _, s in hits]
        return max(scores) if scores else None

    def _search(self, kind: VectorKind, z: Vector, k: int, scope: str | None, prefix: str = "") -> list[Any]:
        """Rows ``(id, cosine, pos)`` of the search, or of ``EXPLAIN`` with ``prefix``."""
        return self._search_cursor(kind, z, k, scope, prefix).fetchall()

    def _search_cursor(self, kind: VectorKind, z: Vector, k: int, scope: str | None, prefix: str = "") -> Rows:
        """The search's statement sent; its rows are fetched by the caller (in a pipeline: later)."""
        if kind not in KINDS:
            raise InvalidInput(f"unknown vector kind {kind!r}")
        params: dict[str, Any] = {"q": Vec(z.tobytes()), "k": k, "p": scope, "t": self.tenant}
        with self._sql.db() as conn:
            if scope is None and self.approximate:
                with conn.transaction():
                    conn.execute(f"SET LOCAL hnsw.ef_search = {min(max(4 * k, 40), 1000)}")
                    if self.iterative:  # other tenants' rows in the index: scan on until k pass the filter
                        conn.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
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

    def search(self, kind: VectorKind, z: Vector, k: int, scope: str | None) -> list[tuple[str, float]]:
        check_vector(z, self.dim, "query")
        if k <= 0 or (scope is not None and "\x00" in scope):
            return []  # no stored patient id holds NUL
        return hits(self._search(kind, z, k, scope))

    def explain_search(self, kind: VectorKind, z: Vector, k: int, scope: str | None) -> str:
        """The server's plan (``EXPLAIN`` text) of :meth:`search` with these arguments."""
        check_vector(z, self.dim, "query")
        return "\n".join(str(r[0]) for r in self._search(kind, z, max(k, 1), scope, "EXPLAIN "))

    # the write path's (``sql_write.VectorRows``) ----------------------------------------------

    def positions(self, lane: int = 0, lanes: int = 1) -> dict[VectorKind, int]:
        """The next position of each kind in ``lane``: read inside the write transaction, under
        the lane's lock (in a store of several lanes, the first of the lane's residue modulo
        ``lanes`` above every stored position; a batch's rows then go ``lanes`` apart)."""
        if lanes == 1:
            sql = "SELECT COALESCE(MAX(pos) + 1, 0) FROM {kind} WHERE tenant = ?"
            return {kind: int(self._sql.q(sql.format(kind=kind), (self.tenant,)).fetchone()[0]) for kind in KINDS}
        # the first position of the lane's residue above every stored one: writers of other
        # lanes take other residues, and positions follow the order of writing across lanes
        sql = "SELECT COALESCE(MAX(pos), -1) FROM {kind} WHERE tenant = ?"
        found = {kind: int(self._sql.q(sql.format(kind=kind), (self.tenant,)).fetchone()[0]) for kind in KINDS}
        return {kind: last + 1 + (lane - last - 1) % lanes for kind, last in found.items()}

    def vector_rows(self, kind: VectorKind, rows: list[tuple[Any, ...]]) -> Sequence[Sequence[Any]]:
        """Rows with the ``z`` blob in pgvector's binary format."""
        z = (EPISODIC_COLUMNS if kind == "episodic" else VISUAL_COLUMNS).index("z")
        return [(*r[:z], Vec(r[z]), *r[z + 1 :]) for r in rows]

    def vectors_added(self, kind: VectorKind, start: int, rows: list[tuple[Any, ...]]) -> None:
        """Nothing to follow: the server indexes the rows it stores."""

    def vectors_erased(self, kind: VectorKind) -> None:
        """Nothing to follow: the server's HNSW index drops the old row versions at VACUUM."""

"""The server store: PostgreSQL with pgvector, same tables and behaviour as the SQLite store.

One store is one PostgreSQL schema (default ``msm_mem``) holding the tables ``meta``,
``episodic``, ``visual`` and ``semantic`` with the SQLite store's columns in the same order
(``semantic`` has one more, trailing: ``ord``, insertion order, SQLite's ``rowid``), plus the
governed tiers' tables of ``postgres_gov.py``. Vectors are pgvector ``vector(dim)`` columns.
Rows go through the converters of ``_sql.py``; vectors travel in pgvector's binary format
(``_pgvector.py``) and load as the native float32 bytes those converters expect, bit for bit.

Search (``z <#> q`` is pgvector's negative inner product; on unit vectors, minus the cosine):

- patient scope: ``WHERE patient_id = p`` inside a ``MATERIALIZED`` CTE, then ``ORDER BY
  z <#> q, pos LIMIT k`` outside it. The CTE fences the ordering off from the HNSW index: a
  filtered HNSW scan returns at most ``hnsw.ef_search`` candidates before filtering, so it can
  miss the best rows or return fewer than k, and the planner does pick it for the plain
  ``WHERE patient_id = p ORDER BY z <#> q LIMIT k`` when one patient holds most rows
  (measured: 90% of 20,000). Here the rows come from the btree on ``patient_id`` (a sequential
  scan when the patient is most of the table) and are scored exactly: O(rows of the patient).
  :meth:`explain_search` shows the plan.
- population scope (``None``): by default the same exact CTE over every live row, a sequential
  scan, O(rows); this keeps the contract (exact top-k, ties by insertion order). With
  ``population_search="hnsw"`` it uses the partial HNSW index (``vector_ip_ops``, live rows
  only) with ``hnsw.ef_search = clamp(4k, 40, 1000)``: sub-linear but approximate, outside the
  contract. The index exists only in stores opened in that mode: the first such opening
  builds it (time proportional to the rows), and from then on every insert keeps it up to
  date, which costs a few milliseconds a 1024-d row (so an exact-mode store does not pay it).
  It is not built for ``dim > 2000`` (pgvector's limit), where search is always exact.

Writes are one transaction that first takes ``EXCLUSIVE`` locks on the three tables (readers
go on; writers queue, as with SQLite's ``BEGIN IMMEDIATE``), so positions stay dense (the i-th
record has ``pos`` i) and supersession cannot race. Text containing NUL characters, which
PostgreSQL cannot store, is refused with :class:`InvalidInput`.

Scaling (DESIGN.md section 4): past one machine, the tables are distributed with Citus by
``patient_id`` (a patient's memory, keys and consent co-located on one shard, so a
patient-scoped search touches one node) and retrieval reads go to streaming read replicas.
What assumes one node here: the table locks and ``max(pos) + 1`` positions (per shard there).
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal

import psycopg
from psycopg import sql

from .._errors import IllegalTransition, InvalidInput, NotFound, StoreError
from .._records import EpisodicRecord, SemanticState, Vector, VisualRecord
from . import _sql
from ._pgvector import Vec, connect, use_schema, vector_schema
from .base import FieldCodec, PlainCodec, StateChange, Store, VectorKind, WriteBatch
from .postgres_gov import GOV_SCHEMA, PgGovernanceTables, PgKeyTable

__all__ = ["PostgresStore"]

FORMAT = "msm-mem-store"
SCHEMA_VERSION = "1"
HNSW_MAX_DIM = 2000
_LIVE = "state IN ('active', 'anonymized')"
_KINDS = ("episodic", "visual")
PopulationSearch = Literal["exact", "hnsw"]

SCHEMA = """
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE episodic(
  pos BIGINT PRIMARY KEY, id TEXT COLLATE "C" NOT NULL UNIQUE, patient_id TEXT COLLATE "C" NOT NULL,
  study_id TEXT COLLATE "C" NOT NULL, timestamp FLOAT8 NOT NULL, z vector({dim}) NOT NULL,
  question TEXT NOT NULL, answer TEXT NOT NULL, decision TEXT NOT NULL, media_path TEXT NOT NULL,
  media_description TEXT NOT NULL, state TEXT NOT NULL, confidence FLOAT8 NOT NULL,
  evidence_tier TEXT NOT NULL, source TEXT NOT NULL, created_at FLOAT8 NOT NULL, decay_at FLOAT8,
  supersedes TEXT);
CREATE INDEX episodic_patient ON episodic(patient_id, study_id);
CREATE TABLE visual(
  pos BIGINT PRIMARY KEY, id TEXT COLLATE "C" NOT NULL UNIQUE, patient_id TEXT COLLATE "C" NOT NULL,
  timestamp FLOAT8 NOT NULL, z vector({dim}) NOT NULL, media_path TEXT NOT NULL,
  visual_tag TEXT NOT NULL, source_episode_id TEXT NOT NULL, state TEXT NOT NULL,
  confidence FLOAT8 NOT NULL, evidence_tier TEXT NOT NULL, source TEXT NOT NULL,
  created_at FLOAT8 NOT NULL, decay_at FLOAT8, supersedes TEXT);
CREATE INDEX visual_patient ON visual(patient_id);
CREATE TABLE semantic(
  id TEXT COLLATE "C" PRIMARY KEY, patient_id TEXT COLLATE "C" NOT NULL,
  category TEXT COLLATE "C" NOT NULL, version BIGINT NOT NULL, state TEXT NOT NULL,
  created_at FLOAT8 NOT NULL, supersedes TEXT, evidence_tier TEXT NOT NULL, impressions TEXT NOT NULL,
  ord BIGINT GENERATED ALWAYS AS IDENTITY);
CREATE UNIQUE INDEX semantic_one_active ON semantic(patient_id, category) WHERE state = 'active';
CREATE INDEX semantic_key ON semantic(patient_id, category, version);
"""
HNSW = "CREATE INDEX IF NOT EXISTS {kind}_hnsw ON {kind} USING hnsw (z vector_ip_ops) WHERE " + _LIVE + ";"


class PostgresStore(PgGovernanceTables, Store):
    """The server store of record. Thread-safe (one connection behind a lock)."""

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        schema: str,
        codec: FieldCodec,
        population_search: PopulationSearch = "exact",
    ) -> None:
        if population_search not in ("exact", "hnsw"):
            raise InvalidInput(f"population_search must be 'exact' or 'hnsw', got {population_search!r}")
        self.schema = schema
        self.population_search: PopulationSearch = population_search
        self._approximate = population_search == "hnsw"  # (and dim <= HNSW_MAX_DIM, below)
        self._conn = conn
        self._codec = codec
        self._lock = threading.RLock()
        self._closed = False
        use_schema(conn, schema)
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        if "tenant" not in meta:
            # a store made before stores had a tenant gets one now: no ciphertext can be bound
            # to it yet (the governed API could not open such a store)
            conn.execute("INSERT INTO meta VALUES ('tenant', %s) ON CONFLICT (key) DO NOTHING", (uuid.uuid4().hex,))
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        self.dim = int(meta["dim"])
        self.encoder_name = meta["encoder"]
        self.tenant = meta["tenant"]
        self._approximate = self._approximate and self.dim <= HNSW_MAX_DIM
        if self._approximate:
            for kind in _KINDS:
                conn.execute(HNSW.format(kind=kind).encode())
        self._keys = PgKeyTable(self._db)

    # opening ------------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        dsn: str,
        *,
        dim: int,
        encoder: str,
        codec: FieldCodec | None = None,
        schema: str = "msm_mem",
        population_search: PopulationSearch = "exact",
    ) -> PostgresStore:
        """Create a new store in ``schema`` (created if needed; must not hold a store).

        Installs the pgvector extension when the database lacks it (that needs the privilege
        to create extensions). Raises :class:`StoreError` when the schema already holds a
        store or tables of the same names, or the server cannot be reached.
        """
        if not isinstance(dim, int) or dim < 1:
            raise InvalidInput(f"dim must be a positive integer, got {dim!r}")
        conn = connect(dsn)
        try:
            if vector_schema(conn) is None:
                conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            ident, ext = sql.Identifier(schema), sql.Identifier(vector_schema(conn) or "public")
            with conn.transaction():
                conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident))
                meta = f"{ident.as_string(conn)}.meta"
                if conn.execute("SELECT to_regclass(%s)", (meta,)).fetchone() != (None,):
                    raise StoreError(f"schema {schema!r} already holds a store")
                conn.execute(sql.SQL("SET LOCAL search_path TO {}, {}").format(ident, ext))
                conn.execute((SCHEMA.format(dim=dim) + GOV_SCHEMA).encode())
                rows = [
                    ("format", FORMAT),
                    ("schema", SCHEMA_VERSION),
                    ("dim", str(dim)),
                    ("encoder", encoder),
                    ("tenant", uuid.uuid4().hex),
                ]
                conn.cursor().executemany("INSERT INTO meta VALUES (%s, %s)", rows)
            return cls(conn, schema, codec or PlainCodec(), population_search)
        except psycopg.Error as exc:
            conn.close()
            raise StoreError(f"cannot create a store in schema {schema!r}: {exc}") from exc
        except BaseException:
            conn.close()
            raise

    @classmethod
    def open(
        cls,
        dsn: str,
        *,
        codec: FieldCodec | None = None,
        schema: str = "msm_mem",
        population_search: PopulationSearch = "exact",
    ) -> PostgresStore:
        """Open an existing store; a schema that is not one raises :class:`StoreError`."""
        conn = connect(dsn)
        try:
            meta_table = f"{sql.Identifier(schema).as_string(conn)}.meta"
            if conn.execute("SELECT to_regclass(%s)", (meta_table,)).fetchone() == (None,):
                raise StoreError(f"schema {schema!r} is not an msm-mem store (no meta table); run `msm-mem init`")
            try:
                meta = dict(conn.execute(f"SELECT key, value FROM {meta_table}").fetchall())
            except psycopg.Error as exc:
                raise StoreError(f"schema {schema!r} is not a readable msm-mem store: {exc}") from exc
            if meta.get("format") != FORMAT:
                raise StoreError(f"schema {schema!r} is not an msm-mem store (format {meta.get('format')!r})")
            if meta.get("schema") != SCHEMA_VERSION:
                raise StoreError(
                    f"schema {schema!r} has store schema {meta.get('schema')!r}, expected {SCHEMA_VERSION}"
                )
            return cls(conn, schema, codec or PlainCodec(), population_search)
        except BaseException:
            conn.close()
            raise

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._conn.close()
                self._closed = True

    def drop(self) -> None:
        """Delete this store: drop all its tables (and its schema when nothing else is left in
        it), then close. Irreversible; used to undo a store that was made by a failed ``init``."""
        with self._db() as conn, conn.transaction():
            tables = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s", (self.schema,)).fetchall()
            ours = set(re.findall(r"CREATE TABLE (\w+)\(", SCHEMA + GOV_SCHEMA))
            for (name,) in tables:
                if name in ours:
                    conn.execute(
                        sql.SQL("DROP TABLE {}.{} CASCADE").format(sql.Identifier(self.schema), sql.Identifier(name))
                    )
            left = conn.execute(
                "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s",
                (self.schema,),
            ).fetchone()
            if left == (0,):
                conn.execute(sql.SQL("DROP SCHEMA {}").format(sql.Identifier(self.schema)))
        self.close()

    def keys(self) -> PgKeyTable:
        return self._keys

    def sync(self) -> None:
        """Forget the cached data keys: other connections may have written since."""
        self._keys.sync()

    @contextmanager
    def _db(self) -> Iterator[psycopg.Connection[Any]]:
        """The connection, under the lock, with database errors mapped to the library's."""
        with self._lock:
            if self._closed:
                raise StoreError("the store is closed")
            try:
                yield self._conn
            except psycopg.DataError as exc:
                raise InvalidInput(f"value refused by the database: {exc}") from exc
            except psycopg.OperationalError as exc:
                raise StoreError(f"database error: {exc}") from exc

    # writing ------------------------------------------------------------------------------

    def write(self, batch: WriteBatch) -> None:
        for e in batch.episodes:
            _sql.check_vector(e.z, self.dim, f"episode {e.episode_id}")
        for v in batch.visuals:
            _sql.check_vector(v.z, self.dim, f"visual {v.visual_id}")
        with self._db() as conn:
            try:
                with conn.transaction():
                    conn.execute("LOCK TABLE episodic, visual, semantic IN EXCLUSIVE MODE")
                    self._apply(conn, batch)
            except psycopg.IntegrityError as exc:
                raise InvalidInput(f"write refused by the store: {exc}") from exc

    def _insert(self, conn: psycopg.Connection[Any], kind: VectorKind, rows: list[tuple[Any, ...]]) -> None:
        if not rows:
            return
        columns = _sql.EPISODIC_COLUMNS if kind == "episodic" else _sql.VISUAL_COLUMNS
        z = columns.index("z")
        rows = [(*r[:z], Vec(r[z]), *r[z + 1 :]) for r in rows]
        marks = ",".join(["%s"] * len(columns))
        conn.cursor().executemany(f"INSERT INTO {kind} VALUES ({marks})", rows)

    def _apply(self, conn: psycopg.Connection[Any], batch: WriteBatch) -> None:
        codec = self._codec
        nxt = {
            k: int(conn.execute(f"SELECT COALESCE(MAX(pos) + 1, 0) FROM {k}").fetchone()[0])  # type: ignore[index]
            for k in _KINDS
        }
        self._insert(
            conn, "episodic", [_sql.episode_to_row(e, nxt["episodic"] + i, codec) for i, e in enumerate(batch.episodes)]
        )
        self._insert(
            conn, "visual", [_sql.visual_to_row(v, nxt["visual"] + i, codec) for i, v in enumerate(batch.visuals)]
        )
        for c in batch.changes:
            self._apply_change(conn, c)
        self._apply_governance(conn, batch)
        marks = ",".join(["%s"] * len(_sql.SEMANTIC_COLUMNS))
        for s in batch.semantic:
            if s.supersedes is not None and not batch.restore:
                cur = conn.execute(
                    "UPDATE semantic SET state = 'superseded' WHERE id = %s AND state = 'active'"
                    " AND patient_id = %s AND category = %s",
                    (s.supersedes, s.patient_id, s.category),
                )
                if cur.rowcount != 1:
                    raise IllegalTransition(f"semantic state {s.supersedes!r} is not the active version of this key")
            try:
                conn.execute(f"INSERT INTO semantic VALUES ({marks})", _sql.semantic_to_row(s, codec))
            except psycopg.IntegrityError as exc:
                raise IllegalTransition(
                    f"semantic key ({s.patient_id!r}, {s.category!r}) already has an active "
                    f"version; a new version must supersede it ({exc})"
                ) from exc

    def _apply_change(self, conn: psycopg.Connection[Any], c: StateChange) -> None:
        table = c.table
        if table not in _sql.CHANGEABLE:
            raise InvalidInput(f"unknown table {table!r}")
        row = conn.execute(f"SELECT patient_id, state FROM {table} WHERE id = %s", (c.record_id,)).fetchone()
        if row is None:
            raise NotFound(f"no {table} record {c.record_id!r}")
        if row[1] != c.expect.value:
            raise IllegalTransition(f"{table} record {c.record_id!r} is {row[1]}, expected {c.expect.value}")
        sets = _sql.change_sets(c, row[0], self._codec)
        assignments = ", ".join(f"{k} = %s" for k in sets)
        conn.execute(f"UPDATE {table} SET {assignments} WHERE id = %s", (*sets.values(), c.record_id))

    # searching ----------------------------------------------------------------------------

    def _search(self, kind: VectorKind, z: Vector, k: int, scope: str | None, prefix: str = "") -> list[Any]:
        """Rows ``(id, cosine, pos)`` of the search, or of ``EXPLAIN`` with ``prefix``."""
        if kind not in _KINDS:
            raise InvalidInput(f"unknown vector kind {kind!r}")
        params: dict[str, Any] = {"q": Vec(z.tobytes()), "k": k, "p": scope}
        with self._db() as conn:
            if scope is None and self._approximate:
                with conn.transaction():
                    conn.execute(f"SET LOCAL hnsw.ef_search = {min(max(4 * k, 40), 1000)}")
                    query = f"SELECT id, -(z <#> %(q)s), pos FROM {kind} WHERE {_LIVE} ORDER BY z <#> %(q)s LIMIT %(k)s"
                    return conn.execute(prefix + query, params, binary=True).fetchall()
            where = _LIVE if scope is None else _LIVE + " AND patient_id = %(p)s"
            query = (
                f"WITH c AS MATERIALIZED (SELECT pos, id, z <#> %(q)s AS d FROM {kind} WHERE {where})"
                " SELECT id, -d, pos FROM c ORDER BY d, pos LIMIT %(k)s"
            )
            return conn.execute(prefix + query, params, binary=True).fetchall()

    def search(self, kind: VectorKind, z: Vector, k: int, scope: str | None) -> list[tuple[str, float]]:
        _sql.check_vector(z, self.dim, "query")
        if k <= 0 or (scope is not None and "\x00" in scope):
            return []  # no stored patient id holds NUL
        rows = self._search(kind, z, k, scope)
        rows.sort(key=lambda r: (-r[1], r[2]))  # the HNSW path orders by score only
        return [(str(r[0]), float(r[1])) for r in rows]

    def explain_search(self, kind: VectorKind, z: Vector, k: int, scope: str | None) -> str:
        """The server's plan (``EXPLAIN`` text) of :meth:`search` with these arguments."""
        _sql.check_vector(z, self.dim, "query")
        return "\n".join(str(r[0]) for r in self._search(kind, z, max(k, 1), scope, "EXPLAIN "))

    # reading ------------------------------------------------------------------------------

    def _get(self, table: str, ids: Sequence[str], conv: Any) -> list[Any]:
        with self._db() as conn:
            if not ids:
                return []
            unique = list(dict.fromkeys(ids))
            rows = conn.execute(f"SELECT * FROM {table} WHERE id = ANY(%s)", (unique,), binary=True)
            found = {r[1]: conv(r, self._codec) for r in rows}
        missing = [i for i in unique if i not in found]
        if missing:
            raise NotFound(f"no {table} record {missing[0]!r}")
        return [found[i] for i in ids]

    def get_episodes(self, ids: Sequence[str]) -> list[EpisodicRecord]:
        return self._get("episodic", ids, _sql.episode_from_row)

    def get_visuals(self, ids: Sequence[str]) -> list[VisualRecord]:
        return self._get("visual", ids, _sql.visual_from_row)

    def _semantic(self, where: str, args: Sequence[str], order: str) -> list[SemanticState]:
        with self._db() as conn:
            rows = conn.execute(f"SELECT * FROM semantic WHERE {where} ORDER BY {order}", args, binary=True)
            return [_sql.semantic_from_row(r, self._codec) for r in rows]

    def semantic_active(self, patient_id: str, category: str | None = None) -> list[SemanticState]:
        where, args = "patient_id = %s AND state = 'active'", [patient_id]
        if category is not None:
            where, args = where + " AND category = %s", [patient_id, category]
        return self._semantic(where, args, "category")

    def semantic_history(self, patient_id: str, category: str) -> list[SemanticState]:
        return self._semantic("patient_id = %s AND category = %s", (patient_id, category), "version")

    def semantic_created_before(self, before: float) -> list[SemanticState]:
        return self._semantic("created_at <= %s AND state IN ('active', 'superseded')", (before,), "created_at, id")  # type: ignore[arg-type]

    def _iter(self, table: str, columns: tuple[str, ...], conv: Any, keys: tuple[str, ...]) -> Iterator[Any]:
        """Keyset pagination in ``keys`` order, 1000 rows a page, the lock held per page only."""
        cols, at = ", ".join(keys), [columns.index(k) for k in keys]
        last: tuple[Any, ...] | None = None
        while True:
            where = "" if last is None else f"WHERE ({cols}) > ({', '.join(['%s'] * len(keys))})"
            with self._db() as conn:
                rows = conn.execute(
                    f"SELECT * FROM {table} {where} ORDER BY {cols} LIMIT 1000", last, binary=True
                ).fetchall()
                records = [conv(r, self._codec) for r in rows]
            yield from records
            if len(rows) < 1000:
                return
            last = tuple(rows[-1][i] for i in at)

    def iter_episodes(self) -> Iterator[EpisodicRecord]:
        return self._iter("episodic", _sql.EPISODIC_COLUMNS, _sql.episode_from_row, ("pos",))

    def iter_visuals(self) -> Iterator[VisualRecord]:
        return self._iter("visual", _sql.VISUAL_COLUMNS, _sql.visual_from_row, ("pos",))

    def iter_semantic(self) -> Iterator[SemanticState]:
        keys = ("patient_id", "category", "version")
        return self._iter("semantic", _sql.SEMANTIC_COLUMNS, _sql.semantic_from_row, keys)

    def count(self, kind: Literal["episodic", "visual", "semantic"]) -> int:
        if kind not in ("episodic", "visual", "semantic"):
            raise InvalidInput(f"unknown table {kind!r}")
        with self._db() as conn:
            return int(conn.execute(f"SELECT COUNT(*) FROM {kind}").fetchone()[0])  # type: ignore[index]

    def patients(self) -> list[str]:
        with self._db() as conn:
            rows = conn.execute(
                "SELECT patient_id FROM episodic UNION SELECT patient_id FROM visual"
                " UNION SELECT patient_id FROM semantic"
            ).fetchall()
        return sorted(r[0] for r in rows if r[0])

    def has_patient(self, patient_id: str) -> bool:
        if not patient_id or "\x00" in patient_id:
            return False  # the anonymised pool is nobody; no stored id holds NUL
        with self._db() as conn:
            row = conn.execute(
                "SELECT EXISTS (SELECT 1 FROM episodic WHERE patient_id = %(p)s)"
                " OR EXISTS (SELECT 1 FROM semantic WHERE patient_id = %(p)s)"
                " OR EXISTS (SELECT 1 FROM visual WHERE patient_id = %(p)s)",
                {"p": patient_id},
            ).fetchone()
        return bool(row and row[0])

    def record_ids(self, table: Literal["episodic", "visual", "semantic", "claims"], patient_id: str) -> list[str]:
        order = {"episodic": "pos", "visual": "pos", "semantic": "ord", "claims": "ord"}.get(table)
        if order is None:
            raise InvalidInput(f"unknown table {table!r}")
        with self._db() as conn:
            rows = conn.execute(
                f"SELECT id FROM {table} WHERE patient_id = %s AND state IN ('active', 'superseded') ORDER BY {order}",
                (patient_id,),
            )
            return [r[0] for r in rows]

    def studies(self, patient_id: str) -> set[str]:
        with self._db() as conn:
            rows = conn.execute("SELECT study_id FROM episodic WHERE patient_id = %s", (patient_id,)).fetchall()
        return {r[0] for r in rows if r[0]}

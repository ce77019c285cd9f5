"""The server store: PostgreSQL with pgvector, same tables and behaviour as the SQLite store.

One store is one PostgreSQL schema (default ``msm_mem``) holding the tables ``meta``,
``episodic``, ``visual`` and ``semantic`` with the SQLite store's columns in the same order
(``semantic`` has one more, trailing: ``ord``, insertion order, SQLite's ``rowid``), plus the
governed tiers' tables (``schema.py``). Vectors are pgvector ``vector(dim)`` columns. Every
query but the search (``search.py``) and the batched reads of a batch of turns
(``readahead.py``) is the shared SQL store's, run by the dialect (``connection.py``); a write
transaction runs in pipeline mode (``pipeline.py``); vectors travel in pgvector's binary
format (``pgvector.py``) and load as the native float32 bytes the row converters expect, bit
for bit. The parts PostgreSQL gives the shared SQL store: that dialect, the vector part
(``search.py``), the key table (``keys.py``) and the read-ahead (``readahead.py``). The store
analyzes its tables each time one doubles (``statistics.py``), so the plans the server keeps
for its prepared statements are costed for the tables as they are.

Search (``z <#> q`` is pgvector's negative inner product; on unit vectors, minus the cosine):

- patient scope: ``WHERE patient_id = p`` inside a ``MATERIALIZED`` CTE, then ``ORDER BY
  z <#> q, pos LIMIT k`` outside it. The CTE fences the ordering off from the HNSW index: a
  filtered HNSW scan returns at most ``hnsw.ef_search`` candidates before filtering, so it can
  miss the best rows or return fewer than k, and the planner does pick it for the plain
  ``WHERE patient_id = p ORDER BY z <#> q LIMIT k`` when one patient holds most rows. Here
  the rows come from the btree on ``patient_id`` (a sequential scan when the patient is most of
  the table) and are scored exactly: O(rows of the patient).
  :meth:`PostgresStore.explain_search` shows the plan.
- population scope (``None``): by default the same exact CTE over every live row, a sequential
  scan, O(rows); this keeps the contract (exact top-k, ties by insertion order). With
  ``population_search="hnsw"`` it uses the partial HNSW index (``vector_ip_ops``, live rows
  only) with ``hnsw.ef_search = clamp(4k, 40, 1000)`` and, on pgvector 0.8 or later,
  ``hnsw.iterative_scan = relaxed_order`` (the scan goes on until k rows of the tenant passed
  the filter, so other tenants' rows in the index cannot starve it; on a Citus coordinator the
  session passes these settings on to the workers): sub-linear but approximate, outside the
  contract. The index exists only in stores opened in that mode: the first such opening
  builds it (time proportional to the rows), and from then on every insert keeps it up to
  date, which costs a few milliseconds a 1024-d row (so an exact-mode store does not pay it).
  It is not built for ``dim > 2000`` (pgvector's limit), where search is always exact.

Writes are one transaction that first locks the tenant's ``meta`` row (readers go on; writers
queue, as with SQLite's ``BEGIN IMMEDIATE``), so positions stay dense (the i-th record has
``pos`` i) and supersession cannot race. A store made with several patient lanes
(``lanes.py``) takes that row's lock shared and locks the ``meta`` rows of the lanes a write
touches instead: writers of other lanes go on. Text containing NUL characters, which
PostgreSQL cannot store, is refused with :class:`InvalidInput`.

Scaling (DESIGN.md section 4): made on a Citus coordinator, the store distributes a patient's
tables by the patient and the tenant's own (``meta``, ``audit``, ``pseudonyms``) by the
tenant (``citus.py``), so one hospital's patients spread over the workers, a statement naming
a patient runs on its shard alone, and one naming only the tenant (population search) fans
out (docs/deploy.md, Citus). What stays one per tenant: its ``meta`` rows (the lock of each
lane, one by default) and its audit chains, on one worker.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar, Literal

import psycopg
from psycopg import sql

from ..._errors import InvalidInput, StoreError
from ..._records import Vector
from ..._settings import DEFAULT_TENANT, check_tenant
from ..._tier_records import AuditRow
from ..base import VectorKind, check_needle
from ..batch import ERASED_TABLES, WriteBatch
from ..codec import FieldCodec
from ..lanes import check_lanes
from ..sql_core import SqlTables, insert_sql
from ..sql_rows import initial_meta, schema_problem
from ..sql_store import SqlStore
from ..sql_write import Moved
from .audit_naming import rows_naming
from .citus import distribute, is_citus, patient_distributed
from .connection import PgDialect, to_pyformat
from .keys import PgKeyTable
from .pgvector import connect, iterative_scan, use_schema, vector_schema
from .readahead import ReadAhead
from .schema import FORMAT, HNSW, SCHEMA, SCHEMA_VERSION, TABLES
from .search import KINDS, PgVectors
from .statistics import analyze_erased
from .tenancy import add_indexes, check_new_tenant, delete_tenant, has_tenant_column, read_meta

__all__ = ["PostgresStore"]

_log = logging.getLogger("msm_mem")

HNSW_MAX_DIM = 2000
PopulationSearch = Literal["exact", "hnsw"]


class PostgresStore(SqlStore):
    """The server store of record, built from parts over one connection: the dialect
    (``connection.py``), the pgvector search (``search.py``), the key table (``keys.py``) and
    the read-ahead (``readahead.py``). Thread-safe (one connection behind a lock)."""

    CURRENT_SCHEMA: ClassVar[str] = SCHEMA_VERSION
    _sql: PgDialect
    _vectors: PgVectors

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        schema: str,
        codec: FieldCodec | None = None,
        population_search: PopulationSearch = "exact",
        tenant: str = DEFAULT_TENANT,
    ) -> None:
        if population_search not in ("exact", "hnsw"):
            raise InvalidInput(f"population_search must be 'exact' or 'hnsw', got {population_search!r}")
        self.schema = schema
        self.population_search: PopulationSearch = population_search
        use_schema(conn, schema)
        tenant = check_tenant(tenant)
        # schema 1 or 2 (opened for its upgrade only): no tenant column yet
        legacy = not has_tenant_column(conn)
        meta = read_meta(conn, tenant, legacy)
        if "dim" not in meta:
            raise StoreError(f"schema {schema!r} holds no store of tenant {tenant!r}")
        dim = int(meta["dim"])
        approximate = population_search == "hnsw" and dim <= HNSW_MAX_DIM
        if not legacy:  # a store made before an index gets it now (schema 1 or 2: in its upgrade)
            add_indexes(conn, schema)
        if approximate:
            for kind in KINDS:
                conn.execute(HNSW.format(kind=kind).encode())
        self._sql = PgDialect(
            conn,
            schema,
            tenant,
            legacy=legacy,
            on_reconnect=lambda: self._keys.sync(),  # other connections may have written meanwhile
            on_write=lambda: self._ahead.forget(),
        )
        self._sql.moves = patient_distributed(conn)
        lanes = meta.get("lanes", "1")
        if not lanes.isdigit():
            raise StoreError(f"meta lanes of tenant {tenant!r} is damaged ({lanes!r})")
        self._sql.lanes = check_lanes(int(lanes))
        tables = SqlTables(self._sql, tenant)
        tables.lanes = self._sql.lanes
        if codec is not None:
            tables.use_codec(codec)
        self._keys = PgKeyTable(self._sql.db, tenant)
        self._ahead = ReadAhead(self._sql, tables, self._keys, dim=dim)
        self._vectors = PgVectors(
            self._sql, self._ahead, dim=dim, tenant=tenant, approximate=approximate, iterative=iterative_scan(conn)
        )
        super().__init__(
            tables,
            cache=self._ahead,
            vectors=self._vectors,
            keys=self._keys,
            committed=self._committed,
            dim=dim,
            encoder_name=meta["encoder"],
            # a store made before stores had an id gets one in its upgrade (no ciphertext can be
            # bound to it yet: the governed API could not open such a store); "tenant" before schema 3
            store_id=meta.get("store_id") or meta.get("tenant") or uuid.uuid4().hex,
            schema_version=meta.get("schema", ""),
        )

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
        tenant: str = DEFAULT_TENANT,
        lanes: int = 1,
    ) -> PostgresStore:
        """Create a new store of ``tenant`` in ``schema`` (created if absent, which needs CREATE
        on the database; an existing schema needs only CREATE on it; its tables too, unless
        other tenants' stores have made them). ``lanes`` (1 to 256) cuts its patients into that
        many lanes (``lanes.py``), each with its own write lock and audit chain.

        Installs the pgvector extension when the database lacks it (that needs the privilege
        to create extensions). Raises :class:`StoreError` when the schema already holds a
        store of the tenant, tables of an older schema or of other vector sizes, or the server
        cannot be reached. PHI fields are refused until an encrypting ``codec`` is given here
        or to :meth:`use_codec`.
        """
        check_tenant(tenant)
        check_lanes(lanes)
        if not isinstance(dim, int) or dim < 1:
            raise InvalidInput(f"dim must be a positive integer, got {dim!r}")
        conn = connect(dsn)
        try:
            if vector_schema(conn) is None:
                conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            ident, ext = sql.Identifier(schema), sql.Identifier(vector_schema(conn) or "public")
            with conn.transaction():
                # a role that owns an existing schema may lack CREATE on the database, which
                # CREATE SCHEMA IF NOT EXISTS checks even when the schema is there
                if conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone() is None:
                    conn.execute(sql.SQL("CREATE SCHEMA {}").format(ident))
                meta = f"{ident.as_string(conn)}.meta"
                exists = conn.execute("SELECT to_regclass(%s)", (meta,)).fetchone() != (None,)
                conn.execute(sql.SQL("SET LOCAL search_path TO {}, {}").format(ident, ext))
                if exists:
                    check_new_tenant(conn, schema, tenant, dim)
                else:
                    conn.execute(SCHEMA.format(dim=dim).encode())
                    if is_citus(conn):  # a Citus coordinator: the tables are distributed at once
                        distribute(conn)
                rows = [("format", FORMAT), ("schema", SCHEMA_VERSION), ("dim", str(dim)), ("encoder", encoder)]
                rows += [("store_id", uuid.uuid4().hex), *initial_meta(lanes)]
                if lanes > 1:
                    rows += [("lanes", str(lanes)), *((f"lane:{lane}", "") for lane in range(lanes))]
                conn.cursor().executemany(to_pyformat(insert_sql("meta")), [(*row, tenant) for row in rows])
            store = cls(conn, schema, codec, population_search, tenant)
            store._sql.dsn = dsn
            return store
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
        upgrading: bool = False,
        tenant: str = DEFAULT_TENANT,
    ) -> PostgresStore:
        """Open the existing store of ``tenant``; a schema that holds none raises
        :class:`StoreError`, and so does a store of an older schema unless ``upgrading`` (for
        :meth:`upgrade` only; its rows become ``tenant``'s)."""
        check_tenant(tenant)
        conn = connect(dsn)
        try:
            meta_table = f"{sql.Identifier(schema).as_string(conn)}.meta"
            if conn.execute("SELECT to_regclass(%s)", (meta_table,)).fetchone() == (None,):
                raise StoreError(f"schema {schema!r} is not an msm-mem store (no meta table); run `msm-mem init`")
            try:
                with conn.transaction():
                    conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(schema)))
                    meta = read_meta(conn, tenant, not has_tenant_column(conn))
            except psycopg.Error as exc:
                raise StoreError(f"schema {schema!r} is not a readable msm-mem store: {exc}") from exc
            if not meta:
                raise StoreError(f"schema {schema!r} holds no store of tenant {tenant!r}; run `msm-mem init`")
            if meta.get("format") != FORMAT:
                raise StoreError(f"schema {schema!r} is not an msm-mem store (format {meta.get('format')!r})")
            problem = schema_problem(meta.get("schema"), SCHEMA_VERSION, upgrading)
            if problem:
                raise StoreError(f"schema {schema!r}: {problem}")
            store = cls(conn, schema, codec, population_search, tenant)
            store._sql.dsn = dsn
            return store
        except BaseException:
            conn.close()
            raise

    def close(self) -> None:
        self._sql.close(self._keys.forget)

    def drop(self) -> None:
        """Delete this store: its tenant's rows, then the tables when no other tenant has a store
        in them (and the schema when nothing else is left in it), then close. Irreversible;
        used to undo a store that was made by a failed ``init``."""
        with self._sql.db() as conn, conn.transaction():
            if self._sql.legacy or not delete_tenant(conn, self.tenant):
                for name in TABLES:
                    ident = sql.Identifier(self.schema), sql.Identifier(name)
                    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}.{} CASCADE").format(*ident))
            left = conn.execute(
                "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s",
                (self.schema,),
            ).fetchone()
            if left == (0,):
                conn.execute(sql.SQL("DROP SCHEMA {}").format(sql.Identifier(self.schema)))
        self.close()

    def keys(self) -> PgKeyTable:
        return self._keys

    def _committed(self, batch: WriteBatch, moved: list[Moved]) -> None:
        """Nothing cached to follow (the server indexes its rows); after an erasure the erased
        tables' planner statistics are sampled again (``statistics.py``)."""
        if batch.erase:
            try:
                with self._sql.db() as conn:
                    analyze_erased(conn, self.schema, [*ERASED_TABLES, "keys", "pseudonyms"])
            except psycopg.Error as exc:  # committed already; autovacuum analyzes them later
                _log.warning("the erased tables were not analyzed (%s); the next ANALYZE renews their statistics", exc)

    def sync(self) -> None:
        """Forget the cached data keys and the rows read ahead: other connections may have written since."""
        with self._db():
            self._ahead.forget()
        self._keys.sync()

    def prefetch(self, patient_ids: Sequence[str], queries: Sequence[tuple[str, Vector]] = ()) -> None:
        """Read ahead what governed turns of these patients read, and the novelty searches of
        ``queries``, in one round trip (``readahead.py``)."""
        self._ahead.prefetch(patient_ids, queries)

    def explain_search(self, kind: VectorKind, z: Vector, k: int, scope: str | None) -> str:
        """The server's plan (``EXPLAIN`` text) of :meth:`search` with these arguments."""
        return self._vectors.explain_search(kind, z, k, scope)

    def iter_audit_naming(self, needle: bytes, start_seq: int = 1) -> Iterator[AuditRow]:
        """As the store contract says, the rows selected by the server (audit_naming.py)."""
        check_needle(needle)
        first = max(start_seq, self.audit_base()[0] + 1)
        return rows_naming(self._sql.db, self.tenant, needle, first, max(seq for seq, _ in self.audit_heads()))

"""The server store: PostgreSQL with pgvector, same tables and behaviour as the SQLite store.

One store is one PostgreSQL schema (default ``msm_mem``) holding the tables ``meta``,
``episodic``, ``visual`` and ``semantic`` with the SQLite store's columns in the same order
(``semantic`` has one more, trailing: ``ord``, insertion order, SQLite's ``rowid``), plus the
governed tiers' tables (``schema.py``). Vectors are pgvector ``vector(dim)`` columns. Every
query but the search and the batched reads of a batch of turns (``readahead.py``) is the
shared SQL store's; a write transaction runs in pipeline mode (``pipeline.py``); vectors
travel in pgvector's binary format (``pgvector.py``) and load as the native float32 bytes the
row converters expect, bit for bit. The store analyzes its tables each time one doubles
(``statistics.py``), so the plans the server keeps for its prepared statements are costed for
the tables as they are.

Search (``z <#> q`` is pgvector's negative inner product; on unit vectors, minus the cosine):

- patient scope: ``WHERE patient_id = p`` inside a ``MATERIALIZED`` CTE, then ``ORDER BY
  z <#> q, pos LIMIT k`` outside it. The CTE fences the ordering off from the HNSW index: a
  filtered HNSW scan returns at most ``hnsw.ef_search`` candidates before filtering, so it can
  miss the best rows or return fewer than k, and the planner does pick it for the plain
  ``WHERE patient_id = p ORDER BY z <#> q LIMIT k`` when one patient holds most rows. Here
  the rows come from the btree on ``patient_id`` (a sequential scan when the patient is most of
  the table) and are scored exactly: O(rows of the patient).
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

import contextlib
import select
import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, ClassVar, Literal

import psycopg
from psycopg import sql

from ..._errors import InvalidInput, StoreError
from ..._settings import DEFAULT_TENANT, check_tenant
from ..._tier_records import AuditRow
from ..base import VectorKind, check_needle
from ..codec import FieldCodec
from ..rows import EPISODIC_COLUMNS, VISUAL_COLUMNS
from ..sql_core import CommitLost, Rows, insert_sql
from ..sql_rows import initial_meta, schema_problem
from .audit_naming import rows_naming
from .keys import PgKeyTable
from .pgvector import Vec, connect, use_schema, vector_schema
from .pipeline import Pending
from .readahead import KINDS, ReadAhead
from .schema import FORMAT, HNSW, SCHEMA, SCHEMA_VERSION, TABLES
from .statistics import CHECK_EVERY, analyze_grown
from .tenancy import add_indexes, add_tenant, check_new_tenant, delete_tenant, has_tenant_column, read_meta

__all__ = ["PostgresStore"]

HNSW_MAX_DIM = 2000
PopulationSearch = Literal["exact", "hnsw"]


def _dropped(conn: psycopg.Connection[Any]) -> bool:
    """Whether the server closed this idle connection: its socket is readable (end of file, or
    the server's last words) although no query is running. No round trip. Readable for another
    reason (a parameter report after a configuration reload) costs one needless reconnect."""
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError, psycopg.Error):
        return True
    return bool(readable)


@lru_cache(maxsize=512)
def _dialect(query: str) -> str:
    """The shared queries' ``?`` placeholders as psycopg's ``%s`` (they hold no other ``?`` or ``%``)."""
    return query.replace("?", "%s")


class PostgresStore(ReadAhead):
    """The server store of record. Thread-safe (one connection behind a lock)."""

    ORDER: ClassVar[dict[str, str]] = {
        "episodic": "pos",
        "visual": "pos",
        "semantic": "ord",
        "claims": "ord",
        "entities": "id",
        "relationships": "id",
    }
    HOLDS_NUL: ClassVar[bool] = False
    CURRENT_SCHEMA: ClassVar[str] = SCHEMA_VERSION
    INTEGRITY_ERROR: ClassVar[type[Exception]] = psycopg.IntegrityError
    DISCONNECTED: ClassVar[tuple[type[Exception], ...]] = (psycopg.OperationalError,)

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
        self._approximate = population_search == "hnsw"  # (and dim <= HNSW_MAX_DIM, below)
        self._conn = conn
        self._lock = threading.RLock()
        self._closed = False
        self._depth = 0  # nesting of _db: a lost connection is replaced only outside every use
        self._pipe: psycopg.Pipeline | None = None  # inside a write transaction (pipeline.py)
        self._dsn: str | None = None  # set by create/open: where to reconnect
        self._written = 0  # statements and rows written since the last look at the table statistics
        self._init_codec(codec)
        use_schema(conn, schema)
        self.tenant = check_tenant(tenant)
        # schema 1 or 2 (opened for its upgrade only): no tenant column yet
        self._legacy = not has_tenant_column(conn)
        meta = read_meta(conn, self.tenant, self._legacy)
        if "dim" not in meta:
            raise StoreError(f"schema {schema!r} holds no store of tenant {self.tenant!r}")
        self.dim = int(meta["dim"])
        self.encoder_name = meta["encoder"]
        # a store made before stores had an id gets one in its upgrade (no ciphertext can be
        # bound to it yet: the governed API could not open such a store); "tenant" before schema 3
        self.store_id = meta.get("store_id") or meta.get("tenant") or uuid.uuid4().hex
        self.schema_version = meta.get("schema", "")
        self._approximate = self._approximate and self.dim <= HNSW_MAX_DIM
        if not self._legacy:  # a store made before an index gets it now (schema 1 or 2: in its upgrade)
            add_indexes(conn, schema)
        if self._approximate:
            for kind in KINDS:
                conn.execute(HNSW.format(kind=kind).encode())
        self._keys = PgKeyTable(self._db, self.tenant)

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
    ) -> PostgresStore:
        """Create a new store of ``tenant`` in ``schema`` (created if absent, which needs CREATE
        on the database; an existing schema needs only CREATE on it; its tables too, unless
        other tenants' stores have made them).

        Installs the pgvector extension when the database lacks it (that needs the privilege
        to create extensions). Raises :class:`StoreError` when the schema already holds a
        store of the tenant, tables of an older schema or of other vector sizes, or the server
        cannot be reached. PHI fields are refused until an encrypting ``codec`` is given here
        or to :meth:`use_codec`.
        """
        check_tenant(tenant)
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
                rows = [("format", FORMAT), ("schema", SCHEMA_VERSION), ("dim", str(dim)), ("encoder", encoder)]
                rows += [("store_id", uuid.uuid4().hex), *initial_meta()]
                conn.cursor().executemany(_dialect(insert_sql("meta")), [(*row, tenant) for row in rows])
            store = cls(conn, schema, codec, population_search, tenant)
            store._dsn = dsn
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
            store._dsn = dsn
            return store
        except BaseException:
            conn.close()
            raise

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._keys.forget()
                self._conn.close()
                self._closed = True

    def drop(self) -> None:
        """Delete this store: its tenant's rows, then the tables when no other tenant has a store
        in them (and the schema when nothing else is left in it), then close. Irreversible;
        used to undo a store that was made by a failed ``init``."""
        with self._db() as conn, conn.transaction():
            if self._legacy or not delete_tenant(conn, self.tenant):
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

    def sync(self) -> None:
        """Forget the cached data keys and the rows read ahead: other connections may have written since."""
        with self._db():
            self._forget_ahead()
        self._keys.sync()

    def iter_audit_naming(self, needle: bytes, start_seq: int = 1) -> Iterator[AuditRow]:
        """As the store contract says, the rows selected by the server (audit_naming.py)."""
        check_needle(needle)
        first = max(start_seq, self.audit_base()[0] + 1)
        return rows_naming(self._db, self.tenant, needle, first, self.audit_head()[0])

    # the dialect ---------------------------------------------------------------------------

    @contextmanager
    def _db(self) -> Iterator[psycopg.Connection[Any]]:
        """The connection, under the lock, with database errors mapped to the library's.

        A connection the server dropped (a restart, a failover) fails the call in flight with
        :class:`StoreError` (its transaction rolled back, nothing written) and is opened again
        by the next call; one the server closed while idle (between calls) is noticed before
        it is used (its socket reads end of file) and opened again at once."""
        with self._lock:
            if self._closed:
                raise StoreError("the store is closed")
            if self._depth == 0 and (self._conn.closed or self._conn.broken or _dropped(self._conn)):
                self._reconnect()
            self._depth += 1
            try:
                yield self._conn
            except psycopg.DataError as exc:
                raise InvalidInput(f"value refused by the database: {exc}") from exc
            except psycopg.OperationalError as exc:
                raise StoreError(f"database error, nothing was written by this call: {exc}") from exc
            finally:
                self._depth -= 1

    def _reconnect(self) -> None:
        if self._dsn is None:
            raise StoreError("the connection to the PostgreSQL server was lost")
        conn = connect(self._dsn)
        try:
            use_schema(conn, self.schema)
        except BaseException:
            conn.close()
            raise
        old, self._conn = self._conn, conn
        with contextlib.suppress(psycopg.Error, OSError):
            old.close()  # dropped by the server already; closing frees what is left of it here
        self._keys.sync()  # other connections may have written meanwhile

    def _q(self, query: str, args: Sequence[Any] = ()) -> Rows:
        cur = self._conn.execute(_dialect(query), args or None, binary=True)
        if self._pipe is None:
            return cur
        self._written += 1
        return Pending(cur, self._pipe)

    def _flush(self) -> None:
        if self._pipe is not None:
            self._pipe.sync()

    def _many(self, query: str, rows: Sequence[Sequence[Any]]) -> None:
        self._conn.cursor().executemany(_dialect(query), rows)
        self._written += len(rows)

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """Writers queue on ``EXCLUSIVE`` table locks (readers go on), as with SQLite's ``BEGIN
        IMMEDIATE``, so positions stay dense and supersession cannot race. Its statements run
        in pipeline mode (``pipeline.py``), all answered before the commit. A connection lost
        while the commit is sent is :class:`CommitLost` (the server may have committed). Once
        :data:`CHECK_EVERY` statements and rows were written, the tables that doubled since
        their last ANALYZE are analyzed (``statistics.py``: the kept plans were costed for their
        old size)."""
        committing = False
        self._forget_ahead()  # this write may change what was read ahead
        try:
            with self._conn.transaction():
                try:
                    with self._conn.pipeline() as self._pipe:
                        self._conn.execute(*self._write_lock())
                        yield
                finally:
                    self._pipe = None
                committing = True
        except psycopg.IntegrityError as exc:
            raise InvalidInput(f"write refused by the store: {exc}") from exc
        except psycopg.OperationalError as exc:
            if committing:
                raise CommitLost(str(exc).strip()) from exc
            raise
        if self._written >= CHECK_EVERY:
            self._written = 0
            with contextlib.suppress(psycopg.Error):  # (committed already; statistics only steer plans)
                analyze_grown(self._conn, self.schema)

    def _write_lock(self) -> tuple[str, tuple[str, ...]]:
        """The statement writers of this tenant queue on: a row lock on the tenant's ``meta``
        row of its schema (on one shard of a Citus cluster; other tenants write on); a table
        lock in a store of schema 1 or 2 (upgrading)."""
        if self._legacy:
            return "LOCK TABLE episodic, visual, semantic IN EXCLUSIVE MODE", ()
        return "SELECT 1 FROM meta WHERE tenant = %s AND key = 'schema' FOR UPDATE", (self.tenant,)

    def _add_tenant(self) -> None:
        add_tenant(self._conn, self.tenant)
        self._legacy = False

    def _reconnect_after_loss(self) -> None:
        if self._conn.closed or self._conn.broken:
            self._reconnect()

    def _positions(self) -> dict[VectorKind, int]:
        return {
            kind: int(
                self._q(f"SELECT COALESCE(MAX(pos) + 1, 0) FROM {kind} WHERE tenant = ?", (self.tenant,)).fetchone()[0]
            )
            for kind in KINDS
        }

    def _vector_rows(self, kind: VectorKind, rows: list[tuple[Any, ...]]) -> Sequence[Sequence[Any]]:
        z = (EPISODIC_COLUMNS if kind == "episodic" else VISUAL_COLUMNS).index("z")
        return [(*r[:z], Vec(r[z]), *r[z + 1 :]) for r in rows]

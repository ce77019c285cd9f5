"""The server store's dialect: its one connection behind a lock, replaced when the server drops
it, the shared SQL's ``?`` placeholders as psycopg's, and write transactions in pipeline mode
(``pipeline.py``) that queue on a row lock of the tenant.

A connection the server dropped (a restart, a failover) fails the call in flight with
:class:`StoreError` (its transaction rolled back, nothing written) and is opened again by the
next call; one the server closed while idle (between calls) is noticed before it is used (its
socket reads end of file) and opened again at once.
"""

from __future__ import annotations

import contextlib
import select
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from functools import lru_cache
from typing import Any

import psycopg

from ..._errors import InvalidInput, StoreError, WriteConflict
from ..row_digest import COLUMNS
from ..sql_core import CommitLost, Rows, update_sql
from .pgvector import connect, use_schema
from .pipeline import Pending
from .statistics import CHECK_EVERY, analyze_grown
from .tenancy import add_tenant

__all__ = ["PgDialect", "to_pyformat"]


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
def to_pyformat(query: str) -> str:
    """The shared queries' ``?`` placeholders as psycopg's ``%s`` (they hold no other ``?`` or ``%``)."""
    return query.replace("?", "%s")


class PgDialect:
    """How the shared SQL runs on the server store's connection (one, behind a lock)."""

    order: Mapping[str, str] = {
        "episodic": "pos",
        "visual": "pos",
        "semantic": "ord",
        "claims": "ord",
        "entities": "id",
        "relationships": "id",
    }
    holds_nul = False
    integrity_error: type[Exception] = psycopg.IntegrityError
    disconnected: tuple[type[Exception], ...] = (psycopg.OperationalError,)

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        schema: str,
        tenant: str,
        *,
        legacy: bool,
        on_reconnect: Callable[[], None],
        on_write: Callable[[], None],
    ) -> None:
        """``conn`` uses ``schema`` (its search path set); ``tenant`` names the row writers
        queue on; ``legacy``: a store of schema 1 or 2, opened for its upgrade only.
        ``on_reconnect`` runs after a new connection replaced a lost one (other connections
        may have written meanwhile), ``on_write`` as each write transaction begins (what was
        read ahead may change)."""
        self.conn = conn
        self.schema = schema
        self.tenant = tenant
        self.legacy = legacy
        self.lock = threading.RLock()
        self.closed = False
        self.dsn: str | None = None  # set by the store's create/open: where to reconnect
        #: statements and rows written since the last look at the table statistics
        self.written = 0
        self._depth = 0  # nesting of db: a lost connection is replaced only outside every use
        self._pipe: psycopg.Pipeline | None = None  # inside a write transaction (pipeline.py)
        self._on_reconnect = on_reconnect
        self._on_write = on_write
        #: the tables whose rows cannot change patient in place (``citus.patient_distributed``)
        self.moves: frozenset[str] = frozenset()
        #: the store's patient lanes (``lanes.py``): above 1, writers lock their lanes' rows
        self.lanes = 1

    @contextmanager
    def db(self) -> Iterator[psycopg.Connection[Any]]:
        """The connection, under the lock, with database errors mapped to the library's; a
        dropped connection is replaced first (see the module)."""
        with self.lock:
            if self.closed:
                raise StoreError("the store is closed")
            if self._depth == 0 and (self.conn.closed or self.conn.broken or _dropped(self.conn)):
                self._reconnect()
            self._depth += 1
            try:
                yield self.conn
            except psycopg.DataError as exc:
                raise InvalidInput(f"value refused by the database: {exc}") from exc
            except psycopg.OperationalError as exc:
                raise StoreError(f"database error, nothing was written by this call: {exc}") from exc
            except psycopg.InternalError as exc:  # e.g. a Citus coordinator that lost a worker mid-statement
                raise StoreError(f"database error, nothing was written by this call: {exc}") from exc
            finally:
                self._depth -= 1

    def _reconnect(self) -> None:
        if self.dsn is None:
            raise StoreError("the connection to the PostgreSQL server was lost")
        conn = connect(self.dsn)
        try:
            use_schema(conn, self.schema)
        except BaseException:
            conn.close()
            raise
        old, self.conn = self.conn, conn
        with contextlib.suppress(psycopg.Error, OSError):
            old.close()  # dropped by the server already; closing frees what is left of it here
        self._on_reconnect()

    def q(self, query: str, args: Sequence[Any] = ()) -> Rows:
        cur = self.conn.execute(to_pyformat(query), args or None, binary=True)
        if self._pipe is None:
            return cur
        self.written += 1
        return Pending(cur, self._pipe)

    def flush(self) -> None:
        if self._pipe is not None:
            self._pipe.sync()

    def many(self, query: str, rows: Sequence[Sequence[Any]]) -> None:
        self.conn.cursor().executemany(to_pyformat(query), rows)
        self.written += len(rows)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Writers queue on a row lock (:meth:`_write_lock`; readers go on), as with SQLite's
        ``BEGIN IMMEDIATE``, so positions stay dense and supersession cannot race. Its
        statements run in pipeline mode (``pipeline.py``), all answered before the commit. A
        connection lost while the commit is sent, or a Citus coordinator's failure to commit on
        a worker, is :class:`CommitLost` (the server may have committed). Once
        :data:`CHECK_EVERY` statements and rows were written, the tables that doubled since
        their last ANALYZE are analyzed (``statistics.py``: the kept plans were costed for their
        old size)."""
        committing = False
        self._on_write()  # this write may change what was read ahead
        try:
            with self.conn.transaction():
                try:
                    with self.conn.pipeline() as self._pipe:
                        self.conn.execute(*self._write_lock())
                        yield
                finally:
                    self._pipe = None
                committing = True
        except psycopg.errors.UniqueViolation as exc:
            raise WriteConflict(
                f"a record with this id is stored already (by another writer first), nothing was written: {exc}"
            ) from exc
        except psycopg.IntegrityError as exc:
            raise InvalidInput(f"write refused by the store: {exc}") from exc
        except psycopg.OperationalError as exc:
            if committing:
                raise CommitLost(str(exc).strip()) from exc
            raise
        except psycopg.InternalError as exc:
            if committing:  # a Citus coordinator whose worker failed at the commit: it may have committed
                raise CommitLost(str(exc).strip()) from exc
            raise
        if self.written >= CHECK_EVERY:
            self.written = 0
            with contextlib.suppress(psycopg.Error):  # (committed already; statistics only steer plans)
                analyze_grown(self.conn, self.schema)

    def _write_lock(self) -> tuple[str, tuple[str, ...]]:
        """The statement writers of this tenant queue on: a row lock on the tenant's ``meta``
        row of its schema (on one shard of a Citus cluster; other tenants write on); a table
        lock in a store of schema 1 or 2 (upgrading)."""
        if self.legacy:
            return "LOCK TABLE episodic, visual, semantic IN EXCLUSIVE MODE", ()
        if self.lanes > 1:  # each write then locks its lanes' rows (lock_lanes)
            return "SELECT 1 FROM meta WHERE tenant = %s AND key = 'schema' FOR SHARE", (self.tenant,)
        return "SELECT 1 FROM meta WHERE tenant = %s AND key = 'schema' FOR UPDATE", (self.tenant,)

    def lock_lanes(self, lanes: Sequence[int]) -> None:
        """Lock the lanes' ``meta`` rows (``lane:<n>``) in lane order: writers of other lanes go on."""
        keys = [f"lane:{lane}" for lane in sorted(lanes)]
        marks = ", ".join("?" * len(keys))
        found = self.q(
            f"SELECT key FROM meta WHERE tenant = ? AND key IN ({marks}) ORDER BY length(key), key FOR UPDATE",
            (self.tenant, *keys),
        ).fetchall()
        if len(found) != len(keys):
            raise StoreError(f"meta lacks the lock rows of lanes {sorted(lanes)}: the store is damaged")

    def writer_turn(self) -> AbstractContextManager[object]:
        """Nothing: writers queue on the server's lock (:meth:`_write_lock`)."""
        return nullcontext()

    def add_tenant(self, tenant: str) -> None:
        add_tenant(self.conn, tenant)
        self.legacy = False

    def rewrite(self, table: str, sets: Mapping[str, object], tenant: str, record_id: str, patient_id: str) -> None:
        """The UPDATE names the patient, so a Citus cluster runs it on the patient's shard
        alone. In a table distributed by the patient, a row given another patient is copied
        under its new id and patient (its insertion order ``ord`` kept), the old row deleted,
        and the copy updated: Citus does not update a distribution column."""
        old = (tenant, record_id, patient_id)
        new_id, new_patient = str(sets["id"]), str(sets["patient_id"])
        if table in self.moves and new_patient != patient_id:
            names = [n for n, _ in COLUMNS[table] if n not in ("id", "patient_id")]
            names += [c for t, c in self.order.items() if t == table and c == "ord"]
            cols = ", ".join(f'"{n}"' for n in names)
            self.q(
                f"INSERT INTO {table} (id, patient_id, {cols}, tenant) OVERRIDING SYSTEM VALUE"
                f" SELECT CAST(? AS TEXT), CAST(? AS TEXT), {cols}, tenant FROM {table}"
                " WHERE tenant = ? AND id = ? AND patient_id = ?",
                (new_id, new_patient, *old),
            )
            self.q(f"DELETE FROM {table} WHERE tenant = ? AND id = ? AND patient_id = ?", old)
            old = (tenant, new_id, new_patient)
        if new_patient == old[2]:  # pinned by the condition (and a distribution column is never SET)
            sets = {k: v for k, v in sets.items() if k != "patient_id"}
        self.q(update_sql(table, list(sets)) + " AND patient_id = ?", (*sets.values(), *old))

    def reconnect_after_loss(self) -> None:
        if self.conn.closed or self.conn.broken:
            self._reconnect()

    def close(self, before: Callable[[], None]) -> None:
        """Run ``before`` and close the connection (once)."""
        with self.lock:
            if not self.closed:
                before()
                self.conn.close()
                self.closed = True

"""What the SQL stores share below their queries: the dialect hooks and the reads by id.

:class:`SqlCore` is the base of :class:`~msm_mem._storage.sql_store.SqlStore`. The queries of
the shared modules are written once with ``?`` placeholders; each backend (``sqlite/``,
``postgres/``) says how to run one (:meth:`SqlCore._q`), how to hold its connection
(:meth:`SqlCore._db`), how a write transaction starts (:meth:`SqlCore._transaction`) and which
column orders each table's rows by insertion (:attr:`SqlCore.ORDER`).

Every statement names the store's tenant (``tenant = ?``, the distribution column that ends
every table, see ``postgres/schema.py``): a store reads and writes only its own tenant's rows,
and a Citus cluster routes each statement to the one shard holding them.
"""

from __future__ import annotations

import threading
from abc import abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from functools import lru_cache
from typing import Any, ClassVar, Protocol, TypeVar

from .._errors import NotFound
from .base import Store
from .codec import FieldCodec, NoCodec, encrypting_codec
from .row_digest import COLUMNS

__all__ = ["UPSERT_META", "CommitLost", "Rows", "SqlCore", "insert_sql"]

T = TypeVar("T")
#: ids per ``IN (...)`` list: well under every backend's limit on bound parameters
ID_CHUNK = 500
#: rows per page of an iteration (the lock is held for one page at a time)
PAGE = 1000
#: the columns of the tables the row digests do not cover, in schema order (tenant aside)
_OTHER_COLUMNS = {
    "meta": ("key", "value"),
    "audit": ("seq", "payload", "event_hash"),
    "keys": ("key_id", "patient_ref", "kek_id", "wrapped", "created_at", "shredded"),
    "pseudonyms": ("key_id", "pseudonym", "token"),
}

#: set one ``meta`` row of a tenant: ``(key, value, tenant)``
UPSERT_META = (
    "INSERT INTO meta (key, value, tenant) VALUES (?, ?, ?)"
    " ON CONFLICT (tenant, key) DO UPDATE SET value = excluded.value"
)


@lru_cache(maxsize=32)
def insert_sql(table: str) -> str:
    """``INSERT INTO table (every column..., tenant) VALUES (?, ...)``: a row as the converters
    make it (schema order) followed by the tenant. The columns are named because PostgreSQL's
    ``semantic`` and ``claims`` keep an identity column between the two."""
    names = [name for name, _ in COLUMNS[table]] if table in COLUMNS else list(_OTHER_COLUMNS[table])
    listed = ", ".join(f'"{n}"' for n in [*names, "tenant"])
    return f"INSERT INTO {table} ({listed}) VALUES ({','.join('?' * (len(names) + 1))})"


class CommitLost(Exception):
    """The connection was lost while the commit was sent: the server may or may not have
    committed. Raised by a backend's :meth:`SqlCore._transaction`, resolved by the write path
    (never escapes the store)."""


class Rows(Protocol):
    """The cursor of one statement, as both drivers return it."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class SqlCore(Store):
    """The connection, the codec and the reads by id of a SQL store; backends fill the hooks."""

    #: the column ordering each table's rows by insertion (an expression of it where the planner needs one)
    ORDER: ClassVar[dict[str, str]]
    #: whether a text column can hold NUL (so a NUL in an id can match a stored row)
    HOLDS_NUL: ClassVar[bool]
    #: the driver's constraint-violation error
    INTEGRITY_ERROR: ClassVar[type[Exception]]
    #: the driver's errors of a lost connection (none for an embedded store)
    DISCONNECTED: ClassVar[tuple[type[Exception], ...]] = ()

    _lock: threading.RLock
    _closed: bool
    _codec: FieldCodec
    #: the tenant whose rows this store reads and writes (every statement names it)
    tenant: str

    def _init_codec(self, codec: FieldCodec | None) -> None:
        self._codec = NoCodec()
        if codec is not None:
            self.use_codec(codec)

    def use_codec(self, codec: FieldCodec) -> None:
        self._codec = encrypting_codec(codec)

    @abstractmethod
    def _db(self) -> AbstractContextManager[object]:
        """The connection under the store's lock; StoreError once closed, driver errors mapped."""

    @abstractmethod
    def _q(self, sql: str, args: Sequence[Any] = ()) -> Rows:
        """Run one statement (``?`` placeholders) on the connection; the caller holds :meth:`_db`."""

    @abstractmethod
    def _many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Run one statement once per row (``?`` placeholders); the caller holds :meth:`_db`."""

    def _flush(self) -> None:  # noqa: B027  (a hook: only a pipelining backend queues statements)
        """Inside :meth:`_transaction`: have the statements sent so far answered, so that an
        error of one is raised here (default: every statement was answered when it ran)."""

    @abstractmethod
    def _transaction(self) -> AbstractContextManager[None]:
        """A write transaction (committed at the end, rolled back on any error) under :meth:`_db`."""

    # reads by id ---------------------------------------------------------------------------

    def _rows_by_id(self, table: str, ids: Sequence[str]) -> list[Any]:
        """The stored rows (``SELECT *``) of those ids that exist, in no particular order."""
        unique = list(dict.fromkeys(ids))
        found: list[Any] = []
        with self._db():
            for start in range(0, len(unique), ID_CHUNK):
                part = unique[start : start + ID_CHUNK]
                marks = ",".join("?" * len(part))
                found += self._q(
                    f"SELECT * FROM {table} WHERE tenant = ? AND id IN ({marks})", (self.tenant, *part)
                ).fetchall()
        return found

    def _find(self, table: str, ids: Sequence[str], conv: Callable[[Any, FieldCodec], T], at: int) -> dict[str, T]:
        """``id -> record`` of those ids that exist (``at``: the id's column)."""
        with self._db():
            return {r[at]: conv(r, self._codec) for r in self._rows_by_id(table, ids)}

    def _get(
        self, table: str, ids: Sequence[str], conv: Callable[[Any, FieldCodec], T], at: int, what: str = ""
    ) -> list[T]:
        """Records in the order of ``ids``; NotFound names the first unknown id."""
        if not ids:
            return []
        found = self._find(table, ids, conv, at)
        missing = [i for i in ids if i not in found]
        if missing:
            raise NotFound(f"no {what or f'{table} record'} {missing[0]!r}")
        return [found[i] for i in ids]

    def _select(self, sql: str, args: Sequence[Any], conv: Callable[[Any, FieldCodec], T]) -> list[T]:
        with self._db():
            return [conv(r, self._codec) for r in self._q(sql, args).fetchall()]

    def _iter(
        self, table: str, columns: Sequence[str], conv: Callable[[Any, FieldCodec], T], keys: Sequence[str]
    ) -> Iterator[T]:
        """Every row of ``table`` in ``keys`` order (keyset pagination; the lock held per page)."""
        cols, at = ", ".join(keys), [columns.index(k) for k in keys]
        last: tuple[Any, ...] = ()
        while True:
            after = f" AND ({cols}) > ({', '.join('?' * len(keys))})" if last else ""
            with self._db():
                rows = self._q(
                    f"SELECT * FROM {table} WHERE tenant = ?{after} ORDER BY {cols} LIMIT {PAGE}", (self.tenant, *last)
                ).fetchall()
                records = [conv(r, self._codec) for r in rows]
            yield from records
            if len(rows) < PAGE:
                return
            last = tuple(rows[-1][i] for i in at)

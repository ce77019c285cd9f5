"""What the parts of a SQL store share below their queries: the dialect, the reads by id and
the read cache's seam.

The queries of the shared parts are written once with ``?`` placeholders. Each backend
(``sqlite/``, ``postgres/``) gives a :class:`Dialect`: how to run one statement
(:meth:`Dialect.q`), how to hold its connection (:meth:`Dialect.db`), how a write transaction
starts (:meth:`Dialect.transaction`) and which column orders each table's rows by insertion
(:attr:`Dialect.order`). :class:`SqlTables` is one tenant's view of the tables through a
dialect, with the PHI codec: every shared part (records, tiers, audit, row digests, the write
path) is built over one. A :class:`PatientCache` answers the reads every governed turn repeats
(:class:`NoCache` reads them every time).

Every statement names the store's tenant (``tenant = ?``, the column that ends every table and
leads every key, see ``postgres/schema.py``): a store reads and writes only its own tenant's
rows. On a Citus cluster a statement that also names a patient runs on that patient's shard,
one that does not fans out to every shard (``postgres/citus.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from functools import lru_cache
from typing import Any, Protocol, TypeVar

from .._errors import NotFound
from .._records import SemanticState
from .._tier_records import Claim, ConsentRecord, Entity
from .codec import FieldCodec, NoCodec, encrypting_codec
from .row_digest import COLUMNS

__all__ = [
    "UPSERT_META",
    "CommitLost",
    "Dialect",
    "NoCache",
    "PatientCache",
    "Rows",
    "SqlTables",
    "in_order",
    "insert_sql",
    "update_sql",
]

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


def update_sql(table: str, names: Sequence[str]) -> str:
    """``UPDATE table SET name = ?, ... WHERE tenant = ? AND id = ?`` (the values, then the
    tenant and the id); a dialect may add its own conditions after it."""
    return f"UPDATE {table} SET {', '.join(f'{n} = ?' for n in names)} WHERE tenant = ? AND id = ?"


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
    committed. Raised by a backend's :meth:`Dialect.transaction`, resolved by the write path
    (never escapes the store)."""


class Rows(Protocol):
    """The cursor of one statement, as both drivers return it."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Dialect(Protocol):
    """How one backend runs the shared SQL: its connection, statements and transactions."""

    @property
    def order(self) -> Mapping[str, str]:
        """The column ordering each table's rows by insertion (an expression of it where the planner needs one)."""
        ...

    @property
    def holds_nul(self) -> bool:
        """Whether a text column can hold NUL (so a NUL in an id can match a stored row)."""
        ...

    @property
    def integrity_error(self) -> type[Exception]:
        """The driver's constraint-violation error."""
        ...

    @property
    def disconnected(self) -> tuple[type[Exception], ...]:
        """The driver's errors of a lost connection (none for an embedded store)."""
        ...

    def db(self) -> AbstractContextManager[object]:
        """The connection under the store's lock; StoreError once closed, driver errors mapped."""
        ...

    def q(self, sql: str, args: Sequence[Any] = ()) -> Rows:
        """Run one statement (``?`` placeholders) on the connection; the caller holds :meth:`db`."""
        ...

    def many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Run one statement once per row (``?`` placeholders); the caller holds :meth:`db`."""
        ...

    def flush(self) -> None:
        """Inside :meth:`transaction`: have the statements sent so far answered, so that an error
        of one is raised here (nothing to do where every statement was answered when it ran)."""
        ...

    def transaction(self) -> AbstractContextManager[None]:
        """A write transaction (committed at the end, rolled back on any error) under :meth:`db`."""
        ...

    def writer_turn(self) -> AbstractContextManager[object]:
        """Held around a write, before the connection's lock is taken: where writers of several
        processes queue for their turn without holding that lock (or nothing)."""
        ...

    def reconnect_after_loss(self) -> None:
        """Open a new connection after a lost one (StoreError where none can be lost)."""
        ...

    def add_tenant(self, tenant: str) -> None:
        """Inside the upgrade's transaction: give every table of a store of schema 1 or 2 the
        tenant column, its rows ``tenant``'s, and the keys of schema 3."""
        ...

    def lock_lanes(self, lanes: Sequence[int]) -> None:
        """Inside :meth:`transaction`: lock the ``meta`` rows of these lanes, in lane order, until
        it ends (a store of several lanes: :mod:`.lanes`; StoreError where a backend has one)."""
        ...

    def rewrite(self, table: str, sets: Mapping[str, object], tenant: str, record_id: str, patient_id: str) -> None:
        """Inside :meth:`transaction`: give the row ``record_id`` of ``patient_id`` the values
        ``sets`` (column -> value; its ``id`` and ``patient_id`` always among them). Where a row
        cannot change its patient in place (a Citus table distributed by it), a new patient
        moves the row (its insertion order kept)."""
        ...


def in_order(ids: Sequence[str], found: Mapping[str, T], what: str) -> list[T]:
    """``found``'s records in the order of ``ids``; NotFound names the first id it lacks."""
    missing = [i for i in ids if i not in found]
    if missing:
        raise NotFound(f"no {what} {missing[0]!r}")
    return [found[i] for i in ids]


class SqlTables:
    """One tenant's rows of a SQL store as every shared part reads them: the :class:`Dialect`
    that runs the statements, the tenant every statement names, the PHI codec (none until
    :meth:`use_codec`) and the reads by id."""

    def __init__(self, dialect: Dialect, tenant: str) -> None:
        self.dialect = dialect
        #: the tenant whose rows this store reads and writes (every statement names it)
        self.tenant = tenant
        self.codec: FieldCodec = NoCodec()
        #: the store's patient lanes (:mod:`.lanes`): its audit chains; 1 unless made with more
        self.lanes = 1

    def use_codec(self, codec: FieldCodec) -> None:
        """Set the PHI codec; StoreError unless it is encrypting."""
        self.codec = encrypting_codec(codec)

    def rows_by_id(self, table: str, ids: Sequence[str]) -> list[Any]:
        """The stored rows (``SELECT *``) of those ids that exist, in no particular order."""
        unique = list(dict.fromkeys(ids))
        found: list[Any] = []
        d = self.dialect
        with d.db():
            for start in range(0, len(unique), ID_CHUNK):
                part = unique[start : start + ID_CHUNK]
                marks = ",".join("?" * len(part))
                found += d.q(
                    f"SELECT * FROM {table} WHERE tenant = ? AND id IN ({marks})", (self.tenant, *part)
                ).fetchall()
        return found

    def find(self, table: str, ids: Sequence[str], conv: Callable[[Any, FieldCodec], T], at: int) -> dict[str, T]:
        """``id -> record`` of those ids that exist (``at``: the id's column)."""
        with self.dialect.db():
            return {r[at]: conv(r, self.codec) for r in self.rows_by_id(table, ids)}

    def get(
        self, table: str, ids: Sequence[str], conv: Callable[[Any, FieldCodec], T], at: int, what: str = ""
    ) -> list[T]:
        """Records in the order of ``ids``; NotFound names the first unknown id."""
        if not ids:
            return []
        return in_order(ids, self.find(table, ids, conv, at), what or f"{table} record")

    def select(self, sql: str, args: Sequence[Any], conv: Callable[[Any, FieldCodec], T]) -> list[T]:
        d = self.dialect
        with d.db():
            return [conv(r, self.codec) for r in d.q(sql, args).fetchall()]

    def iter(
        self, table: str, columns: Sequence[str], conv: Callable[[Any, FieldCodec], T], keys: Sequence[str]
    ) -> Iterator[T]:
        """Every row of ``table`` in ``keys`` order (keyset pagination; the lock held per page)."""
        cols, at = ", ".join(keys), [columns.index(k) for k in keys]
        last: tuple[Any, ...] = ()
        d = self.dialect
        while True:
            after = f" AND ({cols}) > ({', '.join('?' * len(keys))})" if last else ""
            with d.db():
                rows = d.q(
                    f"SELECT * FROM {table} WHERE tenant = ?{after} ORDER BY {cols} LIMIT {PAGE}", (self.tenant, *last)
                ).fetchall()
                records = [conv(r, self.codec) for r in rows]
            yield from records
            if len(rows) < PAGE:
                return
            last = tuple(rows[-1][i] for i in at)


class PatientCache(Protocol):
    """Where a backend answers the reads every governed turn repeats without a statement:
    SQLite keeps decoded rows (``sqlite/cached_reads.py``), PostgreSQL reads a batch of turns
    ahead (``postgres/readahead.py``). Each method returns what ``load`` (the statement) would."""

    @property
    def by_id(self) -> bool:
        """Whether episodic and visual records are kept by id (a study's episodes are then
        read as ids, and the records by id)."""
        ...

    def records(self, table: str, ids: Sequence[str], load: Callable[[Sequence[str]], dict[str, T]]) -> dict[str, T]:
        """``id -> record`` of those ``ids`` that exist (``load`` reads the ids not kept)."""
        ...

    def semantic(self, patient_id: str, load: Callable[[], list[SemanticState]]) -> list[SemanticState]:
        """The patient's ACTIVE semantic states by category."""
        ...

    def entities(self, patient_id: str, load: Callable[[], list[Entity]]) -> list[Entity]:
        """The patient's ACTIVE entities, oldest first."""
        ...

    def consents(self, patient_id: str | None, load: Callable[[], list[ConsentRecord]]) -> list[ConsentRecord]:
        """The consent records of a patient and of every patient (all when None)."""
        ...

    def claims(self, patient_id: str, key: str | None, load: Callable[[], list[Claim]]) -> list[Claim]:
        """The patient's ACTIVE claims (of one key when given), by key."""
        ...


class NoCache:
    """A :class:`PatientCache` that keeps nothing: every read runs its statement."""

    by_id = False

    def records(self, table: str, ids: Sequence[str], load: Callable[[Sequence[str]], dict[str, T]]) -> dict[str, T]:
        return load(ids)

    def semantic(self, patient_id: str, load: Callable[[], list[SemanticState]]) -> list[SemanticState]:
        return load()

    def entities(self, patient_id: str, load: Callable[[], list[Entity]]) -> list[Entity]:
        return load()

    def consents(self, patient_id: str | None, load: Callable[[], list[ConsentRecord]]) -> list[ConsentRecord]:
        return load()

    def claims(self, patient_id: str, key: str | None, load: Callable[[], list[Claim]]) -> list[Claim]:
        return load()

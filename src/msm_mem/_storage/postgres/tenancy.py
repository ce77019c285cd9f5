"""The tenants of a PostgreSQL schema: the ``meta`` rows of one, a new one beside others, and
schema 3 for a store of schema 1 or 2 (the tenant column, by ``ALTER TABLE``).

Several tenants share the tables of one schema, each a separate store (its own ``meta``, audit
chain, keys and rows); every row names its tenant. A store made before tenants (schema 1 or 2)
has no tenant column: it is opened for its upgrade only, which adds the column with every row
the store's tenant's, inside the upgrade's transaction.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import psycopg
from psycopg import sql

from ..._errors import StoreError
from ..indexes import missing_indexes
from .schema import INDEXES, SCHEMA, TABLES

_log = logging.getLogger("msm_mem")

__all__ = ["add_tenant", "check_new_tenant", "delete_tenant", "has_tenant_column", "read_meta"]

#: ``table -> (primary key columns, [unique columns, ...])`` of schema 3, read from its DDL
_KEYS: dict[str, tuple[list[str], list[list[str]]]] = {}
for _statement in SCHEMA.split(";"):
    _found = re.match(r"\s*CREATE TABLE (\w+)\(", _statement)
    if _found:
        _pk = re.search(r"PRIMARY KEY \(([^)]*)\)", _statement)
        if _pk is None:  # pragma: no cover - every table of the schema has one
            raise RuntimeError(f"table {_found.group(1)} has no primary key")
        _uniques = re.findall(r"UNIQUE \(([^)]*)\)", _statement)
        _KEYS[_found.group(1)] = (_pk.group(1).split(", "), [u.split(", ") for u in _uniques])


def _names(columns: list[str]) -> sql.Composed:
    return sql.SQL(", ").join(map(sql.Identifier, columns))


def has_tenant_column(conn: psycopg.Connection[Any]) -> bool:
    """Whether the ``meta`` table on the session's search path has the tenant column."""
    row = conn.execute(
        "SELECT count(*) FROM pg_attribute WHERE attrelid = 'meta'::regclass AND attname = 'tenant'"
        " AND NOT attisdropped"
    ).fetchone()
    return bool(row and row[0])


def read_meta(conn: psycopg.Connection[Any], tenant: str, legacy: bool) -> dict[str, str]:
    """The ``meta`` rows of ``tenant`` (of the one store of a schema without tenants)."""
    if legacy:
        return dict(conn.execute("SELECT key, value FROM meta").fetchall())
    return dict(conn.execute("SELECT key, value FROM meta WHERE tenant = %s", (tenant,)).fetchall())


def check_new_tenant(conn: psycopg.Connection[Any], schema: str, tenant: str, dim: int) -> None:
    """Refuse a new store of ``tenant`` in a schema that holds stores already (on the session's
    search path) unless its tables are of schema 3, hold none of ``tenant`` and keep vectors
    of ``dim`` (the column type every tenant shares)."""
    if not has_tenant_column(conn):
        raise StoreError(
            f"schema {schema!r} holds a store of an older msm-mem: upgrade it (msm-mem store upgrade) first"
        )
    if conn.execute("SELECT 1 FROM meta WHERE tenant = %s LIMIT 1", (tenant,)).fetchone() is not None:
        raise StoreError(f"schema {schema!r} already holds a store of tenant {tenant!r}")
    row = conn.execute(
        "SELECT atttypmod FROM pg_attribute WHERE attrelid = 'episodic'::regclass AND attname = 'z'"
    ).fetchone()
    if row is None or int(row[0]) != dim:
        found = None if row is None else int(row[0])
        raise StoreError(f"the tables of schema {schema!r} hold {found}-d vectors, not {dim}-d: use another schema")


def delete_tenant(conn: psycopg.Connection[Any], tenant: str) -> bool:
    """Delete every row of ``tenant`` (inside the caller's transaction); whether other tenants'
    stores are left in the tables."""
    for table in TABLES:
        conn.execute(sql.SQL("DELETE FROM {} WHERE tenant = %s").format(sql.Identifier(table)), (tenant,))
    return conn.execute("SELECT 1 FROM meta LIMIT 1").fetchone() is not None


def add_tenant(conn: psycopg.Connection[Any], tenant: str) -> None:
    """Give every table the tenant column (its rows ``tenant``'s) and the keys and indexes of
    schema 3, inside the caller's transaction. The HNSW indexes (no key) stay."""
    for table in TABLES:
        ident = sql.Identifier(table)
        keys = conn.execute(
            "SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype IN ('p', 'u')", (table,)
        ).fetchall()
        for (name,) in keys:
            conn.execute(sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(ident, sql.Identifier(name)))
        indexes = conn.execute(
            "SELECT i.relname FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid"
            " WHERE x.indrelid = %s::regclass AND i.relname NOT LIKE '%%\\_hnsw'",
            (table,),
        ).fetchall()
        for (name,) in indexes:
            conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(name)))
        conn.execute(
            sql.SQL('ALTER TABLE {} ADD COLUMN tenant TEXT COLLATE "C" NOT NULL DEFAULT {}').format(
                ident, sql.Literal(tenant)
            )
        )
        conn.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN tenant DROP DEFAULT").format(ident))
        primary, uniques = _KEYS[table]
        conn.execute(sql.SQL("ALTER TABLE {} ADD PRIMARY KEY ({})").format(ident, _names(primary)))
        for columns in uniques:
            conn.execute(sql.SQL("ALTER TABLE {} ADD UNIQUE ({})").format(ident, _names(columns)))
    for statement in INDEXES.split(";"):  # one at a time: a write transaction runs in pipeline mode,
        if statement.strip():  # which takes no string of several commands
            conn.execute(statement.strip().encode())


def add_indexes(conn: psycopg.Connection[Any], schema: str) -> list[str]:
    """Create the secondary indexes the tables of ``schema`` lack (a store made before them gets
    them when it is next opened); returns the statements run. ``conn`` is an autocommit
    connection outside any transaction. Processes opening the store at once take turns (a
    transaction lock), so each index is built once. A role that may not create them (it does
    not own the tables), or a read-only server, opens the store all the same, with a warning:
    the reads are slower. :class:`StoreError` when an index cannot be made for another reason
    (a unique one the stored rows break); none of them is made then."""
    try:
        found = conn.execute("SELECT indexname FROM pg_indexes WHERE schemaname = %s", (schema,)).fetchall()
        if not missing_indexes(row[0] for row in found):
            return []
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"msm_mem indexes {schema}",))
            found = conn.execute("SELECT indexname FROM pg_indexes WHERE schemaname = %s", (schema,)).fetchall()
            statements = missing_indexes(row[0] for row in found)
            for statement in statements:
                conn.execute(statement.encode())
    except (psycopg.errors.InsufficientPrivilege, psycopg.errors.ReadOnlySqlTransaction) as exc:
        _log.warning("the indexes of schema %s were not made (%s): reads of a patient scan the tables", schema, exc)
        return []
    except psycopg.Error as exc:  # e.g. a unique index the stored rows break: nothing is made
        raise StoreError(f"schema {schema!r}: an index of the schema cannot be made: {exc}") from exc
    return statements

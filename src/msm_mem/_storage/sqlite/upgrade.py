"""Schema 3 for an embedded store of schema 1 or 2: the ``tenant`` column, by table rebuilds.

SQLite cannot change a table's primary key in place, so each table is rebuilt as its manual
describes (create the new table, copy the rows, drop the old one, rename the new one), inside
the caller's write transaction: the rows keep their ``rowid`` (the insertion order of the
tables ordered by it) and get the store's tenant; the secondary indexes are made again after.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

from ..._errors import StoreError
from ..._settings import DEFAULT_TENANT, check_tenant
from ..indexes import missing_indexes
from .schema import INDEXES, SCHEMA, TABLES

__all__ = ["add_indexes", "add_tenant", "has_tenant_column", "read_meta"]

_CREATE = {
    name: statement.strip()
    for statement in SCHEMA.split(";")
    if (found := re.match(r"\s*CREATE TABLE (\w+)\(", statement)) and (name := found.group(1))
}


def has_tenant_column(conn: sqlite3.Connection) -> bool:
    """Whether the store's tables have the tenant column (schema 3 on)."""
    return any(row[1] == "tenant" for row in conn.execute("PRAGMA table_info(meta)"))


def read_meta(conn: sqlite3.Connection, directory: Path, tenant: str | None) -> tuple[str, dict[str, str], bool]:
    """``(tenant, meta, legacy)`` of a store: its one tenant and that tenant's ``meta`` rows
    (``store_id``, ``dim`` and ``encoder`` among them); ``legacy`` for a store without the tenant
    column (schema 1 or 2), whose rows become ``tenant``'s (default "default") in its upgrade."""
    legacy = not has_tenant_column(conn)
    if legacy:
        found = check_tenant(tenant or DEFAULT_TENANT)
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        if "tenant" in meta:
            meta.setdefault("store_id", meta["tenant"])  # its name before schema 3 (the upgrade renames it)
    else:
        tenants = [row[0] for row in conn.execute("SELECT DISTINCT tenant FROM meta")]
        if len(tenants) != 1:
            raise StoreError(f"{directory} holds the rows of {len(tenants)} tenants; a store directory holds one")
        found = tenants[0]
        meta = dict(conn.execute("SELECT key, value FROM meta WHERE tenant = ?", (found,)).fetchall())
    missing = {"dim", "encoder", "store_id"} - set(meta)
    if missing:
        raise StoreError(f"{directory} is an incomplete msm-mem store (meta lacks {sorted(missing)})")
    return found, meta, legacy


def add_tenant(conn: sqlite3.Connection, tenant: str) -> None:
    """Rebuild every table with the tenant column, its rows ``tenant``'s (inside the caller's
    transaction; the caller checks that the store has no tenant column yet)."""
    old_indexes = [
        row[0]
        for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL").fetchall()
    ]
    for name in old_indexes:
        conn.execute(f'DROP INDEX "{name}"')
    for table in TABLES:
        columns = [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]
        if "tenant" in columns:
            raise StoreError(f"table {table} has a tenant column already: the store is not one of schema 1 or 2")
        listed = ", ".join(f'"{c}"' for c in columns)
        conn.execute(_CREATE[table].replace(f"CREATE TABLE {table}(", f"CREATE TABLE {table}__v3(", 1))
        conn.execute(
            f"INSERT INTO {table}__v3 (rowid, {listed}, tenant) SELECT rowid, {listed}, ? FROM {table}", (tenant,)
        )
        conn.execute(f"DROP TABLE {table}")
        conn.execute(f"ALTER TABLE {table}__v3 RENAME TO {table}")
    for statement in INDEXES.split(";"):
        if statement.strip():
            conn.execute(statement)


def add_indexes(conn: sqlite3.Connection) -> list[str]:
    """Create the secondary indexes a store made before them lacks, in one transaction (the
    caller holds no transaction; a store gets them on its first writable open). Returns the
    statements run (none when every index is there, which is read without a write lock)."""
    found = (row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'"))
    statements = missing_indexes(found)
    if not statements:
        return []
    conn.execute("BEGIN IMMEDIATE")
    try:
        for statement in statements:
            conn.execute(statement)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return statements

"""A memory directory's store of record rewritten by SQL into the layout of store schema 2 (as
msm-mem wrote it before tenants): no ``tenant`` column, keys without it, the random store id
in ``meta`` under its old name ``tenant``; and its keys put back inside the directory, as
msm-mem kept them before the key home. Tests of the upgrade build their old stores with it
(an old msm-mem cannot run here); synthetic data only."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from msm_mem._governance.key_home import default_home
from msm_mem._storage.sqlite.schema import SCHEMA as SQLITE_SCHEMA
from msm_mem._storage.sqlite.schema import TABLES
from tests.helpers import raw_db


def _without_tenant(ddl: str) -> str:
    """Schema-3 DDL as schema 2 had it: the tenant column and every key's tenant left out."""
    ddl = re.sub(r',\s*tenant TEXT( COLLATE "C")? NOT NULL', "", ddl)
    return ddl.replace("(tenant, ", "(")


def keys_into_directory(directory: Path) -> None:
    """Move the key files of the (closed) store of ``directory`` from its key home folder into
    ``DIR/keys/`` and forget the rest of that folder (record, witness): the layout of a store
    made before the key home."""
    with raw_db(directory) as db:
        (store_id,) = db.execute("SELECT value FROM meta WHERE key IN ('store_id', 'tenant')").fetchone()
    folder = default_home() / store_id
    (directory / "keys").mkdir(mode=0o700, exist_ok=True)
    for name in ("kek.json", "checkpoint.key"):
        shutil.move(folder / name, directory / "keys" / name)
    shutil.rmtree(folder)


def to_schema_2(directory: Path) -> None:
    """Rewrite the (closed) store of ``directory`` into the schema-2 layout, in one transaction,
    its keys inside the directory (:func:`keys_into_directory`)."""
    keys_into_directory(directory)
    from msm_mem._storage.postgres.schema import INDEXES as PG_INDEXES
    from msm_mem._storage.postgres.schema import SCHEMA as PG_SCHEMA

    with raw_db(directory) as db:
        db.execute("BEGIN")
        db.execute("UPDATE meta SET key = 'tenant' WHERE key = 'store_id'")
        db.execute("UPDATE meta SET value = '2' WHERE key = 'schema'")
        if db.backend == "sqlite":  # schema 2 had no change mark (_storage/sqlite/changes.py)
            db.execute("DELETE FROM meta WHERE key IN ('changes', 'vectors_moved')")
            for (trigger,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
                db.execute(f"DROP TRIGGER {trigger}")
            creates = {
                m.group(1): _without_tenant(s.strip())
                for s in SQLITE_SCHEMA.split(";")
                if (m := re.match(r"\s*CREATE TABLE (\w+)\(", s))
            }
            for table in TABLES:
                columns = [r[1] for r in db.execute(f"PRAGMA table_info({table})") if r[1] != "tenant"]
                listed = ", ".join(f'"{c}"' for c in columns)
                db.execute(creates[table].replace(f"CREATE TABLE {table}(", f"CREATE TABLE {table}__v2(", 1))
                db.execute(f"INSERT INTO {table}__v2 (rowid, {listed}) SELECT rowid, {listed} FROM {table}")
                db.execute(f"DROP TABLE {table}")
                db.execute(f"ALTER TABLE {table}__v2 RENAME TO {table}")
            indexes = [s for s in SQLITE_SCHEMA.split(";") if "CREATE INDEX" in s or "CREATE UNIQUE INDEX" in s]
        else:
            keys = {
                m.group(1): re.findall(r"(PRIMARY KEY|UNIQUE) \(([^)]*)\)", _without_tenant(s))
                for s in PG_SCHEMA.split(";")
                if (m := re.match(r"\s*CREATE TABLE (\w+)\(", s))
            }
            for table in TABLES:
                db.execute(f"ALTER TABLE {table} DROP COLUMN tenant CASCADE")
                for kind, columns in keys[table]:
                    db.execute(f"ALTER TABLE {table} ADD {kind} ({columns})")
            indexes = PG_INDEXES.split(";")
        for statement in indexes:
            if statement.strip():
                db.execute(_without_tenant(statement))
        db.execute("COMMIT")

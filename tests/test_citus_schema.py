"""The schema is ready for Citus: every table of a freshly made store (PostgreSQL's catalog and
SQLite's) has a NOT NULL ``tenant`` column, every primary key and unique index leads with it,
no table has a foreign key; every statement a store runs names its tenant (so a Citus cluster
routes it to one shard); and the distribution DDL of docs/deploy.md is the schema's, complete.
A table added without the tenant fails here (synthetic data only)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from msm_mem import ManifestRow, MsmMem
from msm_mem._storage.postgres.schema import DISTRIBUTION, SCHEMA, citus_ddl
from msm_mem._storage.postgres.schema import TABLES as PG_TABLES
from msm_mem._storage.sqlite.schema import TABLES as SQLITE_TABLES
from msm_mem.testing import FixedBackbone, FixedClock
from tests.conftest import MemFactory
from tests.helpers import ADMIN, AGENT, AUDITOR, CLINICIAN, SYSTEM, png, raw_db

DEPLOY = Path(__file__).resolve().parents[1] / "docs" / "deploy.md"
T0 = 1_700_000_000.0
QUESTION = "Is the right lower lobe opacity changing?"
#: a statement that reads or writes one of the store's tables
_TOUCHES = re.compile(r"\b(?:FROM|INTO|UPDATE|JOIN)\s+(" + "|".join(PG_TABLES) + r")\b", re.I)


def _pg_catalog(dsn: str, schema: str) -> dict[str, dict[str, Any]]:
    """Per table of ``schema``: the tenant column's nullability, every unique index's columns
    (partial ones too) and every foreign key."""
    import psycopg

    out: dict[str, dict[str, Any]] = {}
    with psycopg.connect(dsn) as conn:
        for (table,) in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,)).fetchall():
            tenant = conn.execute(
                "SELECT is_nullable FROM information_schema.columns"
                " WHERE table_schema = %s AND table_name = %s AND column_name = 'tenant'",
                (schema, table),
            ).fetchone()
            unique = conn.execute(
                """SELECT i.relname, array(SELECT a.attname FROM unnest(x.indkey) WITH ORDINALITY AS k(num, o)
                                           JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.num
                                           ORDER BY k.o)
                   FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class r ON r.oid = x.indrelid
                   JOIN pg_namespace n ON n.oid = r.relnamespace
                   WHERE n.nspname = %s AND r.relname = %s AND x.indisunique""",
                (schema, table),
            ).fetchall()
            foreign = conn.execute(
                "SELECT conname FROM pg_constraint WHERE contype = 'f' AND conrelid = %s::regclass",
                (f'"{schema}"."{table}"',),
            ).fetchall()
            out[table] = {
                "tenant_not_null": tenant is not None and tenant[0] == "NO",
                "unique": {name: list(cols) for name, cols in unique},
                "foreign": [r[0] for r in foreign],
            }
    return out


def _sqlite_catalog(directory: Path) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    with raw_db(directory) as db:
        for table in db.tables():
            columns = {r[1]: r for r in db.execute(f"PRAGMA table_info({table})").fetchall()}
            unique = {}
            for _, name, is_unique, *_ in db.execute(f"PRAGMA index_list({table})").fetchall():
                if is_unique:
                    unique[name] = [r[2] for r in db.execute(f"PRAGMA index_info({name})").fetchall()]
            out[table] = {
                "tenant_not_null": "tenant" in columns and columns["tenant"][3] == 1,
                "unique": unique,
                "foreign": db.execute(f"PRAGMA foreign_key_list({table})").fetchall(),
                "has_primary_key": any(r[5] for r in columns.values()),
            }
    return out


def _check(catalog: dict[str, dict[str, Any]], tables: tuple[str, ...]) -> None:
    assert sorted(catalog) == sorted(tables)  # the schema's list is what the store has
    for table, found in catalog.items():
        assert found["tenant_not_null"], f"{table} lacks a NOT NULL tenant column"
        assert found["unique"], f"{table} has no primary key"
        for name, columns in found["unique"].items():
            assert columns[0] == "tenant", f"{table}: unique index {name} {columns} does not lead with tenant"
        assert found["foreign"] == [], f"{table} has a foreign key"


@pytest.mark.postgres
def test_every_postgres_table_is_keyed_by_tenant(tmp_path: Path, postgres_url: str, pg_schema: str) -> None:
    """PostgreSQL's catalog of a new store (with the HNSW indexes too): tenant NOT NULL in every
    table, leading every primary key and unique index (partial ones too), no foreign key."""
    from msm_mem._settings import Settings

    settings = Settings(population_search="hnsw")
    MsmMem.init(tmp_path / "s", ADMIN, settings=settings, database_url=postgres_url, schema=pg_schema).close()
    _check(_pg_catalog(postgres_url, pg_schema), PG_TABLES)


def test_every_sqlite_table_is_keyed_by_tenant(tmp_path: Path) -> None:
    """The same of SQLite's catalog of a new embedded store."""
    MsmMem.init(tmp_path / "s", ADMIN).close()
    catalog = _sqlite_catalog(tmp_path / "s")
    _check(catalog, SQLITE_TABLES)
    assert all(found["has_primary_key"] for found in catalog.values())


def test_a_table_without_the_tenant_fails_the_check(tmp_path: Path) -> None:
    """The check is not vacuous: a table added without the tenant, a key without it, or a
    foreign key make it fail."""
    MsmMem.init(tmp_path / "s", ADMIN).close()
    with raw_db(tmp_path / "s") as db:
        db.execute("CREATE TABLE extra(id TEXT PRIMARY KEY, tenant TEXT NOT NULL)")
        refs = "FOREIGN KEY (tenant, id) REFERENCES extra(tenant, id)"
        db.execute(f"CREATE TABLE refs(id TEXT NOT NULL, tenant TEXT NOT NULL, PRIMARY KEY (tenant, id), {refs})")
    catalog = _sqlite_catalog(tmp_path / "s")
    with pytest.raises(AssertionError, match="extra"):
        _check(catalog, (*SQLITE_TABLES, "extra", "refs"))
    del catalog["extra"]
    with pytest.raises(AssertionError, match="refs has a foreign key"):
        _check(catalog, (*SQLITE_TABLES, "refs"))


@contextmanager
def _statements(backend: str, mem: MsmMem, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every statement the store runs meanwhile (SQLite's trace; psycopg's execute calls)."""
    seen: list[str] = []
    if backend == "sqlite":  # the statements of this very handle's connection: only it can trace them
        mem._store._conn.set_trace_callback(seen.append)  # type: ignore[attr-defined]
        yield seen
        mem._store._conn.set_trace_callback(None)  # type: ignore[attr-defined]
        return
    import psycopg

    def recording(original: Callable[..., Any]) -> Callable[..., Any]:
        def run(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            seen.append(query if isinstance(query, str) else repr(query))
            return original(self, query, *args, **kwargs)

        return run

    monkeypatch.setattr(psycopg.Connection, "execute", recording(psycopg.Connection.execute))
    monkeypatch.setattr(psycopg.Cursor, "executemany", recording(psycopg.Cursor.executemany))
    monkeypatch.setattr(psycopg.Cursor, "execute", recording(psycopg.Cursor.execute))
    yield seen


def test_every_statement_names_the_tenant(
    tmp_path: Path, new_mem: MemFactory, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ingest, ask, feedback, observe, a patient's audit trail, maintenance, key rotation,
    shredding, verification and a checkpoint: every statement that reads or writes a store
    table carries ``tenant`` (a Citus router query), on both backends."""
    mem = new_mem("s", clock=FixedClock(T0), backbone=FixedBackbone("Stable opacity", "no change"))
    with _statements(backend, mem, monkeypatch) as seen:
        rows = [
            ManifestRow("P-1", f"S{i}", T0 - 86400 * i, str(png(tmp_path, i)), QUESTION, "effusion") for i in range(3)
        ]
        mem.ingest(SYSTEM, rows)
        mem.ask(AGENT, "P-1", png(tmp_path, 9), QUESTION, study_id="ACC-9")
        mem.feedback(CLINICIAN, "P-1", "ACC-9", accept=False, correction="New left effusion")
        mem.episodes(CLINICIAN, "P-1")
        mem.claims(CLINICIAN, "P-1")
        assert mem.audit_trail(CLINICIAN, "P-1").events
        mem.maintain(SYSTEM, at=T0 + 10 * 86400)
        mem.rotate_keys(ADMIN, "yearly rotation")
        mem.shred(ADMIN, "P-1", "erasure request")
        assert mem.verify_audit(AUDITOR).ok
        mem.checkpoint(AUDITOR)
    touching = [s for s in seen if _TOUCHES.search(s)]
    assert len(touching) > 50
    lacking = sorted({" ".join(s.split()) for s in touching if "tenant" not in s})
    assert lacking == []


def test_the_distribution_ddl_is_the_schemas_and_docs_deploy_shows_it() -> None:
    """``citus_ddl`` distributes every table, colocated with meta: a patient's tables by the
    patient, the hospital's own (meta, audit, pseudonyms) by the tenant; every key of a table
    ends up holding its distribution column; docs/deploy.md holds exactly that text (so adding
    a table updates both or fails here)."""
    ddl = citus_ddl()
    distributed = dict(re.findall(r"create_distributed_table\('(\w+)', '(\w+)'", ddl))
    assert distributed == DISTRIBUTION and sorted(PG_TABLES) == sorted(SQLITE_TABLES) == sorted(distributed)
    assert {t for t, c in distributed.items() if c == "tenant"} == {"meta", "audit", "pseudonyms"}
    assert all(f"'{t}', '{c}', colocate_with => 'meta'" in ddl for t, c in distributed.items() if t != "meta")
    for table, keys in re.findall(r"CREATE TABLE (\w+)\((.*?)\);", SCHEMA, re.S):
        for kind, cols in re.findall(r"(PRIMARY KEY|UNIQUE) \(([^)]*)\)", keys):
            column = distributed[table]
            if column not in cols:
                assert f"ADD {kind} ({cols}, {column});" in ddl, (table, kind)
    assert f"```sql\n{ddl}```" in DEPLOY.read_text(encoding="utf-8")

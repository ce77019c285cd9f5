"""What docs/deploy.md says of the PostgreSQL schema and Citus, checked against the catalog of a
store made here: the distribution column of each table, the primary and unique keys that lack it,
no foreign keys, and one audit chain per store (no tenant or shard column)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from msm_mem import MsmMem
from tests.helpers import ADMIN

pytestmark = pytest.mark.postgres

DEPLOY = Path(__file__).resolve().parents[1] / "docs" / "deploy.md"
#: the columns a table may be distributed by: the patient (under either name) or a tenant
DISTRIBUTION = ("patient_id", "patient_ref", "tenant_id")


def _catalog(dsn: str, schema: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Each table: its distribution column ("none") and its primary and unique keys (full,
    not partial) that do not include it, as ``name (columns)``."""
    import psycopg

    out = {}
    with psycopg.connect(dsn) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
            ).fetchall()
        ]
        for table in tables:
            columns = {
                r[0]
                for r in conn.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = %s",
                    (schema, table),
                ).fetchall()
            }
            column = next((c for c in DISTRIBUTION if c in columns), "none")
            keys = conn.execute(
                """SELECT i.relname, array(SELECT a.attname FROM unnest(x.indkey) k
                                           JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k)
                   FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class r ON r.oid = x.indrelid
                   JOIN pg_namespace n ON n.oid = r.relnamespace
                   WHERE n.nspname = %s AND r.relname = %s AND x.indisunique AND x.indpred IS NULL""",
                (schema, table),
            ).fetchall()
            lacking = tuple(sorted(f"{name} ({', '.join(cols)})" for name, cols in keys if column not in cols))
            out[table] = (column, lacking)
    return out


def _documented() -> dict[str, tuple[str, tuple[str, ...]]]:
    text = DEPLOY.read_text(encoding="utf-8")
    section = text.split("## What the schema has for Citus", 1)[1]
    rows = re.findall(r"^\| (\w+) \| (\w+) \| (.+?) \|$", section, re.M)
    out = {}
    for table, column, keys in rows:
        if table == "table":
            continue
        lacking = () if keys.strip() == "none" else tuple(sorted(k.strip() for k in re.findall(r"\w+ \([^)]*\)", keys)))
        out[table] = (column, lacking)
    return out


def test_deploy_md_says_what_the_schema_has_for_citus(tmp_path: Path, postgres_url: str, pg_schema: str) -> None:
    """The table of docs/deploy.md is the catalog's: per table the distribution column and the
    unique keys without it; no table has a foreign key; the audit table has no tenant or shard
    column (one chain per store); every table of patient memory carries patient_id."""
    import psycopg

    MsmMem.init(tmp_path / "store", ADMIN, database_url=postgres_url, schema=pg_schema).close()
    catalog = _catalog(postgres_url, pg_schema)
    assert catalog == _documented()
    with psycopg.connect(postgres_url) as conn:
        foreign = conn.execute(
            "SELECT conname FROM pg_constraint WHERE contype = 'f' AND connamespace = %s::regnamespace", (pg_schema,)
        ).fetchall()
    assert foreign == []
    assert catalog["audit"][0] == "none"  # docs/deploy.md: one audit chain per store, not per tenant
    memory = ("episodic", "visual", "semantic", "claims", "stm", "entities", "relationships", "consents")
    assert all(catalog[t][0] == "patient_id" for t in memory)

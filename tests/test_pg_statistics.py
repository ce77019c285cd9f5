"""The server store's table statistics: a table is analyzed once its rows changed by as many as
it held at its last ANALYZE (200 at least), and the store looks after every thousand or so
statements and rows it writes."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest

from msm_mem import MsmMem
from msm_mem._storage.postgres import PostgresStore
from msm_mem._storage.postgres.statistics import MIN_CHANGED, analyze_grown
from tests.helpers import ADMIN, AGENT
from tests.layers import open_layers

pytestmark = pytest.mark.postgres


@pytest.fixture
def conn(postgres_url: str) -> Iterator[tuple[psycopg.Connection[Any], str]]:
    schema = f"tpgs_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_url, autocommit=True) as c:
        c.execute(f"CREATE SCHEMA {schema}")
        for table in ("a", "b"):  # (autovacuum's own ANALYZE would race the counts checked)
            c.execute(
                f"CREATE TABLE {schema}.{table} (id bigserial PRIMARY KEY, v int) WITH (autovacuum_enabled = off)"
            )
        try:
            yield c, schema
        finally:
            c.execute(f"DROP SCHEMA {schema} CASCADE")


def _insert(c: psycopg.Connection[Any], table: str, n: int) -> None:
    c.execute(f"INSERT INTO {table} (v) SELECT g FROM generate_series(1, %s) g", (n,))


def test_a_table_is_analyzed_each_time_its_rows_double(conn: tuple[psycopg.Connection[Any], str]) -> None:
    """Fewer changes than the floor analyze nothing; past it the table is analyzed, then again
    only once the changes since reach the rows it held; other tables are left alone."""
    c, schema = conn
    _insert(c, f"{schema}.a", MIN_CHANGED - 1)
    assert analyze_grown(c, schema) == []
    _insert(c, f"{schema}.a", 301 - MIN_CHANGED)  # 300 rows, never analyzed
    _insert(c, f"{schema}.b", 10)
    assert analyze_grown(c, schema) == ["a"]
    assert analyze_grown(c, schema) == []
    _insert(c, f"{schema}.a", 250)  # 250 changes < 300 rows
    assert analyze_grown(c, schema) == []
    _insert(c, f"{schema}.a", 60)
    assert analyze_grown(c, schema) == ["a"]
    row = c.execute("SELECT reltuples FROM pg_class WHERE oid = %s::regclass", (f"{schema}.a",)).fetchone()
    assert row is not None and row[0] == 610


def test_the_store_analyzes_its_grown_tables_as_it_writes(postgres_url: str) -> None:
    """Turns committed one by one: no table the store wrote is analyzed while its rows are
    under the floor; once they pass it, the next check analyzes the vector tables."""
    schema = f"tpgs_{uuid.uuid4().hex[:12]}"
    directory = Path(tempfile.mkdtemp()) / "s"
    MsmMem.init(directory, ADMIN, database_url=postgres_url, schema=schema).close()
    layers = open_layers(directory)
    analyzed = "SELECT relname FROM pg_stat_user_tables WHERE schemaname = %s AND analyze_count > 0"
    try:
        store = layers.handle
        assert isinstance(store, PostgresStore)
        for (table,) in store._sql.conn.execute(  # (autovacuum's own ANALYZE would race the counts checked)
            "SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,)
        ).fetchall():
            store._sql.conn.execute(f"ALTER TABLE {schema}.{table} SET (autovacuum_enabled = off)")
        gm = layers.gm
        rng = np.random.default_rng(0)
        checks = 0
        for i in range(3 * MIN_CHANGED):
            if i == MIN_CHANGED - 1:
                assert "episodic" not in {row[0] for row in store._sql.conn.execute(analyzed, (schema,)).fetchall()}
            turn = gm.begin(AGENT, f"P{i}")
            z = rng.standard_normal(store.dim).astype(np.float32)
            item = gm.observe(turn, z / np.linalg.norm(z), "Impression?", timestamp=1.7e9, study_id=f"S{i}")
            gm.consolidate(turn, item, "No acute finding.", decision="discharge")
            written = store._sql.written
            gm.commit(turn)
            checks += store._sql.written < written
        assert checks >= 2, f"{3 * MIN_CHANGED} turns pass CHECK_EVERY writes at least twice"
        tables = {row[0] for row in store._sql.conn.execute(analyzed, (schema,)).fetchall()}
        assert {"episodic", "visual"} <= tables, tables
    finally:
        layers.close()


def test_a_table_another_session_is_analyzing_is_skipped_not_waited_for(
    conn: tuple[psycopg.Connection[Any], str], postgres_url: str
) -> None:
    """While another session holds the lock an ANALYZE takes, the check returns at once and
    leaves the table for later; once the lock is gone, the next check analyzes it."""
    c, schema = conn
    _insert(c, f"{schema}.a", 2 * MIN_CHANGED)
    c.execute("SET lock_timeout = '5s'")  # (a check that waited would fail here, not hang)
    analyzed = "SELECT analyze_count FROM pg_stat_user_tables WHERE relid = %s::regclass"
    with psycopg.connect(postgres_url) as other:
        other.execute(f"LOCK TABLE {schema}.a IN SHARE UPDATE EXCLUSIVE MODE")
        assert analyze_grown(c, schema) == ["a"]
        row = c.execute(analyzed, (f"{schema}.a",)).fetchone()
        assert row is not None and row[0] == 0
        other.rollback()
    assert analyze_grown(c, schema) == ["a"]
    c.execute("SELECT pg_stat_force_next_flush()")
    row = c.execute(analyzed, (f"{schema}.a",)).fetchone()
    assert row is not None and row[0] == 1

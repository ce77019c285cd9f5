"""The parts a SQL store is built from work on their own, each built by its own constructor over
a database a store made (no store object around them)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from msm_mem._errors import StoreError
from msm_mem._records import EpisodicRecord
from msm_mem._storage.base import VectorKind, WriteBatch
from msm_mem._storage.sql_core import NoCache, SqlTables
from msm_mem._storage.sql_records import SqlRecords
from msm_mem._storage.sql_rows import SqlRowDigests
from msm_mem._storage.sql_tiers import GENESIS, SqlAudit, SqlTiers
from msm_mem._storage.sql_write import Moved, SqlWriter
from msm_mem._storage.sqlite import SqliteStore
from msm_mem._storage.sqlite.cached_reads import CachedReads
from msm_mem._storage.sqlite.changes import ChangeMark
from msm_mem._storage.sqlite.connection import SqliteDialect, connect
from msm_mem._storage.sqlite.keys import SqliteKeyTable
from msm_mem._storage.sqlite.readcache import ReadCache
from msm_mem._storage.sqlite.schema import DB_NAME, SCHEMA_VERSION
from msm_mem._storage.sqlite.vectors import FaissVectors
from msm_mem._tier_records import ConsentRecord
from tests.conftest import ROW_KEY, with_codec

TENANT = "default"


def _episode(i: int, patient: str) -> EpisodicRecord:
    z = np.zeros(4, np.float32)
    z[i % 4] = 1.0
    return EpisodicRecord(f"E-{i}", patient, 1e9 + i, z, "q?", f"answer {i}", study_id=f"s{i}")


def _consent(name: str, patient: str = "P1") -> ConsentRecord:
    return ConsentRecord(f"C-{name}", patient, "role:agent", "treatment", "permit", ("episodic",), 0.0)


@pytest.fixture
def directory(tmp_path: Path) -> Path:
    """A store's directory with two episodes of P1, one of P2 and a consent of P1, closed."""
    store = with_codec(SqliteStore.create(tmp_path / "s", dim=4, encoder="t"))
    store.write(WriteBatch(episodes=[_episode(0, "P1"), _episode(1, "P1"), _episode(2, "P2")]))
    store.write(WriteBatch(consents=[_consent("a")]))
    store.close()
    return tmp_path / "s"


@pytest.fixture
def dialect(directory: Path) -> Iterator[SqliteDialect]:
    """The SQLite dialect over a connection of its own to that store's database."""
    conn = connect(directory / DB_NAME, durable=False)
    yield SqliteDialect(conn, directory, ChangeMark(conn, TENANT), lambda: None, legacy=False)
    conn.close()


def test_the_shared_reads_answer_through_a_dialect(dialect: SqliteDialect) -> None:
    """Records, tiers and audit rows read through SqlTables over a dialect, with no cache."""
    tables = SqlTables(dialect, TENANT)
    records = SqlRecords(tables, NoCache())
    assert records.count("episodic") == 3
    assert records.patients() == ["P1", "P2"]
    assert records.record_ids("episodic", "P1") == ["E-0", "E-1"]
    assert records.studies("P1") == {"s0", "s1"}
    assert [c.consent_id for c in SqlTiers(tables, NoCache()).consents("P1")] == ["C-a"]
    assert SqlAudit(tables).audit_head() == (0, GENESIS)


def test_the_row_digests_part_recomputes_what_meta_holds(dialect: SqliteDialect) -> None:
    """The stored row digests equal those recomputed from the rows, under the store's key only."""
    digests = SqlRowDigests(SqlTables(dialect, TENANT))
    digests.use_row_key(ROW_KEY)
    assert digests.row_digests() == digests.computed_row_digests()
    digests.use_row_key(bytes(32))
    assert digests.row_digests() != digests.computed_row_digests()


class _Vectors:
    """A vector part that records what the write path asks of it."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def positions(self) -> dict[VectorKind, int]:
        self.asked.append("positions")
        return {"episodic": 3, "visual": 0}

    def vector_rows(self, kind: VectorKind, rows: list[tuple[Any, ...]]) -> Sequence[Sequence[Any]]:
        self.asked.append("rows")
        return rows

    def vectors_added(self, kind: VectorKind, start: int, rows: list[tuple[Any, ...]]) -> None:
        self.asked.append("added")


def test_the_writer_writes_through_the_parts_it_is_given(dialect: SqliteDialect) -> None:
    """A batch without vectors asks the vector part nothing, keeps the row digests and is
    followed once committed; a writer of an older schema refuses it."""
    tables = SqlTables(dialect, TENANT)
    digests = SqlRowDigests(tables)
    digests.use_row_key(ROW_KEY)
    keys = SqliteKeyTable(dialect.conn, dialect.lock, TENANT, lambda: 0)
    vectors = _Vectors()
    followed: list[tuple[WriteBatch, list[Moved]]] = []

    def writer(schema: str) -> SqlWriter:
        return SqlWriter(
            tables,
            digests,
            SqlAudit(tables),
            keys,
            vectors,
            lambda batch, moved: followed.append((batch, moved)),
            dim=4,
            store_id="s",
            schema_version=schema,
            current_schema=SCHEMA_VERSION,
        )

    batch = WriteBatch(consents=[_consent("b", "P2")])
    writer(SCHEMA_VERSION).write(batch)
    assert followed == [(batch, [])] and vectors.asked == []
    assert [c.consent_id for c in SqlTiers(tables, NoCache()).consents("P2")] == ["C-b"]
    assert digests.row_digests() == digests.computed_row_digests()
    with pytest.raises(StoreError, match="opened for its upgrade only"):
        writer("2").write(WriteBatch(consents=[_consent("c")]))
    assert len(followed) == 1


def test_the_read_cache_part_loads_each_record_once(dialect: SqliteDialect) -> None:
    """Records by id come from the cache once loaded; NoCache loads them every time."""
    changes = ChangeMark(dialect.conn, TENANT)
    loads: list[list[str]] = []

    def load(ids: Sequence[str]) -> dict[str, str]:
        loads.append(list(ids))
        return {i: f"record {i}" for i in ids}

    cached = CachedReads(dialect, ReadCache(dialect.conn, changes.current))
    assert cached.records("episodic", ["E-0", "E-1"], load) == {"E-0": "record E-0", "E-1": "record E-1"}
    assert cached.records("episodic", ["E-1", "E-2"], load) == {"E-1": "record E-1", "E-2": "record E-2"}
    assert loads == [["E-0", "E-1"], ["E-2"]]
    loads.clear()
    assert NoCache().records("episodic", ["E-0"], load) == {"E-0": "record E-0"}
    assert NoCache().records("episodic", ["E-0"], load) == {"E-0": "record E-0"}
    assert loads == [["E-0"], ["E-0"]]


def test_the_faiss_part_searches_the_rows_of_its_connection(dialect: SqliteDialect, directory: Path) -> None:
    """FaissVectors built over a connection searches its rows, exact in patient scope and in
    the population, and is refused once its store says it is closed."""
    closed = False

    def is_closed() -> bool:
        return closed

    on_side: Callable[[], bool] = lambda: False  # noqa: E731 (a constant answer)
    vectors = FaissVectors(
        dialect.conn,
        dialect.lock,
        is_closed,
        on_side,
        directory=directory,
        dim=4,
        tenant=TENANT,
        changes=ChangeMark(dialect.conn, TENANT),
        ef_search=None,
    )
    z = np.array([0, 1, 0, 0], np.float32)
    assert vectors.search("episodic", z, 5, "P1") == [("E-1", 1.0), ("E-0", 0.0)]
    assert vectors.search("episodic", z, 1, None) == [("E-1", 1.0)]
    assert vectors.max_cosine(z, ["episodic"], "P2") == 0.0
    assert vectors.positions() == {"episodic": 3, "visual": 0}
    closed = True
    with pytest.raises(StoreError, match="closed"):
        vectors.search("episodic", z, 1, "P1")


def test_a_dialect_refuses_statements_once_closed(dialect: SqliteDialect) -> None:
    """The dialect's connection is refused after close (which runs the caller's flush first)."""
    flushed: list[bool] = []
    dialect.close(lambda: flushed.append(True))
    assert flushed == [True]
    with pytest.raises(StoreError, match="closed"), dialect.db():
        pass
    with pytest.raises(sqlite3.ProgrammingError):
        dialect.conn.execute("SELECT 1")


def test_the_server_parts_work_over_a_connection_of_their_own(postgres_url: str, pg_schema: str) -> None:
    """PostgreSQL's dialect, read-ahead and vector part, each built by its constructor over a
    new connection to a store's schema, read, read ahead and search as the store does."""
    from msm_mem._storage.postgres import PostgresStore
    from msm_mem._storage.postgres.connection import PgDialect
    from msm_mem._storage.postgres.keys import PgKeyTable
    from msm_mem._storage.postgres.pgvector import connect as pg_connect
    from msm_mem._storage.postgres.pgvector import use_schema
    from msm_mem._storage.postgres.readahead import ReadAhead
    from msm_mem._storage.postgres.search import PgVectors

    store = with_codec(PostgresStore.create(postgres_url, dim=4, encoder="t", schema=pg_schema))
    store.write(WriteBatch(episodes=[_episode(0, "P1"), _episode(1, "P1")], consents=[_consent("a")]))
    store.close()
    conn = pg_connect(postgres_url)
    use_schema(conn, pg_schema)
    forgotten: list[bool] = []
    dialect = PgDialect(
        conn, pg_schema, TENANT, legacy=False, on_reconnect=lambda: None, on_write=lambda: forgotten.append(True)
    )
    try:
        tables = SqlTables(dialect, TENANT)
        assert SqlRecords(tables, NoCache()).record_ids("episodic", "P1") == ["E-0", "E-1"]
        ahead = ReadAhead(dialect, tables, PgKeyTable(dialect.db, TENANT), dim=4)
        ahead.prefetch(["P1"])

        def unread() -> list[ConsentRecord]:
            raise AssertionError("read again")

        assert [c.consent_id for c in ahead.consents("P1", unread)] == ["C-a"]
        vectors = PgVectors(dialect, ahead, dim=4, tenant=TENANT, approximate=False)
        z = np.array([0, 1, 0, 0], np.float32)
        assert vectors.search("episodic", z, 5, "P1") == [("E-1", 1.0), ("E-0", 0.0)]
        assert vectors.max_cosine(z, ["episodic", "visual"], "P1") == 1.0
        assert SqlAudit(tables).audit_head() == (0, GENESIS)
        with dialect.db(), dialect.transaction():
            assert vectors.positions() == {"episodic": 2, "visual": 0}
        assert forgotten == [True]  # a write transaction drops what was read ahead
    finally:
        dialect.close(lambda: None)


def test_a_store_is_at_most_two_classes_above_the_contract() -> None:
    """Each backend's store is a SqlStore over parts, not a tower: two classes down to Store."""
    from msm_mem._storage.base import Store
    from msm_mem._storage.postgres import PostgresStore
    from msm_mem._storage.sql_store import SqlStore

    for backend in (SqliteStore, PostgresStore):
        mro = backend.__mro__
        assert mro[: mro.index(Store)] == (backend, SqlStore)

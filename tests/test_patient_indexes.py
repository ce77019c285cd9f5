"""A read of one patient's rows costs what the patient holds, not what the store holds: every
such read has an index leading with the tenant and the patient, and a store made before an
index gets it when it is next opened for writing."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from msm_mem import EpisodicRecord, Impression, SemanticState, StoreError, VisualRecord
from msm_mem._storage.base import WriteBatch
from msm_mem._storage.indexes import INDEX_NAMES
from msm_mem._storage.sqlite import SqliteStore
from msm_mem._tier_records import Claim, ConsentRecord, Entity, Relationship, StmItem, StmPayload
from tests.conftest import DIM, StoreFactory, random_unit, with_codec

#: the indexes a later release added (a store made before them lacks them)
LATER = ("claims_patient", "entities_patient", "relationships_patient")


def rows_of(patient: str, start: int, n: int, rng: np.random.Generator) -> WriteBatch:
    """``n`` rows of each table a patient's reads touch, for ``patient``, ids numbered from
    ``start`` (a semantic category, a claim key a row)."""
    ids = range(start, start + n)
    return WriteBatch(
        episodes=[
            EpisodicRecord(f"E-{i}", patient, 1e9 + i, random_unit(rng), "q?", f"a {i}", study_id=f"s{i}") for i in ids
        ],
        visuals=[VisualRecord(f"V-{i}", patient, 1e9 + i, random_unit(rng), source_episode_id=f"E-{i}") for i in ids],
        claims=[Claim(f"C-{i}", patient, f"k{i}", "content", "source", 0.5, "agent", 1.0 + i, None) for i in ids],
        entities=[Entity(f"N-{i}", patient, "finding", f"finding {i}", 1.0 + i) for i in ids],
        relationships=[Relationship(f"R-{i}", patient, f"C-{i}", f"N-{i}", "asserts", 1.0 + i) for i in ids],
        semantic=[SemanticState(f"S-{i}", patient, f"c{i}", (Impression(1e9, "stable"),)) for i in ids],
        stm=[
            StmItem(f"M-{i}", patient, "interaction", StmPayload("q", 1e9), 1e9, 2e9, z=random_unit(rng)) for i in ids
        ],
        consents=[ConsentRecord(f"K-{i}", patient, "role:agent", "treatment", "permit", ("*",), 0.0) for i in ids],
    )


def patient_reads(store: Any) -> dict[str, Callable[[], object]]:
    """Every read of one patient's rows the stores share, below the embedded store's caches."""
    return {
        "episode ids": lambda: store.record_ids("episodic", "p"),
        "visual ids": lambda: store.record_ids("visual", "p"),
        "semantic ids": lambda: store.record_ids("semantic", "p"),
        "claim ids": lambda: store.record_ids("claims", "p"),
        "semantic states": lambda: store._records._load_semantic("p"),
        "semantic history": lambda: store.semantic_history("p", "c1"),
        "active claims": lambda: store.claims_active("p"),
        "active claim of a key": lambda: store.claims_active("p", "k1"),
        "claim history": lambda: store.claim_history("p", "k1"),
        "entities": lambda: store._tiers._load_entities("p"),
        "relationships": lambda: store.relationships("p"),
        "consents": lambda: store._tiers._load_consents("p"),
        "short-term items": lambda: store.stm_list(patient_id="p"),
        "studies": lambda: store.studies("p"),
        "study episodes": lambda: store.study_episodes("p", "s1"),
        "has the patient": lambda: store.has_patient("p"),
    }


def vm_steps(conn: sqlite3.Connection, read: Callable[[], object]) -> int:
    """The SQLite virtual machine's instructions one read runs (deterministic for given rows)."""
    steps = [0]

    def tick() -> int:
        steps[0] += 1
        return 0

    conn.set_progress_handler(tick, 1)
    try:
        read()
    finally:
        conn.set_progress_handler(None, 1)
    return steps[0]


def test_a_patients_reads_do_not_grow_with_other_patients_rows(tmp_path: Path) -> None:
    """Each read runs as many instructions after 3,000 rows of other patients per table were
    added as before them, give or take a B-tree level; a scan of the tables would run
    thousands more."""
    rng = np.random.default_rng(0)
    store = with_codec(SqliteStore.create(tmp_path / "s", dim=DIM, encoder="test"))
    try:
        store.write(rows_of("p", 0, 3, rng))
        before = {name: vm_steps(store._conn, read) for name, read in patient_reads(store).items()}
        store.write(rows_of("other", 100, 3000, rng))
        after = {name: vm_steps(store._conn, read) for name, read in patient_reads(store).items()}
    finally:
        store.close()
    grown = {name: (before[name], after[name]) for name in before if after[name] > before[name] + 100}
    assert not grown, f"reads that grew with other patients' rows (instructions before, after): {grown}"


def _index_names(store: Any) -> set[str]:
    if isinstance(store, SqliteStore):
        return {r[0] for r in store._conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    with store._db() as conn:
        rows = conn.execute("SELECT indexname FROM pg_indexes WHERE schemaname = %s", (store.schema,)).fetchall()
    return {r[0] for r in rows}


def _drop(store: Any, names: tuple[str, ...]) -> None:
    for name in names:
        if isinstance(store, SqliteStore):
            store._conn.execute(f"DROP INDEX {name}")
        else:
            with store._db() as conn:
                conn.execute(f'DROP INDEX "{store.schema}".{name}'.encode())


def test_a_new_store_has_every_index(make_store: StoreFactory) -> None:
    store = make_store()
    assert set(INDEX_NAMES) <= _index_names(store)


def test_a_store_made_before_an_index_gets_it_when_opened(make_store: StoreFactory, reopen: Callable[..., Any]) -> None:
    """The indexes a later release added are made on the next open, the rows unchanged."""
    store = make_store()
    store.write(rows_of("p", 0, 3, np.random.default_rng(1)))
    _drop(store, LATER)
    assert not set(LATER) & _index_names(store)
    digests = store.row_digests()
    again = reopen(store)
    assert set(INDEX_NAMES) <= _index_names(again)
    assert again.row_digests() == digests
    assert again.computed_row_digests() == digests
    assert [e.entity_id for e in again.entities("p")] == ["N-0", "N-1", "N-2"]
    assert again.record_ids("claims", "p") == ["C-0", "C-1", "C-2"]
    assert [c.claim_id for c in again.claim_history("p", "k1")] == ["C-1"]


def test_a_unique_index_the_rows_break_fails_the_open_and_makes_nothing(
    make_store: StoreFactory, reopen: Callable[..., Any]
) -> None:
    """A store whose one-active-claim index is gone and whose rows now hold two active claims
    of one key is refused on open with a StoreError naming the index, and none of the
    missing indexes is made."""
    store = make_store()
    store.write(rows_of("p", 0, 3, np.random.default_rng(5)))
    _drop(store, ("claims_one_active", *LATER))
    columns = "patient_id, key, content, source, confidence, evidence_tier, state, supersedes, created_at, decay_at"
    copy = f"INSERT INTO claims (id, {columns}, tenant) SELECT 'C-dup', {columns}, tenant FROM claims WHERE id = 'C-1'"
    if isinstance(store, SqliteStore):
        store._conn.execute(copy)
    else:
        with store._db() as conn:  # type: ignore[attr-defined]
            conn.execute(copy.encode())
    with pytest.raises(StoreError, match="index"):
        reopen(store)
    assert not {"claims_one_active", *LATER} & _index_names(store)
    assert sorted(store.record_ids("claims", "p")) == ["C-0", "C-1", "C-2", "C-dup"]


def test_a_read_only_store_without_the_later_indexes_opens_and_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store the process may not write (read-only media: the check of the open path made to
    say so, as root may write anything) is opened and read as it is, nothing made."""
    store = with_codec(SqliteStore.create(tmp_path / "s", dim=DIM, encoder="test"))
    store.write(rows_of("p", 0, 3, np.random.default_rng(2)))
    _drop(store, LATER)
    store.close()
    monkeypatch.setattr("msm_mem._storage.sqlite.store.writable", lambda path: False)
    ro = with_codec(SqliteStore.open(tmp_path / "s"))
    try:
        assert ro.read_only
        assert not set(LATER) & _index_names(ro)
        assert [e.entity_id for e in ro.entities("p")] == ["N-0", "N-1", "N-2"]
    finally:
        ro.close()


@pytest.mark.postgres
def test_postgres_finds_a_patients_rows_by_index(postgres_url: str, pg_schema: str) -> None:
    """With the statistics of a store of many patients, the server finds one patient's
    entities, relationships and claim history through the patient indexes."""
    from msm_mem._storage.postgres import PostgresStore

    store = with_codec(PostgresStore.create(postgres_url, dim=DIM, encoder="test", schema=pg_schema))
    try:
        rng = np.random.default_rng(3)
        store.write(rows_of("p", 0, 3, rng))
        batch = rows_of("other", 100, 3000, rng)
        batch.entities[:] = [Entity(f"N-{i}", f"o{i}", "finding", "x", 1.0) for i in range(100, 3100)]
        batch.relationships[:] = [Relationship(f"R-{i}", f"o{i}", "C", "N", "asserts", 1.0) for i in range(100, 3100)]
        batch.claims[:] = [Claim(f"C-{i}", f"o{i}", "k1", "c", "s", 0.5, "agent", 1.0, None) for i in range(100, 3100)]
        store.write(batch)
        queries = {
            "entities": "SELECT * FROM entities WHERE tenant = %s AND patient_id = %s AND state = 'active'",
            "relationships": "SELECT * FROM relationships WHERE tenant = %s AND patient_id = %s AND state = 'active'",
            "claims": "SELECT * FROM claims WHERE tenant = %s AND patient_id = %s AND key = %s",
        }
        with store._db() as conn:
            for table, query in queries.items():
                conn.execute(f'ANALYZE "{pg_schema}".{table}'.encode())
                args = (store.tenant, "p", "k1") if table == "claims" else (store.tenant, "p")
                plan = "\n".join(row[0] for row in conn.execute(("EXPLAIN " + query).encode(), args).fetchall())
                assert "Seq Scan" not in plan and f"{table}_patient" in plan, plan
    finally:
        store.close()


@pytest.mark.postgres
def test_postgres_role_that_does_not_own_the_tables_opens_without_the_new_indexes(
    postgres_url: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A role that may read and write the tables but not index them opens a store that lacks
    an index, with a warning naming the schema, and reads as before."""
    import uuid

    import psycopg
    from psycopg.conninfo import make_conninfo

    from msm_mem._storage.postgres import PostgresStore

    store = with_codec(PostgresStore.create(postgres_url, dim=DIM, encoder="test", schema=pg_schema))
    store.write(rows_of("p", 0, 3, np.random.default_rng(4)))
    _drop(store, LATER)
    store.close()
    role = f"r_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN".encode())
        admin.execute(f'GRANT USAGE ON SCHEMA "{pg_schema}" TO {role}'.encode())
        admin.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "{pg_schema}" TO {role}'.encode())
    try:
        with caplog.at_level("WARNING", logger="msm_mem"):
            other = with_codec(PostgresStore.open(make_conninfo(postgres_url, user=role), schema=pg_schema))
        try:
            assert any(pg_schema in r.getMessage() and "not made" in r.getMessage() for r in caplog.records)
            assert not set(LATER) & _index_names(other)
            assert [e.entity_id for e in other.entities("p")] == ["N-0", "N-1", "N-2"]
        finally:
            other.close()
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute(f'REVOKE ALL ON ALL TABLES IN SCHEMA "{pg_schema}" FROM {role}'.encode())
            admin.execute(f'REVOKE ALL ON SCHEMA "{pg_schema}" FROM {role}'.encode())
            admin.execute(f"DROP ROLE {role}".encode())

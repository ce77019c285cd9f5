"""PostgreSQL-specific behaviour of PostgresStore (the shared contract is in test_store_contract.py)."""

from __future__ import annotations

import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import psycopg
import pytest

from msm_mem import (
    EpisodicRecord,
    Impression,
    InvalidInput,
    MissingExtra,
    NotFound,
    SemanticState,
    State,
    StoreError,
    VisualRecord,
)
from msm_mem._storage.base import PII_FIELDS, StateChange, WriteBatch
from msm_mem._storage.postgres import PostgresStore
from msm_mem._tier_records import AuditRow, Claim, WrappedKey
from msm_mem.testing import local_server
from tests.conftest import DIM, random_unit, with_codec

pytestmark = pytest.mark.postgres

Make = Callable[..., PostgresStore]
SCRUB = tuple((name, "") for name in PII_FIELDS["episodic"])  # anonymisation rewrites every PHI field


@pytest.fixture
def make_pg(postgres_url: str) -> Iterator[Make]:
    """A factory of PostgresStores, each in a fresh schema; every store made is closed afterwards."""
    made: list[PostgresStore] = []
    prefix = f"tpg_{uuid.uuid4().hex[:8]}_"

    def make(schema: str | None = None, *, reopen: bool = False, **kw: object) -> PostgresStore:
        schema = schema or f"{prefix}{uuid.uuid4().hex[:8]}"
        if reopen:
            store = PostgresStore.open(postgres_url, schema=schema, **kw)  # type: ignore[arg-type]
        else:
            store = PostgresStore.create(postgres_url, dim=DIM, encoder="test", schema=schema, **kw)  # type: ignore[arg-type]
        with_codec(store)
        made.append(store)
        return store

    make.prefix = prefix  # type: ignore[attr-defined]  # for schemas a test makes by hand
    yield make
    for store in made:
        store.close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:  # leave a shared server clean
        for (name,) in conn.execute("SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s)", (prefix,)):
            conn.execute(f'DROP SCHEMA "{name}" CASCADE')


def episodes(n: int, patients: int, seed: int = 0, start: int = 0) -> list[EpisodicRecord]:
    rng = np.random.default_rng(seed)
    return [
        EpisodicRecord(f"E-{i}", f"p{i % patients}", 1e9 + i, random_unit(rng), "q?", f"a{i}", study_id=f"s{i}")
        for i in range(start, start + n)
    ]


def positions(url: str, schema: str, table: str) -> list[int]:
    with psycopg.connect(url) as conn:
        return [r[0] for r in conn.execute(f'SELECT pos FROM "{schema}".{table} ORDER BY pos')]


def test_reopen_gives_identical_search_results(make_pg: Make) -> None:
    """Closing and reopening the schema returns the same hits and scores in every scope."""
    store = make_pg()
    records = episodes(60, 6)
    store.write(WriteBatch(episodes=records))
    anonymise = StateChange("episodic", "E-3", State.ACTIVE, State.ANONYMIZED, "E-anon", "", SCRUB)
    store.write(WriteBatch(changes=[anonymise, StateChange("episodic", "E-4", State.ACTIVE, State.SUPERSEDED)]))
    queries = [random_unit(np.random.default_rng(100 + i)) for i in range(5)]
    scopes: list[str | None] = [None, "", "p0", "p3", "p5"]
    before = [store.search("episodic", q, 7, s) for q in queries for s in scopes]
    store.close()
    again = make_pg(store.schema, reopen=True)
    assert [again.search("episodic", q, 7, s) for q in queries for s in scopes] == before
    assert again.dim == DIM and again.encoder_name == "test"


def test_vectors_come_back_bit_for_bit(make_pg: Make) -> None:
    """The binary pgvector adapter keeps every float32 bit, negative zero included."""
    store = make_pg()
    z = np.zeros(DIM, dtype=np.float32)
    z[0], z[1], z[2] = np.float32(0.6), np.float32(-0.8), np.float32(-0.0)
    z[3] = np.float32(1e-30)
    e = EpisodicRecord("E-z", "p", 1.0, z, "q", "a")
    store.write(WriteBatch(episodes=[e], visuals=[VisualRecord("V-z", "p", 1.0, z)]))
    assert store.get_episodes(["E-z"])[0].z.tobytes() == z.tobytes()
    assert next(store.iter_visuals()).z.tobytes() == z.tobytes()


def test_failing_batch_leaves_nothing(make_pg: Make, postgres_url: str) -> None:
    """A batch failing on its last change stores no row anywhere and keeps positions dense."""
    store = make_pg()
    store.write(WriteBatch(episodes=episodes(3, 1)))
    rng = np.random.default_rng(9)
    z = random_unit(rng)
    sem = SemanticState("S-1", "p0", "impression", (Impression(1e9, "t"),))
    claim = Claim("C-1", "p0", "k", "content", "src", 0.9, "agent", created_at=1.0)
    batch = WriteBatch(
        episodes=episodes(2, 1, start=10),
        visuals=[VisualRecord("V-1", "p0", 1.0, z)],
        semantic=[sem],
        claims=[claim],
        audit=[AuditRow(1, b"{}", "0" * 64)],
        changes=[StateChange("episodic", "E-missing", State.ACTIVE, State.SUPERSEDED)],
    )
    with pytest.raises(NotFound):
        store.write(batch)
    assert (store.count("episodic"), store.count("visual"), store.count("semantic")) == (3, 0, 0)
    assert store.claims_active("p0") == [] and store.audit_head()[0] == 0
    store.write(WriteBatch(episodes=episodes(2, 1, start=10)))
    assert positions(postgres_url, store.schema, "episodic") == [0, 1, 2, 3, 4]


def test_text_with_nul_is_refused(make_pg: Make) -> None:
    """PostgreSQL cannot store NUL characters: InvalidInput, nothing written (in a plain column:
    PHI columns hold ciphertext)."""
    store = make_pg()
    bad = EpisodicRecord("E-nul", "p", 1.0, random_unit(np.random.default_rng(1)), "q", "a", study_id="s\x00")
    with pytest.raises(InvalidInput):
        store.write(WriteBatch(episodes=[bad]))
    assert store.count("episodic") == 0
    assert store.search("episodic", bad.z, 3, "p\x00") == [] and not store.has_patient("p\x00")


def test_opening_something_that_is_not_a_store_raises_store_error(make_pg: Make, postgres_url: str) -> None:
    """A missing schema, a foreign meta table, a second create and a bad DSN all raise StoreError."""
    with pytest.raises(StoreError, match="not an msm-mem store"):
        PostgresStore.open(postgres_url, schema=f"nothing_{uuid.uuid4().hex[:8]}")
    other = f"{make_pg.prefix}other"  # type: ignore[attr-defined]
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{other}"')
        conn.execute(f'CREATE TABLE "{other}".meta(key TEXT, value TEXT)')
        conn.execute(f"INSERT INTO \"{other}\".meta VALUES ('format', 'someone-else')")
    with pytest.raises(StoreError, match="format 'someone-else'"):
        PostgresStore.open(postgres_url, schema=other)
    store = make_pg()
    with pytest.raises(StoreError, match="already holds a store"):
        PostgresStore.create(postgres_url, dim=DIM, encoder="test", schema=store.schema)
    with pytest.raises(StoreError, match="cannot connect"):
        PostgresStore.open("postgresql://nobody@/nodb?host=/nonexistent-socket-dir")


def test_patient_scoped_query_uses_the_patient_index(make_pg: Make, postgres_url: str) -> None:
    """EXPLAIN: patient scope reads the btree on patient_id (or scans) and never the HNSW index."""
    store = make_pg()
    for start in range(0, 4000, 1000):
        store.write(WriteBatch(episodes=episodes(1000, 400, seed=start, start=start)))
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'ANALYZE "{store.schema}".episodic')
    q = random_unit(np.random.default_rng(5))
    plan = store.explain_search("episodic", q, 5, "p7")
    assert "episodic_patient" in plan and "hnsw" not in plan, plan
    assert "hnsw" not in store.explain_search("episodic", q, 5, None)


def test_ties_are_broken_by_insertion_order(make_pg: Make) -> None:
    """Identical vectors come back in insertion order, in patient and population scope."""
    store = make_pg()
    z = random_unit(np.random.default_rng(2))
    same = [EpisodicRecord(f"E-{c}", "p", 1.0, z, "q", "a") for c in "dbca"]
    store.write(WriteBatch(episodes=same[:2]))
    store.write(WriteBatch(episodes=same[2:]))
    for scope in ("p", None):
        assert [i for i, _ in store.search("episodic", z, 3, scope)] == ["E-d", "E-b", "E-c"]
    # an UPDATE moves a row to the end of the heap; its position (and rank among ties) stays
    anonymise = StateChange("episodic", "E-d", State.ACTIVE, State.ANONYMIZED, new_patient_id="", fields=SCRUB)
    store.write(WriteBatch(changes=[anonymise]))
    assert [i for i, _ in store.search("episodic", z, 3, None)] == ["E-d", "E-b", "E-c"]


def test_hnsw_population_mode_finds_an_exact_duplicate(make_pg: Make) -> None:
    """The opt-in approximate mode still returns stored duplicates first and skips retired rows."""
    store = make_pg(population_search="hnsw")
    records = episodes(300, 10)
    store.write(WriteBatch(episodes=records))
    store.write(WriteBatch(changes=[StateChange("episodic", "E-5", State.ACTIVE, State.RETRACTED)]))
    hits = store.search("episodic", records[17].z, 3, None)
    assert hits[0][0] == "E-17" and hits[0][1] == pytest.approx(1.0, abs=1e-5)
    assert "E-5" not in [i for i, _ in store.search("episodic", records[5].z, 3, None)]
    with pytest.raises(InvalidInput):
        make_pg(population_search="fuzzy")


def test_hnsw_index_exists_only_where_asked_for(make_pg: Make, postgres_url: str) -> None:
    """An exact-mode store maintains no HNSW index (its inserts do not pay for one); the first
    opening in HNSW mode builds it over the rows already there, and it stays after that."""

    def indexes(schema: str) -> set[str]:
        with psycopg.connect(postgres_url) as conn:
            rows = conn.execute("SELECT indexname FROM pg_indexes WHERE schemaname = %s", (schema,)).fetchall()
        return {r[0] for r in rows if r[0].endswith("_hnsw")}

    store = make_pg()
    records = episodes(50, 5)
    store.write(WriteBatch(episodes=records))
    assert indexes(store.schema) == set()
    approximate = make_pg(store.schema, reopen=True, population_search="hnsw")
    assert indexes(store.schema) == {"episodic_hnsw", "visual_hnsw"}
    assert approximate.search("episodic", records[7].z, 1, None)[0][0] == "E-7"
    make_pg(store.schema, reopen=True)
    assert indexes(store.schema) == {"episodic_hnsw", "visual_hnsw"}


def test_concurrent_writers_keep_positions_dense(make_pg: Make, postgres_url: str) -> None:
    """Two connections writing at once serialise: positions 0..n-1, no error, nothing lost."""
    first = make_pg()
    second = make_pg(first.schema, reopen=True)
    errors: list[BaseException] = []

    def work(store: PostgresStore, base: int) -> None:
        try:
            for b in range(10):
                store.write(WriteBatch(episodes=episodes(5, 3, seed=base + b, start=base + 5 * b)))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s, base)) for s, base in ((first, 0), (second, 1000))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert positions(postgres_url, first.schema, "episodic") == list(range(100))


def test_governed_tables_round_trip(make_pg: Make) -> None:
    """Claims supersede, audit rows chain and purge, keys shred, record_ids keep insertion order."""
    store = make_pg()
    c1 = Claim("C-1", "p", "finding", "opacity", "agent", 0.5, "agent", created_at=1.0)
    c2 = Claim("C-2", "p", "finding", "no opacity", "report", 0.9, "report", created_at=1.0, supersedes="C-1")
    store.write(WriteBatch(claims=[c1], audit=[AuditRow(1, b"a", "1" * 64), AuditRow(2, b"b", "2" * 64)]))
    store.write(WriteBatch(claims=[c2], audit=[AuditRow(3, b"c", "3" * 64)]))
    assert [c.claim_id for c in store.claims_active("p")] == ["C-2"]
    assert [c.claim_id for c in store.claim_history("p", "finding")] == ["C-1", "C-2"]
    assert store.record_ids("claims", "p") == ["C-1", "C-2"]
    with pytest.raises(InvalidInput):
        store.write(WriteBatch(audit=[AuditRow(7, b"x", "7" * 64)]))
    assert store.audit_purge(2) == 2 and store.audit_base() == (2, "2" * 64)
    assert [r.seq for r in store.iter_audit()] == [3] and store.audit_head() == (3, "3" * 64)
    keys = store.keys()
    # "q" has no key yet ("p" has the codec's): a patient keeps the first key stored
    keys.put(WrappedKey("K-1", "q", "kek", b"\x01\x02", 1.0))
    keys.put_pseudonym("K-1", "ps-1", "tok")
    keys.shred("q")
    shredded = keys.get("q")
    assert shredded is not None and shredded.shredded and shredded.wrapped == b""
    assert keys.pseudonym("K-1") is None


def test_local_server_without_pgserver_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No pgserver package: MissingExtra with the install hint, not a bare ImportError."""
    monkeypatch.setitem(sys.modules, "pgserver", None)
    with pytest.raises(MissingExtra, match=r"msm-mem\[postgres\]"):
        local_server(tmp_path / "data")


def test_local_server_that_cannot_start_raises_store_error(tmp_path: Path) -> None:
    """A data directory that cannot be made (its parent is a file) raises StoreError naming it."""
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(StoreError, match="could not start PostgreSQL"):
        local_server(tmp_path / "file" / "data")

"""The server store's batched path: the read-ahead of a batch of turns is one snapshot kept
until the next sync or write, the searches of one query go in one pipeline, and a batch of
governed turns costs one round trip per turn (its novelty search) plus a few per batch."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest

from msm_mem import ConsentRecord, EpisodicRecord, MsmMem, VisualRecord
from msm_mem._memory.claim_evidence import claim_key
from msm_mem._records import new_id
from msm_mem._settings import Settings
from msm_mem._storage.base import VectorKind, WriteBatch
from msm_mem._storage.postgres import PostgresStore
from msm_mem.testing import FixedClock
from tests.helpers import ADMIN, AGENT
from tests.layers import Layers, open_layers

pytestmark = pytest.mark.postgres

T0 = 1.7e9


def _layers(path: Path, url: str, schema: str, settings: Settings | None = None) -> Layers:
    """A new server store made by ``MsmMem.init`` (the test admin's), and its layers: the
    store handle (``handle``, no view in front) and the governed tiers over it."""
    MsmMem.init(path, ADMIN, clock=FixedClock(T0), database_url=url, schema=schema, settings=settings).close()
    return open_layers(path, clock=FixedClock(T0), settings=settings)


def _turns(layers: Layers, patients: list[str], seed: int, ahead: bool = False) -> None:
    """One batch of a turn a patient; ``ahead``: its novelty searches read ahead with it."""
    gm = layers.gm
    z = np.random.default_rng(seed).standard_normal((len(patients), layers.handle.dim)).astype(np.float32)
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    novelty = list(zip(patients, z, strict=True)) if ahead else []
    turns = gm.begin_many(AGENT, patients, novelty=novelty)
    for i, turn in enumerate(turns):
        item = gm.observe(turn, z[i], "Impression?", timestamp=T0, study_id=f"S{seed}-{i}")
        gm.consolidate(turn, item, "Right lower lobe consolidation, likely pneumonia.", decision="treat")
    gm.commit_many(turns)


@pytest.fixture
def schema() -> str:
    return f"tpgb_{uuid.uuid4().hex[:12]}"


def test_read_ahead_is_one_snapshot_until_the_next_sync(tmp_path: Path, postgres_url: str, schema: str) -> None:
    """Another connection's commit is not seen by the reads of a batch read ahead before it,
    and is seen once the next turn begins (sync)."""
    mem = _layers(tmp_path / "a", postgres_url, schema)
    other = MsmMem.open(tmp_path / "a")
    try:
        _turns(mem, ["P1", "P2"], 0)
        store = mem.handle
        store.sync()
        store.prefetch(["P1", "P2"])
        before = store.consents("P1")
        deny = ConsentRecord(new_id("C"), "P1", "role:agent", "treatment", "deny", ("*",), 0.0, None, T0)
        other.grant(ADMIN, [deny])
        assert store.consents("P1") == before
        store.sync()
        after = store.consents("P1")
        assert deny in after and len(after) == len(before) + 1
    finally:
        other.close()
        mem.close()


def test_a_write_of_the_store_drops_the_read_ahead(tmp_path: Path, postgres_url: str, schema: str) -> None:
    """This store's own commit is read back at once, though the batch was read ahead before it."""
    layers = _layers(tmp_path / "a", postgres_url, schema)
    try:
        store = layers.handle
        store.sync()
        store.prefetch(["P1"])
        assert store.claims_active("P1") == []
        _turns(layers, ["P1"], 1)  # (begin_many syncs and reads ahead again: read ahead once more here)
        store.prefetch(["P1"])
        assert len(store.claims_active("P1")) == 1
        _turns(layers, ["P2"], 2)
        assert [c.key for c in store.claims_active("P2")] == [claim_key("S2-0", "Impression?")]
    finally:
        layers.close()


def test_search_many_answers_as_search_does(postgres_url: str, schema: str) -> None:
    """The pipelined searches return exactly the searches one by one, in order; k <= 0 and a
    NUL in the scope return nothing, as search does."""
    layers = _layers(Path(tempfile.mkdtemp()) / "s", postgres_url, schema)
    try:
        _turns(layers, ["P1", "P2", "P3"], 3)
        _turns(layers, ["P1", "P2"], 4)
        store = layers.handle
        assert isinstance(store, PostgresStore)
        rng = np.random.default_rng(9)
        for _ in range(5):
            z = rng.standard_normal(store.dim).astype(np.float32)
            z /= np.linalg.norm(z)
            for scope in ("P1", "P2", "P-none", None, "P\x001"):
                requests = [("episodic", 3), ("visual", 1), ("episodic", 0)]
                one_by_one = [store.search(kind, z, k, scope) for kind, k in requests]  # type: ignore[arg-type]
                assert store.search_many(z, requests, scope) == one_by_one  # type: ignore[arg-type]
    finally:
        layers.close()


def test_novelty_read_ahead_answers_as_the_searches_do(tmp_path: Path, postgres_url: str, schema: str) -> None:
    """The novelty searches read ahead (one statement a kind for the whole batch) give each
    (patient, query) the top hit the search itself gives: in a store with the HNSW index on
    (where a plain filtered ordering would be approximate), for a patient holding most rows, a
    query equal to a stored vector, and nothing for a patient without rows; the batch's
    novelty checks then cost no round trip."""
    layers = _layers(tmp_path / "h", postgres_url, schema, Settings(population_search="hnsw"))
    try:
        store = layers.handle
        assert isinstance(store, PostgresStore)
        rng = np.random.default_rng(11)
        owners = ["P-big"] * 360 + [f"P{i % 4}" for i in range(40)]
        z = rng.standard_normal((len(owners), store.dim)).astype(np.float32)
        z /= np.linalg.norm(z, axis=1, keepdims=True)
        for start in range(0, len(owners), 100):
            part = range(start, start + 100)
            episodes = [
                EpisodicRecord(f"E-{i}", owners[i], T0 + i, z[i], "Q?", "A.", "", f"img/{i}.png", "", f"s{i}")
                for i in part
            ]
            visuals = [VisualRecord(f"V-{i}", owners[i], T0 + i, z[i], f"img/{i}.png", "PA", f"E-{i}") for i in part]
            store.write(WriteBatch(episodes=episodes, visuals=visuals))
        asked = rng.standard_normal((3, store.dim)).astype(np.float32)
        asked /= np.linalg.norm(asked, axis=1, keepdims=True)
        patients = ["P-big", "P0", "P3", "P-none"]
        queries = [(p, q) for p in patients for q in [*asked, z[0], z[365]]]
        requests: list[tuple[VectorKind, int]] = [("episodic", 1), ("visual", 1)]
        store.sync()
        expected = [store.search_many(q, requests, p) for p, q in queries]
        assert expected[3] == [[("E-0", pytest.approx(1.0))], [("V-0", pytest.approx(1.0))]]
        assert expected[-1] == [[], []]
        store.sync()
        store.prefetch(patients, queries)
        trace = tmp_path / "trace.txt"
        with trace.open("w") as f:
            store._sql.conn.pgconn.trace(f.fileno())
            answered = [store.search_many(q, requests, p) for p, q in queries]
            store._sql.conn.pgconn.untrace()
        assert answered == expected
        assert _round_trips(trace) == 0
        assert store.search_many(asked[0], [("episodic", 2)], "P0") == [store.search("episodic", asked[0], 2, "P0")]
    finally:
        layers.close()


def _round_trips(trace: Path) -> int:
    """Messages after which the client waits for the server: a Sync, or a simple Query."""
    count = 0
    for line in trace.read_text(errors="replace").splitlines():
        parts = line.split("\t")
        if len(parts) > 3 and parts[1] == "F" and parts[3].split(" ")[0] in ("Sync", "Query"):
            count += 1
    return count


def test_a_batch_of_turns_costs_one_round_trip_per_turn(tmp_path: Path, postgres_url: str, schema: str) -> None:
    """20 governed turns (consent, keys, semantic state, claim, entities, novelty, write-back,
    audit) cost their 20 novelty searches and a fixed number of round trips for the batch,
    where each turn alone made nine."""
    layers = _layers(tmp_path / "a", postgres_url, schema)
    try:
        patients = [f"P{i}" for i in range(20)]
        for p in patients:
            layers.audit.pseudonym(p)
        _turns(layers, patients, 5)  # every patient has a semantic state and claims to supersede
        store = layers.handle
        assert isinstance(store, PostgresStore)
        trace = tmp_path / "trace.txt"
        with trace.open("w") as f:
            store._sql.conn.pgconn.trace(f.fileno())
            _turns(layers, patients, 6)
            store._sql.conn.pgconn.untrace()
        per_batch = _round_trips(trace) - len(patients)
        assert 0 < per_batch <= 16, per_batch
        assert len(store.claims_active("P0")) == 2
        # with the novelty searches read ahead, the batch's searches cost no round trip of their own
        with trace.open("w") as f:
            store._sql.conn.pgconn.trace(f.fileno())
            _turns(layers, patients, 7, ahead=True)
            store._sql.conn.pgconn.untrace()
        assert _round_trips(trace) == per_batch
        assert len(store.claims_active("P0")) == 3
    finally:
        layers.close()


def _rows_read(store: PostgresStore) -> int:
    """Rows of the vector tables the server has read so far, by sequential or index scans."""
    conn = store._sql.conn
    conn.execute("SELECT pg_stat_force_next_flush()")  # (this backend's counts, reported now)
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT sum(seq_tup_read + idx_tup_fetch) FROM pg_stat_user_tables"
        " WHERE schemaname = %s AND relname IN ('episodic', 'visual')",
        (store.schema,),
    ).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def test_a_patients_search_reads_the_patients_rows_as_the_tables_grow(postgres_url: str, schema: str) -> None:
    """The store's statements are prepared on the server while its tables are empty; a generic
    plan kept from then read every row for one patient's search once the tables had grown. The
    store analyzes the tables that doubled (statistics.py), and the server costs the kept plans
    again: 20 searches of patients with one record of each kind read 40 rows."""
    layers = _layers(Path(tempfile.mkdtemp()) / "g", postgres_url, schema)
    try:
        store = layers.handle
        assert isinstance(store, PostgresStore)
        for seed in range(12):  # from empty to 600 records of each kind, every statement run often
            _turns(layers, [f"P{seed}-{i}" for i in range(50)], seed)
        rng = np.random.default_rng(3)
        z = rng.standard_normal(store.dim).astype(np.float32)
        z /= np.linalg.norm(z)
        before = _rows_read(store)
        for i in range(20):
            found = store.search_many(z, [("episodic", 3), ("visual", 3)], f"P{i % 12}-{i}")
            assert [len(hits) for hits in found] == [1, 1]
        assert _rows_read(store) - before == 40
        kept = store._sql.conn.execute(
            "SELECT sum(generic_plans + custom_plans) FROM pg_prepared_statements WHERE statement LIKE '%<#>%'"
        ).fetchone()
        assert kept is not None and kept[0] >= 20, "the searches stay prepared (parsed once)"
    finally:
        layers.close()


@contextmanager
def _sent(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The statements psycopg's ``Connection.execute`` is given inside the block."""
    sent: list[str] = []
    execute = psycopg.Connection.execute

    def spy(self: psycopg.Connection[Any], query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(str(query))
        return execute(self, query, *args, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(psycopg.Connection, "execute", spy)
        yield sent


def test_an_audit_only_write_reads_the_head_and_the_digests_once(
    postgres_url: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write of audit rows alone (every served read commits one) reads the stored head and
    the row digests once each, the signing step included, and no vector positions."""
    directory = Path(tempfile.mkdtemp()) / "h"
    with _layers(directory, postgres_url, schema) as layers:
        _turns(layers, ["P1"], 0)
        assert isinstance(layers.handle, PostgresStore)
    mem = MsmMem.open(directory)
    try:
        with _sent(monkeypatch) as sent:
            mem.retrieve(AGENT, "P1", np.random.default_rng(0).random((64, 64), dtype=np.float32))
        assert sent and not [q for q in sent if "MAX(pos)" in q]
        assert len([q for q in sent if "FROM audit" in q and "ORDER BY seq DESC" in q]) == 1
        assert len([q for q in sent if "'rows:'" in q]) == 1
    finally:
        mem.close()


def test_a_key_read_for_its_patient_is_then_served_by_id_without_a_read(
    postgres_url: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A patient's data key read by patient is kept by its id too (one key a patient), so the
    decryption of the patient's rows reads nothing more; a shred empties both."""
    layers = _layers(Path(tempfile.mkdtemp()) / "k", postgres_url, schema)
    try:
        _turns(layers, ["P1"], 0)
        store = layers.handle
        assert isinstance(store, PostgresStore)
        keys = store.keys()
        store.sync()
        patient_refs = [row[0] for row in store._sql.conn.execute("SELECT patient_ref FROM keys").fetchall()]
        assert len(patient_refs) == 1, patient_refs
        key = keys.get(patient_refs[0])
        assert key is not None
        with _sent(monkeypatch) as sent:
            assert keys.get_by_id(key.key_id) == key
        assert sent == []
        keys.shred(patient_refs[0])
        got = keys.get_by_id(key.key_id)
        assert got is not None and got.shredded and keys.get(patient_refs[0]) == got
    finally:
        layers.close()


def test_records_read_by_id_are_kept_while_the_read_ahead_holds(
    tmp_path: Path, postgres_url: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside a read-ahead window a record read by id is read once (each read by id asks every
    shard of a Citus cluster); without one, and after this store's next write, it is read again."""
    layers = _layers(tmp_path / "a", postgres_url, schema)
    try:
        _turns(layers, ["P1"], 0)
        store = layers.handle
        ids = store.record_ids("episodic", "P1")
        assert ids
        with _sent(monkeypatch) as sent:
            first = store.get_episodes(ids)
            assert store.get_episodes(ids) == first
        assert len([q for q in sent if "FROM episodic" in q]) == 2  # no window: read each time
        store.sync()
        store.prefetch(["P1"])
        with _sent(monkeypatch) as sent:
            assert store.get_episodes(ids) == first
            assert store.get_episodes(ids[:1]) == first[:1]
        assert len([q for q in sent if "FROM episodic" in q]) == 1
        _turns(layers, ["P2"], 1)  # a write of this store drops the window
        with _sent(monkeypatch) as sent:
            assert store.get_episodes(ids) == first
        assert len([q for q in sent if "FROM episodic" in q]) == 1
    finally:
        layers.close()

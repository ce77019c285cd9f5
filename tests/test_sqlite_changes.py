"""The embedded store's change mark: another connection's change to a cached table empties the
caches; a commit of audit rows alone (another worker's reads) leaves them filled."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from msm_mem import EpisodicRecord, Impression, SemanticState
from msm_mem._records import State
from msm_mem._storage.base import StateChange, WriteBatch
from msm_mem._storage.sqlite import SqliteStore
from msm_mem._storage.sqlite.changes import (
    CACHED_TABLES,
    MARK_KEY,
    MOVED_KEY,
    MOVED_LIMIT,
    ChangeMark,
    installed,
    moved_positions,
)
from msm_mem._storage.sqlite.schema import DB_NAME
from msm_mem._tier_records import ConsentRecord, Entity
from tests.conftest import with_codec


def _state(sid: str, version: int, text: str, supersedes: str | None = None) -> SemanticState:
    return SemanticState(
        sid, "P1", "impression", (Impression(1e9 + version, text, ""),), version, created_at=1e9, supersedes=supersedes
    )


def _filled(path: Path) -> SqliteStore:
    """A store with a semantic state and an entity of P1, both read once (cached)."""
    store = with_codec(SqliteStore.create(path, dim=4, encoder="t"))
    store.write(WriteBatch(semantic=[_state("S-1", 1, "old")], entities=[Entity("N-1", "P1", "finding", "Edema", 5.0)]))
    assert store.semantic_active("P1")[0].state_id == "S-1"
    assert [e.name for e in store.entities("P1")] == ["Edema"]
    store.sync()
    store.consents("P1")
    return store


def _statements(store: SqliteStore) -> list[str]:
    seen: list[str] = []
    store._conn.set_trace_callback(seen.append)
    return seen


def _reads_of(seen: list[str], table: str) -> list[str]:
    return [s for s in seen if s.lstrip().upper().startswith("SELECT") and f"FROM {table} " in s + " "]


def test_a_commit_of_audit_rows_elsewhere_keeps_every_cache(tmp_path: Path) -> None:
    """Another connection appending audit rows only (a read's events) reloads nothing here."""
    store = _filled(tmp_path / "s")
    before = store._changes.current()
    with sqlite3.connect(tmp_path / "s" / DB_NAME) as other:
        other.execute("INSERT INTO audit (seq, payload, event_hash, tenant) VALUES (999999, x'00', 'h', 'default')")
    seen = _statements(store)
    store.sync()
    assert store.semantic_active("P1")[0].state_id == "S-1"
    assert [e.name for e in store.entities("P1")] == ["Edema"]
    store.consents("P1")
    store.search("episodic", np.ones(4, np.float32) / 2, 1, "P1")
    assert store._changes.current() == before
    for table in ("semantic", "entities", "consents", "keys", "episodic", "visual"):
        assert _reads_of(seen, table) == [], table
    store.close()


def test_a_change_elsewhere_is_seen_by_the_next_read(tmp_path: Path) -> None:
    """A second handle's supersession and new entity show on the first handle's next reads."""
    store = _filled(tmp_path / "s")
    other = with_codec(SqliteStore.open(tmp_path / "s"))
    other.write(
        WriteBatch(
            semantic=[_state("S-2", 2, "new", supersedes="S-1")], entities=[Entity("N-2", "P1", "finding", "Mass", 6.0)]
        )
    )
    other.close()
    assert store.semantic_active("P1")[0].state_id == "S-2"
    assert [e.name for e in store.entities("P1")] == ["Edema", "Mass"]
    store.close()


@pytest.mark.parametrize("table", CACHED_TABLES)
def test_every_change_to_a_cached_table_moves_the_mark(tmp_path: Path, table: str) -> None:
    """An insert, an update or a delete by another connection, in any cached table, gives a new
    mark, whatever wrote it (triggers in the database, not the writer's code)."""
    store = _filled(tmp_path / "s")
    marks = [store._changes.current()]
    with sqlite3.connect(tmp_path / "s" / DB_NAME, isolation_level=None) as other:
        columns = [r[1] for r in other.execute(f"PRAGMA table_info({table})")]
        numbers = ("pos", "version", "shredded")
        values = ["'default'" if c == "tenant" else "-7" if c in numbers else "'x'" for c in columns]
        rowid = other.execute(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(values)})").lastrowid
        marks.append(store._changes.current())
        other.execute(f"UPDATE {table} SET tenant = tenant WHERE rowid = ?", (rowid,))
        marks.append(store._changes.current())
        other.execute(f"DELETE FROM {table} WHERE rowid = ?", (rowid,))
        marks.append(store._changes.current())
    assert len(set(marks)) == 4
    store.close()


def test_a_store_made_before_the_mark_gets_it_on_its_first_writable_open(tmp_path: Path) -> None:
    """Without the triggers every commit elsewhere counts as a change (safe); a writable open
    installs them, after which audit rows alone no longer count."""
    SqliteStore.create(tmp_path / "s", dim=4, encoder="t").close()
    db = tmp_path / "s" / DB_NAME
    with sqlite3.connect(db, isolation_level=None) as raw:
        for (name,) in raw.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
            raw.execute(f"DROP TRIGGER {name}")
        raw.execute("DELETE FROM meta WHERE key = ?", (MARK_KEY,))
        assert not installed(raw, "default")
        mark = ChangeMark(raw, "default")
        first = mark.current()
        with sqlite3.connect(db) as other:
            other.execute("INSERT INTO audit (seq, payload, event_hash, tenant) VALUES (1, x'00', 'h', 'default')")
        assert mark.current() != first  # no mark yet: every commit counts
    SqliteStore.open(tmp_path / "s").close()
    with sqlite3.connect(db, isolation_level=None) as raw:
        assert installed(raw, "default")
        mark = ChangeMark(raw, "default")
        first = mark.current()
        with sqlite3.connect(db) as other:
            other.execute("INSERT INTO audit (seq, payload, event_hash, tenant) VALUES (2, x'00', 'h', 'default')")
        assert mark.current() == first


def _episode(i: int, patient: str, z: np.ndarray) -> EpisodicRecord:
    return EpisodicRecord(f"E-{i}", patient, 1e9 + i, z, "q?", f"answer {i}", study_id=f"s{i}")


def test_appended_vectors_elsewhere_are_followed_without_rereading_every_position(tmp_path: Path) -> None:
    """Another handle's new episodes are appended to this handle's index from its end; an
    episode it retires (an update of a vector row) is the one position read again."""
    rng = np.random.default_rng(3)
    zs = [(v / np.linalg.norm(v)).astype(np.float32) for v in rng.standard_normal((6, 4))]
    store = with_codec(SqliteStore.create(tmp_path / "s", dim=4, encoder="t"))
    store.write(WriteBatch(episodes=[_episode(i, "P1", zs[i]) for i in range(3)]))
    other = with_codec(SqliteStore.open(tmp_path / "s"))
    other.write(WriteBatch(episodes=[_episode(i, "P2", zs[i]) for i in range(3, 6)]))
    seen = _statements(store)
    store.sync()  # as every governed turn begins
    found = store.search("episodic", zs[4], 3, "P2")
    assert found[0][0] == "E-4" and {h for h, _ in found} == {"E-3", "E-4", "E-5"}
    assert [h for h, _ in store.search("episodic", zs[0], 1, "P1")] == ["E-0"]
    assert _full_reads(seen) == [] and any("pos >= 3" in s for s in seen)
    other.write(WriteBatch(changes=[StateChange("episodic", "E-4", State.ACTIVE, State.SUPERSEDED)]))
    other.close()
    store.sync()
    assert {h for h, _ in store.search("episodic", zs[4], 3, "P2")} == {"E-3", "E-5"}
    assert _full_reads(seen) == [] and any("pos IN (4)" in s for s in seen)
    store.write(WriteBatch(episodes=[_episode(6, "P1", zs[1])]))  # positions still follow the rows
    assert {h for h, _ in store.search("episodic", zs[1], 2, "P1")} == {"E-1", "E-6"}
    store.close()


def _full_reads(seen: list[str]) -> list[str]:
    """Statements reading the scope and id of every episodic position."""
    return [s for s in seen if "FROM episodic WHERE tenant" in s and "ORDER BY pos" in s and "pos >=" not in s]


def test_a_new_epoch_of_the_moved_mark_rereads_every_position(tmp_path: Path) -> None:
    """A moved mark past its limit starts a new epoch; a follower that cannot tell which rows
    changed reads every position again, and its searches see the changes."""
    rng = np.random.default_rng(5)
    zs = [(v / np.linalg.norm(v)).astype(np.float32) for v in rng.standard_normal((4, 4))]
    store = with_codec(SqliteStore.create(tmp_path / "s", dim=4, encoder="t"))
    store.write(WriteBatch(episodes=[_episode(i, "P1", zs[i]) for i in range(4)]))
    store.sync()
    with sqlite3.connect(tmp_path / "s" / DB_NAME, isolation_level=None) as other:
        other.execute("UPDATE meta SET value = value || ? WHERE key = ?", ("e0," * (MOVED_LIMIT // 3 + 1), MOVED_KEY))
        other.execute("UPDATE episodic SET state = 'superseded' WHERE id = 'E-2'")
        value = other.execute("SELECT value FROM meta WHERE key = ?", (MOVED_KEY,)).fetchone()[0]
    assert value.endswith("|") and len(value) < 40  # a new epoch
    seen = _statements(store)
    store.sync()
    assert _full_reads(seen) != []
    assert "E-2" not in {h for h, _ in store.search("episodic", zs[2], 4, "P1")}
    assert moved_positions("a|e1,", "a|e1,v7,e2,") == {"episodic": [2], "visual": [7]}
    assert moved_positions("a|e1,", "b|") is None and moved_positions(("data_version", 3), "b|") is None
    for bad in ("a|e1,x9,", "a|e1,e-3,", "a|e1,v,", "a|e1,e٣,"):  # not the triggers' form: read everything
        assert moved_positions("a|e1,", bad) is None, bad
    store.close()


def test_a_revocation_and_a_shred_elsewhere_reach_this_handle(tmp_path: Path) -> None:
    """The CLI revoking a consent or shredding a patient through another handle, while this
    handle (a service worker) holds both cached, shows at this handle's next turn."""
    store = _filled(tmp_path / "s")
    grant = ConsentRecord("C-1", "P1", "role:agent", "treatment", "permit", ("episodic",), 0.0)
    store.write(WriteBatch(consents=[grant]))
    store.sync()
    assert [c.revoked_at for c in store.consents("P1")] == [None]
    key = store.keys().get("P1")
    assert key is not None and not key.shredded
    other = with_codec(SqliteStore.open(tmp_path / "s"))
    other.write(WriteBatch(revocations=[("C-1", 5.0)]))
    store.sync()
    assert [c.revoked_at for c in store.consents("P1")] == [5.0]
    other.write(WriteBatch(shred_keys=["P1"]))
    other.close()
    store.sync()
    shredded = store.keys().get("P1")
    assert shredded is not None and shredded.shredded
    store.close()

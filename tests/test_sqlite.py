"""The embedded SQLite store: directory handling and the rebuildable FAISS cache."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from msm_mem import EpisodicRecord, IllegalTransition, Impression, SemanticState, State, StoreError
from msm_mem._storage.base import WriteBatch
from msm_mem._storage.sqlite import SqliteStore
from tests.conftest import random_unit, with_codec


def make(path: Path, n: int, seed: int = 0) -> tuple[SqliteStore, list[np.ndarray]]:
    store = with_codec(SqliteStore.create(path, dim=16, encoder="t"))
    rng = np.random.default_rng(seed)
    zs = [random_unit(rng) for _ in range(n)]
    store.write(
        WriteBatch(episodes=[EpisodicRecord(f"E-{i}", f"p{i % 4}", 1e9, z, "q", "a") for i, z in enumerate(zs)])
    )
    return store, zs


def results(store: SqliteStore, zs: list[np.ndarray]) -> list[object]:
    return [store.search("episodic", z, 5, scope) for z in zs[:5] for scope in ("p0", "p1", None)]


def test_deleting_the_index_rebuilds_identical_results(tmp_path: Path) -> None:
    """Index files removed: reopening rebuilds them from SQLite with the same answers."""
    store, zs = make(tmp_path / "s", 40)
    before = results(store, zs)
    store.close()
    shutil.rmtree(tmp_path / "s" / "index")
    reopened = with_codec(SqliteStore.open(tmp_path / "s"))
    assert results(reopened, zs) == before
    reopened.close()
    assert (tmp_path / "s" / "index" / "episodic.faiss").is_file()


def test_stale_or_foreign_index_is_caught_up_or_rebuilt(tmp_path: Path) -> None:
    """An index file older than the database, or from another store, is not trusted."""
    store, zs = make(tmp_path / "s", 10)
    store.close()
    shutil.copytree(tmp_path / "s" / "index", tmp_path / "old-index")
    store = with_codec(SqliteStore.open(tmp_path / "s"))
    more = [random_unit(np.random.default_rng(9)) for _ in range(5)]
    store.write(WriteBatch(episodes=[EpisodicRecord(f"E-x{i}", "p0", 1e9, z, "q", "a") for i, z in enumerate(more)]))
    want = results(store, zs + more)
    store.close()
    shutil.rmtree(tmp_path / "s" / "index")
    shutil.copytree(tmp_path / "old-index", tmp_path / "s" / "index")  # simulate a crash before the save
    store = with_codec(SqliteStore.open(tmp_path / "s"))
    assert results(store, zs + more) == want
    store.close()
    other, _ = make(tmp_path / "other", 15, seed=5)
    other.close()
    shutil.rmtree(tmp_path / "s" / "index")
    shutil.copytree(tmp_path / "other" / "index", tmp_path / "s" / "index")
    store = with_codec(SqliteStore.open(tmp_path / "s"))
    assert results(store, zs + more) == want
    store.close()


def test_corrupt_index_file_is_rebuilt(tmp_path: Path) -> None:
    """Garbage in the FAISS file is ignored and the cache rebuilt."""
    store, zs = make(tmp_path / "s", 12)
    want = results(store, zs)
    store.close()
    (tmp_path / "s" / "index" / "episodic.faiss").write_bytes(b"garbage")
    store = with_codec(SqliteStore.open(tmp_path / "s"))
    assert results(store, zs) == want
    store.close()


def test_directories_that_are_not_stores_are_refused(tmp_path: Path) -> None:
    """Opening an empty dir, a file, or a non-msm-mem SQLite file raises StoreError."""
    with pytest.raises(StoreError, match="not an msm-mem store"):
        SqliteStore.open(tmp_path)
    (tmp_path / "msm-mem.sqlite").write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError):
        SqliteStore.open(tmp_path)
    import sqlite3

    other = tmp_path / "other"
    other.mkdir()
    sqlite3.connect(other / "msm-mem.sqlite").execute("CREATE TABLE meta(key TEXT, value TEXT)").connection.commit()
    with pytest.raises(StoreError):
        SqliteStore.open(other)
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreError):
        SqliteStore.create(tmp_path / "file", dim=4, encoder="t")


def test_create_refuses_an_existing_store(tmp_path: Path) -> None:
    """init twice on one directory fails without touching the first store."""
    store, _ = make(tmp_path / "s", 3)
    store.close()
    with pytest.raises(StoreError, match="already holds a store"):
        SqliteStore.create(tmp_path / "s", dim=16, encoder="t")
    assert SqliteStore.open(tmp_path / "s").count("episodic") == 3


def _state(
    sid: str, version: int, text: str, supersedes: str | None = None, category: str = "impression"
) -> SemanticState:
    return SemanticState(sid, "P1", category, (Impression(1e9 + version, text, ""),), version, supersedes=supersedes)


def test_a_chain_of_versions_in_one_batch(tmp_path: Path) -> None:
    """Versions chained inside one batch, in any order: the head is active, in cache and store."""
    store = with_codec(SqliteStore.create(tmp_path / "s", dim=4, encoder="t"))
    store.write(WriteBatch(semantic=[_state("S-1", 1, "a")]))
    assert store.semantic_active("P1")[0].state_id == "S-1"
    store.write(WriteBatch(semantic=[_state("S-3", 3, "c", supersedes="S-2"), _state("S-2", 2, "b", supersedes="S-1")]))
    assert [s.state_id for s in store.semantic_active("P1")] == ["S-3"]
    history = {s.state_id: s.state for s in store.semantic_history("P1", "impression")}
    assert history == {"S-1": State.SUPERSEDED, "S-2": State.SUPERSEDED, "S-3": State.ACTIVE}
    twice = [_state("S-4", 4, "d", supersedes="S-3"), _state("S-5", 5, "e", supersedes="S-3")]
    with pytest.raises(IllegalTransition, match="superseded twice"):
        store.write(WriteBatch(semantic=twice))
    with pytest.raises(IllegalTransition, match="not the active version"):
        store.write(WriteBatch(semantic=[_state("S-6", 4, "f", supersedes="S-2")]))
    with pytest.raises(IllegalTransition, match="not the active version"):
        store.write(WriteBatch(semantic=[_state("S-7", 4, "g", supersedes="S-3", category="other")]))
    assert [s.state_id for s in store.semantic_active("P1")] == ["S-3"]


def test_a_closed_store_refuses_searches(tmp_path: Path) -> None:
    """search and search_many on a closed store raise StoreError, in every scope."""
    store, zs = make(tmp_path / "s", 4)
    store.close()
    for scope in ("p0", None):
        with pytest.raises(StoreError, match="closed"):
            store.search_many(zs[0], [("episodic", 1), ("visual", 1)], scope)
        with pytest.raises(StoreError, match="closed"):
            store.search("episodic", zs[0], 1, scope)


def test_searches_running_alongside_writes_stay_exact(tmp_path: Path) -> None:
    """Threads searching one patient while another thread appends to it see whole, exact answers."""
    store, zs = make(tmp_path / "s", 12)  # p0 holds 3 before the writer starts: a search never races it
    rng = np.random.default_rng(7)
    extra = [random_unit(rng) for _ in range(200)]
    errors: list[BaseException] = []

    def write() -> None:
        for i, z in enumerate(extra):
            store.write(WriteBatch(episodes=[EpisodicRecord(f"E-w{i}", "p0", 1e9, z, "q", "a")]))

    def search() -> None:
        try:
            for z in extra[::5]:
                got = store.search_many(z, [("episodic", 3), ("visual", 3)], "p0")
                assert len(got[0]) == 3 and got[1] == []
                assert [s for _, s in got[0]] == sorted((s for _, s in got[0]), reverse=True)
        except BaseException as exc:  # reported in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=write), *(threading.Thread(target=search) for _ in range(3))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    z = extra[-1]
    got = store.search("episodic", z, 3, "p0")
    assert got[0][0] == f"E-w{len(extra) - 1}" and got[0][1] == pytest.approx(1.0, abs=1e-5)
    store.close()

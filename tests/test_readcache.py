"""The embedded store's cache of decoded active semantic states and entities stays exact."""

from __future__ import annotations

from pathlib import Path

import pytest

from msm_mem import IllegalTransition, Impression, SemanticState
from msm_mem._governance.codec import SHREDDED, EnvelopeCodec
from msm_mem._governance.crypto import EnvelopeCipher
from msm_mem._records import State
from msm_mem._storage.base import StateChange, WriteBatch
from msm_mem._storage.sqlite import SqliteStore
from msm_mem._tier_records import Entity
from msm_mem.testing import InMemoryKeyProvider
from tests.conftest import ROW_KEY, with_codec


def state(
    sid: str, version: int, text: str, supersedes: str | None = None, category: str = "impression", patient: str = "P1"
) -> SemanticState:
    return SemanticState(
        sid,
        patient,
        category,
        (Impression(1e9 + version, text, ""),),
        version,
        created_at=1e9 + version,
        supersedes=supersedes,
    )


def encrypted(path: Path) -> SqliteStore:
    store = SqliteStore.create(path, dim=4, encoder="t")
    cipher = EnvelopeCipher(store.store_id, InMemoryKeyProvider(), store.keys())
    store.use_codec(EnvelopeCodec(cipher, store.keys()))
    store.use_row_key(ROW_KEY)
    return store


def test_own_writes_update_the_cached_state_and_entities(tmp_path: Path) -> None:
    """After a read fills the cache, later writes of this handle show at once, in store order."""
    store = with_codec(SqliteStore.create(tmp_path / "s", dim=4, encoder="t"))
    store.write(WriteBatch(semantic=[state("S-1", 1, "old"), state("S-x", 1, "other", category="b")]))
    store.write(WriteBatch(entities=[Entity("N-1", "P1", "finding", "Edema", 5.0)]))
    assert [s.state_id for s in store.semantic_active("P1")] == ["S-x", "S-1"]  # by category
    assert [e.entity_id for e in store.entities("P1")] == ["N-1"]
    store.write(
        WriteBatch(
            semantic=[state("S-2", 2, "new", supersedes="S-1")],
            entities=[Entity("N-2", "P1", "finding", "Mass", 5.0), Entity("N-0", "P1", "finding", "Nodule", 1.0)],
        )
    )
    assert [s.state_id for s in store.semantic_active("P1")] == ["S-x", "S-2"]
    assert [s.state_id for s in store.semantic_active("P1", "impression")] == ["S-2"]
    cached = [e.entity_id for e in store.entities("P1")]
    store.close()
    reopened = with_codec(SqliteStore.open(tmp_path / "s"))
    assert cached == [e.entity_id for e in reopened.entities("P1")] == ["N-0", "N-1", "N-2"]
    assert [s.state_id for s in reopened.semantic_active("P1")] == ["S-x", "S-2"]
    reopened.close()


def test_a_failed_write_leaves_the_cache_as_the_store(tmp_path: Path) -> None:
    """A batch that rolls back (a stale supersession) changes neither the store nor the cache."""
    store = with_codec(SqliteStore.create(tmp_path / "s", dim=4, encoder="t"))
    store.write(WriteBatch(semantic=[state("S-1", 1, "old")]))
    assert store.semantic_active("P1")[0].state_id == "S-1"
    bad = WriteBatch(
        semantic=[state("S-2", 2, "new", supersedes="S-missing")],
        entities=[Entity("N-1", "P1", "finding", "Edema", 5.0)],
    )
    with pytest.raises(IllegalTransition):
        store.write(bad)
    assert [s.state_id for s in store.semantic_active("P1")] == ["S-1"]
    assert store.entities("P1") == []
    store.close()


def test_another_connection_s_commit_is_seen(tmp_path: Path) -> None:
    """A write through a second handle (the CLI while a server runs) empties the first one's cache."""
    first = with_codec(SqliteStore.create(tmp_path / "s", dim=4, encoder="t"))
    first.write(WriteBatch(semantic=[state("S-1", 1, "old")]))
    assert first.semantic_active("P1")[0].state_id == "S-1"
    assert first.entities("P1") == []
    second = with_codec(SqliteStore.open(tmp_path / "s"))
    second.write(
        WriteBatch(
            semantic=[state("S-2", 2, "new", supersedes="S-1")], entities=[Entity("N-1", "P1", "finding", "Edema", 5.0)]
        )
    )
    assert first.semantic_active("P1")[0].state_id == "S-2"
    assert [e.name for e in first.entities("P1")] == ["Edema"]
    second.close()
    first.close()


def test_state_changes_are_followed(tmp_path: Path) -> None:
    """A state change in a batch (decay, retraction) empties the cache: reads see the new state."""
    store = with_codec(SqliteStore.create(tmp_path / "s", dim=4, encoder="t"))
    store.write(WriteBatch(semantic=[state("S-1", 1, "old")]))
    assert len(store.semantic_active("P1")) == 1
    change = StateChange("semantic", "S-1", State.ACTIVE, State.RETRACTED, fields=(("impressions", ""),))
    store.write(WriteBatch(changes=[change]))
    assert store.semantic_active("P1") == []
    store.close()


def test_shredding_drops_cached_plaintext(tmp_path: Path) -> None:
    """Once a patient's key is shredded, cached names and impressions are no longer served."""
    store = encrypted(tmp_path / "s")
    store.write(
        WriteBatch(
            semantic=[state("S-1", 1, "Right pleural effusion.")],
            entities=[Entity("N-1", "P1", "finding", "Effusion", 5.0)],
        )
    )
    assert store.entities("P1")[0].name == "Effusion"
    assert store.semantic_active("P1")[0].impressions[0].text == "Right pleural effusion."
    store.keys().shred("P1")
    assert store.entities("P1")[0].name == SHREDDED
    assert store.semantic_active("P1")[0].impressions == ()
    store.close()


def test_reads_return_copies(tmp_path: Path) -> None:
    """A caller changing the list it got does not change what the next reader gets."""
    store = with_codec(SqliteStore.create(tmp_path / "s", dim=4, encoder="t"))
    store.write(WriteBatch(entities=[Entity("N-1", "P1", "finding", "Edema", 5.0)]))
    store.entities("P1").clear()
    store.semantic_active("P1").append(state("S-9", 9, "x"))
    assert [e.entity_id for e in store.entities("P1")] == ["N-1"]
    assert store.semantic_active("P1") == []
    store.close()

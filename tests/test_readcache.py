"""The embedded store's cache of decoded rows (active semantic states and entities per patient,
episodic and visual records by id) stays exact."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from msm_mem import EpisodicRecord, IllegalTransition, Impression, NotFound, SemanticState, VisualRecord
from msm_mem._governance.crypto import EnvelopeCipher
from msm_mem._governance.envelope_codec import SHREDDED, EnvelopeCodec
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


def encrypted(path: Path, provider: InMemoryKeyProvider | None = None) -> SqliteStore:
    """A new store at ``path`` (or the one there, given the provider of its keys), encrypting."""
    store = SqliteStore.create(path, dim=4, encoder="t") if provider is None else SqliteStore.open(path)
    cipher = EnvelopeCipher(store.store_id, provider or InMemoryKeyProvider(), store.keys())
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


def _episode(i: int, patient: str = "P1") -> EpisodicRecord:
    z = np.zeros(4, np.float32)
    z[i % 4] = 1.0
    return EpisodicRecord(f"E-{i}", patient, 1e9 + i, z, "q?", f"answer {i}", study_id=f"s{i}")


def _visual(i: int) -> VisualRecord:
    z = np.zeros(4, np.float32)
    z[i % 4] = 1.0
    return VisualRecord(f"V-{i}", "P1", 1e9 + i, z, visual_tag=f"tag {i}", source_episode_id=f"E-{i}")


def _statements(store: SqliteStore) -> list[str]:
    seen: list[str] = []
    store._conn.set_trace_callback(seen.append)
    return seen


def _selects(seen: list[str], table: str) -> int:
    return sum(1 for s in seen if s.lstrip().upper().startswith("SELECT") and f"FROM {table} " in s + " ")


def test_records_read_again_are_served_decoded(tmp_path: Path) -> None:
    """Episodic and visual records are read and decrypted once; a later read of the same ids
    (a retrieve's hits) reads no row, and only the ids not yet cached are read."""
    store = encrypted(tmp_path / "s")
    store.write(WriteBatch(episodes=[_episode(1), _episode(2)], visuals=[_visual(1)]))
    seen = _statements(store)
    assert [e.answer for e in store.get_episodes(["E-1"])] == ["answer 1"]
    assert [v.visual_tag for v in store.get_visuals(["V-1"])] == ["tag 1"]
    assert (_selects(seen, "episodic"), _selects(seen, "visual")) == (1, 1)
    assert [e.answer for e in store.get_episodes(["E-2", "E-1", "E-1"])] == ["answer 2", "answer 1", "answer 1"]
    assert [e.answer for e in store.get_episodes(["E-1", "E-1"])] == ["answer 1", "answer 1"]
    assert set(store.find_episodes(["E-1", "E-missing"])) == {"E-1"}
    assert [v.visual_tag for v in store.get_visuals(["V-1"])] == ["tag 1"]
    assert (_selects(seen, "episodic"), _selects(seen, "visual")) == (3, 1)  # E-2, then E-missing
    assert "E-missing" in str(pytest.raises(NotFound, store.get_episodes, ["E-1", "E-missing"]).value)
    seen.clear()
    assert [e.episode_id for e in store.study_episodes("P1", "s2")] == ["E-2"]  # a stored study's lookup
    assert [s for s in seen if "SELECT *" in s] == []  # its id only: the record was cached
    store.close()


def test_cached_records_follow_state_changes_here_and_elsewhere(tmp_path: Path) -> None:
    """A record superseded by this handle, or retracted and renamed in place by another one, is read
    anew."""
    provider = InMemoryKeyProvider()
    store = SqliteStore.create(tmp_path / "s", dim=4, encoder="t")
    store.close()
    store = encrypted(tmp_path / "s", provider)
    store.write(WriteBatch(episodes=[_episode(1), _episode(2)]))
    assert [e.state for e in store.get_episodes(["E-1", "E-2"])] == [State.ACTIVE, State.ACTIVE]
    store.write(WriteBatch(changes=[StateChange("episodic", "E-1", State.ACTIVE, State.SUPERSEDED)]))
    assert store.get_episodes(["E-1"])[0].state == State.SUPERSEDED
    other = encrypted(tmp_path / "s", provider)
    scrubbed = tuple((name, "") for name in ("question", "answer", "decision", "media_path", "media_description"))
    retract = StateChange(
        "episodic", "E-2", State.ACTIVE, State.RETRACTED, new_id="E-anon", new_patient_id="", fields=scrubbed
    )
    other.write(WriteBatch(changes=[retract]))
    other.close()
    assert store.find_episodes(["E-2"]) == {}
    anonymous = store.get_episodes(["E-anon"])[0]
    assert (anonymous.state, anonymous.patient_id, anonymous.answer) == (State.RETRACTED, "", "")
    store.close()


def test_shredding_drops_cached_records(tmp_path: Path) -> None:
    """Once a patient's key is shredded, a cached record's plaintext is no longer served."""
    store = encrypted(tmp_path / "s")
    store.write(WriteBatch(episodes=[_episode(1)], visuals=[_visual(1)]))
    assert store.get_episodes(["E-1"])[0].answer == "answer 1"
    assert store.get_visuals(["V-1"])[0].visual_tag == "tag 1"
    store.keys().shred("P1")
    assert store.get_episodes(["E-1"])[0].answer == SHREDDED
    assert store.get_visuals(["V-1"])[0].visual_tag == SHREDDED
    store.close()


def test_records_read_inside_a_transaction_are_not_kept(tmp_path: Path) -> None:
    """What a transaction reads may be rolled back: it neither fills nor is served from the cache."""
    store = encrypted(tmp_path / "s")
    store.write(WriteBatch(episodes=[_episode(1)]))
    assert store.get_episodes(["E-1"])[0].state == State.ACTIVE
    seen = _statements(store)
    with pytest.raises(RuntimeError, match="rolled back"), store._db(), store._sql.transaction():
        store._sql.q("UPDATE episodic SET state = 'superseded' WHERE id = 'E-1'")
        assert store.get_episodes(["E-1"])[0].state == State.SUPERSEDED
        raise RuntimeError("rolled back")
    assert store.get_episodes(["E-1"])[0].state == State.ACTIVE
    assert _selects(seen, "episodic") == 1  # the read inside; the one after is the cached record
    store.close()

"""A store holds PHI only through an encrypting codec: with none set it refuses every PHI field,
and it refuses a codec that does not encrypt (every backend)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from msm_mem import EpisodicRecord, StmPayload, StoreError
from msm_mem._storage.base import Store, WriteBatch
from msm_mem._storage.sqlite import SqliteStore
from msm_mem._tier_records import AuditRow, Claim, StmItem
from tests.conftest import random_unit

Reopen = Callable[..., Store]


class Identity:
    """Stores fields as given, and says so."""

    encrypting = False

    def encode(self, table: str, record_id: str, field: str, patient_id: str, value: str) -> str:
        return value

    def decode(self, table: str, record_id: str, field: str, patient_id: str, value: str) -> str:
        return value


class Undeclared:
    """Stores fields as given and says nothing about encryption."""

    def encode(self, table: str, record_id: str, field: str, patient_id: str, value: str) -> str:
        return value

    def decode(self, table: str, record_id: str, field: str, patient_id: str, value: str) -> str:
        return value


def episode(i: int) -> EpisodicRecord:
    return EpisodicRecord(f"E-{i}", "p", 1e9, random_unit(np.random.default_rng(i)), "q?", "a")


def test_no_codec_no_phi_written(reopen: Reopen, store: Store) -> None:
    """Without a codec, every batch holding a PHI field is refused and nothing is written."""
    bare = reopen(store, codec=False)
    stm = StmItem("M-1", "p", "interaction", StmPayload("q", 1.0), 1.0, 2.0)
    claim = Claim("C-1", "p", "finding", "content", "agent", 0.5, "agent", 1.0)
    for batch in (
        WriteBatch(episodes=[episode(1)], audit=[AuditRow(1, b"a", "1" * 64)]),
        WriteBatch(stm=[stm]),
        WriteBatch(claims=[claim]),
    ):
        with pytest.raises(StoreError, match="no codec: call use_codec"):
            bare.write(batch)
    assert store.count("episodic") == 0 and store.stm_list() == [] and store.claims_active("p") == []
    assert store.audit_head()[0] == 0


def test_no_codec_no_phi_read(reopen: Reopen, store: Store) -> None:
    """Without a codec, PHI reads are refused; ids, counts, vectors and audit rows still read."""
    e = episode(1)
    store.write(WriteBatch(episodes=[e], audit=[AuditRow(1, b"a", "1" * 64)]))
    bare = reopen(store, codec=False)
    with pytest.raises(StoreError, match="episodic.question is patient data"):
        bare.get_episodes(["E-1"])
    with pytest.raises(StoreError, match="no codec"):
        list(bare.iter_episodes())
    assert bare.count("episodic") == 1 and bare.record_ids("episodic", "p") == ["E-1"]
    assert bare.search("episodic", e.z, 1, "p")[0][0] == "E-1" and bare.audit_head()[0] == 1
    assert reopen(store).get_episodes(["E-1"]) == [e]  # the same rows, through the envelope codec


@pytest.mark.parametrize("codec", [Identity(), Undeclared()], ids=["says-plain", "says-nothing"])
def test_a_codec_that_does_not_encrypt_is_refused(reopen: Reopen, store: Store, codec: object) -> None:
    """use_codec refuses a codec not declaring itself encrypting; the store still refuses PHI."""
    bare = reopen(store, codec=False)
    with pytest.raises(StoreError, match="not an encrypting codec"):
        bare.use_codec(codec)  # type: ignore[arg-type]
    with pytest.raises(StoreError, match="no codec"):
        bare.write(WriteBatch(episodes=[episode(1)]))


def test_a_plain_codec_is_refused_at_creation(tmp_path: Path) -> None:
    """create refuses a plain codec too (it is checked wherever a codec is given)."""
    with pytest.raises(StoreError, match="not an encrypting codec"):
        SqliteStore.create(tmp_path / "s", dim=4, encoder="t", codec=Identity())  # type: ignore[arg-type]

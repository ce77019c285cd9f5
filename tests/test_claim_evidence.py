"""Tests of study claims as evidence (msm_mem._memory.claim_evidence): which claims a query
reads, and in what order."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from msm_mem import ManifestRow
from msm_mem._memory import claims
from msm_mem._memory.claim_evidence import claim_hits, study_of
from tests.conftest import MemFactory
from tests.helpers import INGEST, png
from tests.layers import layers_of

DAY = 86_400.0
Y2020 = 1_590_000_000.0


def _ascending_ids() -> Iterator[str]:
    """Claim ids that sort in the order of their writing (the oldest study's first)."""
    for n in range(1, 1000):
        yield f"C-{n:032x}"


def test_claims_of_equal_cosine_list_the_newer_study_first(
    new_mem: MemFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claims of one image ingested as three studies (equal cosine) come newer study first and,
    of one time, the later study (ingestion's order) first, whatever their ids: the same memory
    ingested again lists them the same way."""
    ids = _ascending_ids()
    monkeypatch.setattr(claims, "new_id", lambda prefix: next(ids))
    mem = new_mem()
    image = str(png(tmp_path, 1))
    when = {"S1": Y2020, "S2": Y2020 + DAY, "S3": Y2020 + DAY}
    rows = [ManifestRow("P1", s, t, image, "Findings?", "Left lower lobe consolidation") for s, t in when.items()]
    assert mem.ingest(INGEST, rows).ingested == 3
    with layers_of(mem) as layers:
        z = layers.store.study_episodes("P1", "S1")[0].z
        hits = claim_hits(layers.store, "P1", z, 10)
    assert len({h.score for h in hits}) == 1
    assert [study_of(h.record) for h in hits] == ["S3", "S2", "S1"]  # type: ignore[arg-type]

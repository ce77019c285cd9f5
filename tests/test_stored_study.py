"""Ask, observe and retrieve given one of the patient's stored studies (``image_study=``) instead
of an image, read inside the one governed call, on both stores: retrieve queries with the
embedding stored with the study, ask and observe use its image file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from msm_mem import ImageError, InvalidInput, ManifestRow, MsmMem, NotFound
from msm_mem.testing import FixedBackbone
from tests.conftest import MemFactory
from tests.helpers import AGENT, SYSTEM, audit_events, png

T0 = 1_600_000_000.0


def _ingested(new_mem: MemFactory, tmp_path: Path) -> MsmMem:
    mem = new_mem(backbone=FixedBackbone("Right lower lobe consolidation, unchanged."))
    rows = [
        ManifestRow(p, f"{p}-S{i}", T0 + i * 86_400, str(png(tmp_path, seed)), "Impression?", f"Finding {seed}.")
        for seed, (p, i) in enumerate([("P1", 0), ("P1", 1), ("P1", 2), ("P2", 0), ("P2", 1)])
    ]
    mem.ingest(SYSTEM, rows)
    return mem


def _ranking(found: object) -> list[tuple[str, float]]:
    return [(i.evidence.id, round(i.evidence.score, 6)) for i in found.items]  # type: ignore[attr-defined]


def test_a_stored_study_ranks_as_its_image_does(new_mem: MemFactory, tmp_path: Path) -> None:
    """Retrieving by a stored study gives the same ranked evidence as the study's image itself,
    and is audited as one read (one event) of that patient."""
    mem = _ingested(new_mem, tmp_path)
    first = len(audit_events(mem._store))
    by_image = mem.retrieve(AGENT, "P1", str(png(tmp_path, 1)), at=T0 + 10 * 86_400)
    before = len(audit_events(mem._store))
    by_study = mem.retrieve(AGENT, "P1", image_study="P1-S1", at=T0 + 10 * 86_400)
    image_events, study_events = audit_events(mem._store)[first:before], audit_events(mem._store)[before:]
    assert _ranking(by_study) == _ranking(by_image) and by_study.items
    assert by_study.items[0].record is not None and by_study.items[0].record.study_id == "P1-S1"
    shape = [(e.action, e.outcome, e.patient) for e in study_events]
    assert shape == [(e.action, e.outcome, e.patient) for e in image_events]
    assert [e.action for e in study_events] == ["consent", "read"]


def test_another_patients_study_is_not_found(new_mem: MemFactory, tmp_path: Path) -> None:
    """A study id of another patient, or of none, is NotFound for this patient; the failure is
    audited and nothing else is written."""
    mem = _ingested(new_mem, tmp_path)
    counts = (mem._store.count("episodic"), mem._store.count("visual"), mem._store.count("semantic"))
    for study in ("P2-S0", "P9-S0"):
        before = len(audit_events(mem._store))
        with pytest.raises(NotFound, match="no stored study"):
            mem.retrieve(AGENT, "P1", image_study=study)
        events = audit_events(mem._store)[before:]
        assert [(e.action, e.outcome, e.reason) for e in events][-1:] == [("turn", "error", "NotFound")]
    assert counts == (mem._store.count("episodic"), mem._store.count("visual"), mem._store.count("semantic"))


@pytest.mark.parametrize(
    ("image", "study", "message"),
    [
        (None, None, "exactly one of image and image_study"),
        (np.zeros((8, 8), np.float32), "P1-S0", "exactly one of image and image_study"),
        (None, "", "image_study must not be blank"),
        (None, "S*", "wildcard"),
        (None, 7, "image_study must be a string"),
        (None, "x" * 500, "longer than"),
    ],
)
def test_retrieve_refuses_a_bad_study_reference(
    new_mem: MemFactory, tmp_path: Path, image: object, study: object, message: str
) -> None:
    """Neither or both of image and study, or a study id that is not an id, is InvalidInput
    before any turn begins (nothing audited)."""
    mem = _ingested(new_mem, tmp_path)
    before = len(audit_events(mem._store))
    with pytest.raises(InvalidInput, match=message):
        mem.retrieve(AGENT, "P1", image, image_study=study)  # type: ignore[arg-type]
    assert len(audit_events(mem._store)) == before


def _shape(events: list[object]) -> list[tuple[str, str]]:
    return [(e.action, e.outcome) for e in events]  # type: ignore[attr-defined]


def test_ask_and_observe_use_the_stored_studys_image(new_mem: MemFactory, tmp_path: Path) -> None:
    """Asking about a stored study answers as asking about its image file does, with the same
    audit events (no separate read of the patient's episodes); an observation of it records
    the study's image file."""
    mem = _ingested(new_mem, tmp_path)
    image = str(png(tmp_path, 1))
    first = len(audit_events(mem._store))
    by_path = mem.ask(AGENT, "P1", image, "Any change?", write_back=False, timestamp=T0 + 9 * 86_400)
    middle = len(audit_events(mem._store))
    by_study = mem.ask(
        AGENT, "P1", None, "Any change?", image_study="P1-S1", write_back=False, timestamp=T0 + 9 * 86_400
    )
    events = audit_events(mem._store)
    assert by_study.answer == by_path.answer
    assert [(e.id, e.score) for e in by_study.evidence] == [(e.id, e.score) for e in by_path.evidence]
    assert _shape(events[middle:]) == _shape(events[first:middle])
    item = mem.observe(AGENT, "P1", None, "Any change?", image_study="P1-S1")
    assert item.payload is not None and item.payload.media_path == image and item.patient_id == "P1"


def test_a_stored_study_without_a_readable_image_file(new_mem: MemFactory, tmp_path: Path) -> None:
    """A study of another patient is NotFound; an image file gone from disk is an ImageError
    that names no path; nothing but the failed turn's audit events is written."""
    mem = _ingested(new_mem, tmp_path)
    with pytest.raises(NotFound):
        mem.ask(AGENT, "P1", None, "Any change?", image_study="P2-S0")
    png(tmp_path, 2).unlink()
    counts = (mem._store.count("episodic"), len(mem._store.stm_list()))
    for call in (
        lambda: mem.ask(AGENT, "P1", None, "Any change?", image_study="P1-S2"),
        lambda: mem.observe(AGENT, "P1", None, "Any change?", image_study="P1-S2"),
    ):
        with pytest.raises(ImageError) as caught:
            call()
        assert str(tmp_path) not in str(caught.value) and "cannot be read" in str(caught.value)
    assert counts == (mem._store.count("episodic"), len(mem._store.stm_list()))
    with pytest.raises(InvalidInput, match="exactly one of image and image_study"):
        mem.observe(AGENT, "P1", str(png(tmp_path, 1)), "Any change?", image_study="P1-S1")

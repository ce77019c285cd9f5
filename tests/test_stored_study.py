"""Ask, observe and retrieve given one of the patient's stored studies (``image_study=``) instead
of an image, read inside the one governed call, on both stores: retrieve queries with the
embedding stored with the study, ask and observe use its image file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from msm_mem import ImageError, InvalidInput, ManifestRow, MsmMem, NotFound
from msm_mem.datasets.registry import load_dataset
from msm_mem.testing import FixedBackbone
from tests.conftest import MemFactory
from tests.helpers import AGENT, SYSTEM, audit_events, png
from tests.layers import Views


@pytest.fixture
def views() -> Iterator[Views]:
    """Handles of their own on the stores a test opens (``tests/layers.py``), closed after it."""
    with Views() as opened:
        yield opened


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
    first = len(audit_events(mem))
    by_image = mem.retrieve(AGENT, "P1", str(png(tmp_path, 1)), at=T0 + 10 * 86_400)
    before = len(audit_events(mem))
    by_study = mem.retrieve(AGENT, "P1", image_study="P1-S1", at=T0 + 10 * 86_400)
    image_events, study_events = audit_events(mem)[first:before], audit_events(mem)[before:]
    assert _ranking(by_study) == _ranking(by_image) and by_study.items
    assert by_study.items[0].record is not None and by_study.items[0].record.study_id == "P1-S1"
    shape = [(e.action, e.outcome, e.patient) for e in study_events]
    assert shape == [(e.action, e.outcome, e.patient) for e in image_events]
    assert [e.action for e in study_events] == ["consent", "read"]


def test_another_patients_study_is_not_found(new_mem: MemFactory, tmp_path: Path, views: Views) -> None:
    """A study id of another patient, or of none, is NotFound for this patient; the failure is
    audited and nothing else is written."""
    mem = _ingested(new_mem, tmp_path)
    counts = (views(mem).store.count("episodic"), views(mem).store.count("visual"), views(mem).store.count("semantic"))
    for study in ("P2-S0", "P9-S0"):
        before = len(audit_events(mem))
        with pytest.raises(NotFound, match="no stored study"):
            mem.retrieve(AGENT, "P1", image_study=study)
        events = audit_events(mem)[before:]
        assert [(e.action, e.outcome, e.reason) for e in events][-1:] == [("turn", "error", "NotFound")]
    assert counts == (
        views(mem).store.count("episodic"),
        views(mem).store.count("visual"),
        views(mem).store.count("semantic"),
    )


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
    before = len(audit_events(mem))
    with pytest.raises(InvalidInput, match=message):
        mem.retrieve(AGENT, "P1", image, image_study=study)  # type: ignore[arg-type]
    assert len(audit_events(mem)) == before


def _shape(events: list[object]) -> list[tuple[str, str]]:
    return [(e.action, e.outcome) for e in events]  # type: ignore[attr-defined]


def test_ask_and_observe_use_the_stored_studys_image(new_mem: MemFactory, tmp_path: Path) -> None:
    """Asking about a stored study answers as asking about its image file does, with the same
    audit events (no separate read of the patient's episodes); an observation of it records
    the study's image file."""
    mem = _ingested(new_mem, tmp_path)
    image = str(png(tmp_path, 1))
    first = len(audit_events(mem))
    by_path = mem.ask(AGENT, "P1", image, "Any change?", write_back=False, timestamp=T0 + 9 * 86_400)
    middle = len(audit_events(mem))
    by_study = mem.ask(
        AGENT, "P1", None, "Any change?", image_study="P1-S1", write_back=False, timestamp=T0 + 9 * 86_400
    )
    events = audit_events(mem)
    assert by_study.answer == by_path.answer
    assert [(e.id, e.score) for e in by_study.evidence] == [(e.id, e.score) for e in by_path.evidence]
    assert _shape(events[middle:]) == _shape(events[first:middle])
    item = mem.observe(AGENT, "P1", None, "Any change?", image_study="P1-S1")
    assert item.payload is not None and item.payload.media_path == image and item.patient_id == "P1"


def test_a_stored_study_without_a_readable_image_file(new_mem: MemFactory, tmp_path: Path, views: Views) -> None:
    """A study of another patient is NotFound; an image file gone from disk is an ImageError
    naming the stored path and how it was resolved; nothing but the failed turn's audit events
    is written."""
    mem = _ingested(new_mem, tmp_path)
    with pytest.raises(NotFound):
        mem.ask(AGENT, "P1", None, "Any change?", image_study="P2-S0")
    gone = png(tmp_path, 2)
    gone.unlink()
    counts = (views(mem).store.count("episodic"), len(views(mem).store.stm_list()))
    for call in (
        lambda: mem.ask(AGENT, "P1", None, "Any change?", image_study="P1-S2"),
        lambda: mem.observe(AGENT, "P1", None, "Any change?", image_study="P1-S2"),
    ):
        with pytest.raises(ImageError) as caught:
            call()
        message = str(caught.value)
        assert "cannot be read" in message and f"stored as the absolute path {str(gone)!r}" in message
    assert counts == (views(mem).store.count("episodic"), len(views(mem).store.stm_list()))
    with pytest.raises(InvalidInput, match="exactly one of image and image_study"):
        mem.observe(AGENT, "P1", str(png(tmp_path, 1)), "Any change?", image_study="P1-S1")


# the query's clinical time -----------------------------------------------------------------------


def test_a_stored_study_is_retrieved_at_its_own_time(new_mem: MemFactory, tmp_path: Path) -> None:
    """Without ``at``, retrieve by a stored study scores freshness at that study's time (as
    ``at=<the study's time>`` does), not at now; an explicit ``at`` still wins."""
    mem = _ingested(new_mem, tmp_path)
    own_time = mem.retrieve(AGENT, "P1", image_study="P1-S1")
    explicit = mem.retrieve(AGENT, "P1", image_study="P1-S1", at=T0 + 86_400)
    assert _ranking(own_time) == _ranking(explicit)
    same_study = [i for i in own_time.items if i.record is not None and getattr(i.record, "study_id", "") == "P1-S1"]
    assert same_study and all(i.evidence.freshness == pytest.approx(1.0) for i in same_study)
    later = mem.retrieve(AGENT, "P1", image_study="P1-S1", at=T0 + 4 * 365 * 86_400)
    assert max(i.evidence.freshness for i in later.items) < 0.9


@pytest.mark.parametrize("at", [float("nan"), float("inf"), "2020-01-01", True, 1e300])
def test_an_unusable_query_time_is_refused(new_mem: MemFactory, tmp_path: Path, at: object) -> None:
    """``at`` that is not a finite number of UTC seconds within the years 1-9999 is InvalidInput."""
    mem = _ingested(new_mem, tmp_path)
    with pytest.raises(InvalidInput, match="at "):
        mem.retrieve(AGENT, "P1", image_study="P1-S1", at=at)  # type: ignore[arg-type]


def test_a_query_time_in_the_future_is_refused(new_mem: MemFactory, tmp_path: Path) -> None:
    """A query asked from the future (beyond the allowed clock skew) is InvalidInput; a few
    seconds ahead of the store's clock is accepted."""
    mem = _ingested(new_mem, tmp_path)
    with pytest.raises(InvalidInput, match="future"):
        mem.retrieve(AGENT, "P1", image_study="P1-S1", at=mem.now() + 86_400)
    assert mem.retrieve(AGENT, "P1", image_study="P1-S1", at=mem.now() + 10).items


def test_asking_about_a_stored_study_is_about_that_study(new_mem: MemFactory, tmp_path: Path) -> None:
    """``ask`` with ``image_study`` alone files the question under that study at its time; a
    different ``study_id`` beside it is refused before anything is read or written."""
    mem = _ingested(new_mem, tmp_path)
    answer = mem.ask(AGENT, "P1", None, "Any change?", image_study="P1-S2")
    items = mem.stm_items(AGENT, "P1")
    asked = [i for i in items if i.payload is not None and i.payload.question == "Any change?"]
    assert asked and asked[0].payload is not None
    assert asked[0].payload.study_id == "P1-S2" and asked[0].payload.timestamp == T0 + 2 * 86_400
    assert answer.evidence
    with pytest.raises(InvalidInput, match="differs from image_study"):
        mem.ask(AGENT, "P1", None, "Any change?", image_study="P1-S2", study_id="P1-S0")


@pytest.mark.shared
def test_an_archived_study_of_the_shared_data_scores_as_it_did_then(new_mem: MemFactory) -> None:
    """A 2014 study of the real covid-cxr set, asked about by its stored study alone: its own
    evidence scores as it did that day (freshness 1, score above 0), not as an eleven-year-old
    record would today."""
    folder = Path(__file__).resolve().parents[2] / "shared" / "data" / "covid-cxr"
    if not (folder / "metadata.csv").is_file():
        pytest.skip("../shared/data/covid-cxr absent")
    rows, _ = load_dataset("covid-cxr", folder)
    patient = [r for r in rows if r.patient_id == "covid-100"]
    study = patient[0].study_id
    assert patient and patient[0].timestamp < 1_420_070_400.0  # before 2015
    mem = new_mem()
    mem.ingest(SYSTEM, patient)
    answer = mem.ask(AGENT, "covid-100", None, patient[0].question, image_study=study, write_back=False)
    assert answer.evidence and max(e.score for e in answer.evidence) > 0.5
    found = mem.retrieve(AGENT, "covid-100", image_study=study)
    own = [i for i in found.items if i.record is not None and getattr(i.record, "study_id", "") == study]
    assert own and all(i.evidence.freshness == pytest.approx(1.0) for i in own)
    assert all(i.evidence.score > 0.5 for i in own)


def test_a_relative_stored_path_resolves_against_the_recorded_image_root(
    new_mem: MemFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A study stored with a relative image path (as older stores hold them) is read from the
    working directory until the store records an image root; from then on it is read from
    under that root, from any working directory; the error before names the path and where it
    was looked for."""
    from msm_mem._media import set_image_root

    mem = new_mem(backbone=FixedBackbone("Right lower lobe consolidation, unchanged."))
    data, elsewhere = tmp_path / "data", tmp_path / "elsewhere"
    data.mkdir()
    elsewhere.mkdir()
    png(data, 7)
    monkeypatch.chdir(data)
    mem.ingest(SYSTEM, [ManifestRow("P1", "S7", T0, "img7.png", "Impression?", "Finding.")])
    assert mem.ask(AGENT, "P1", None, "Any change?", image_study="S7", write_back=False).answer
    monkeypatch.chdir(elsewhere)
    with pytest.raises(ImageError) as caught:
        mem.ask(AGENT, "P1", None, "Any change?", image_study="S7", write_back=False)
    assert "stored as 'img7.png'" in str(caught.value) and f"working directory {elsewhere}" in str(caught.value)
    set_image_root(mem.directory, data)
    at = T0 + 86_400
    by_study = mem.ask(AGENT, "P1", None, "Any change?", image_study="S7", write_back=False, timestamp=at)
    by_path = mem.ask(AGENT, "P1", str(data / "img7.png"), "Any change?", write_back=False, timestamp=at)
    assert [(e.id, e.score) for e in by_study.evidence] == [(e.id, e.score) for e in by_path.evidence]
    item = mem.observe(AGENT, "P1", None, "Any change?", image_study="S7")
    assert item.payload is not None and item.payload.media_path == "img7.png"  # recorded as stored

"""Tests of the paged reads of msm_mem._api.reads: a page holds what was asked for, knows the
whole read's size, and its audit event names the page's records only."""

from __future__ import annotations

from pathlib import Path

import pytest

from msm_mem import ConsentRecord, InvalidInput, ManifestRow, MsmMem, RecordPage
from tests.conftest import MemFactory
from tests.helpers import ADMIN, AGENT, AUDITOR, INGEST, audit_events, png

STUDIES = 5


@pytest.fixture
def mem(new_mem: MemFactory, tmp_path: Path) -> MsmMem:
    m: MsmMem = new_mem()
    images = tmp_path / "images"
    images.mkdir()
    rows = [
        ManifestRow("P1", f"S{i}", 1_600_000_000.0 + i * 86_400, str(png(images, i)), "Impression?", "Clear lungs.")
        for i in range(STUDIES)
    ]
    m.ingest(INGEST, rows)
    return m


def _last_read(mem: MsmMem) -> tuple[str, ...]:
    reads = [e for e in audit_events(mem) if e.action == "read" and e.actor == AGENT.id]
    return reads[-1].record_ids


def test_a_page_holds_its_slice_and_the_read_total(mem: MsmMem) -> None:
    """offset and limit choose the slice of the whole read; total and next_offset describe it."""
    every = mem.episodes(AGENT, "P1")
    assert isinstance(every, RecordPage) and every.total == STUDIES == len(every) and every.next_offset is None
    page = mem.episodes(AGENT, "P1", offset=1, limit=2)
    assert [e.episode_id for e in page] == [e.episode_id for e in every[1:3]]
    assert (page.offset, page.total, page.next_offset) == (1, STUDIES, 3)
    last = mem.episodes(AGENT, "P1", offset=4, limit=2)
    assert len(last) == 1 and last.next_offset is None
    beyond = mem.visuals(AGENT, "P1", offset=STUDIES + 3, limit=2)
    assert list(beyond) == [] and beyond.total == STUDIES and beyond.next_offset is None


def test_the_audit_event_names_the_page_only(mem: MsmMem) -> None:
    """A paged read's audit event names exactly the records of the page, not the whole list."""
    page = mem.episodes(AGENT, "P1", offset=2, limit=2)
    assert _last_read(mem) == tuple(e.episode_id for e in page) and len(page) == 2
    visuals = mem.visuals(AGENT, "P1", limit=1)
    assert _last_read(mem) == (visuals[0].visual_id,)
    history = mem.semantic_history(AGENT, "P1", offset=1, limit=1)
    assert _last_read(mem) == tuple(s.state_id for s in history) and len(history) == 1
    assert history.total == len(mem.semantic_history(AGENT, "P1"))


@pytest.mark.parametrize(("offset", "limit"), [(-1, None), (0, 0), (True, None), (0, 2.5), ("1", 3)])
def test_a_bad_page_is_refused_before_anything_is_read(mem: MsmMem, offset: object, limit: object) -> None:
    """A negative or non-integer offset, or a limit under 1, is InvalidInput naming it, and
    leaves no audit event."""
    before = len(audit_events(mem))
    with pytest.raises(InvalidInput, match="offset|limit"):
        mem.claims(AGENT, "P1", offset=offset, limit=limit)  # type: ignore[arg-type]
    assert len(audit_events(mem)) == before


def test_the_consent_list_pages_in_the_read(mem: MsmMem) -> None:
    """consents() pages like the other reads: the slice asked for, the whole list's total, an
    audit event naming the page's consents only, ``within`` keeping the given patients' consents
    and those of every patient, and a bad page refused before anything is read."""
    grants = [ConsentRecord(f"C-P{i}", f"P{i}", "role:clinician", "treatment", "permit", ("*",), 0.0) for i in (2, 3)]
    mem.grant(ADMIN, grants)
    every = mem.consents(ADMIN)
    ids = [c.consent_id for c in every]
    assert isinstance(every, RecordPage) and every.total == len(ids) and {"C-P2", "C-P3"} <= set(ids)
    page = mem.consents(ADMIN, offset=1, limit=2)
    assert [c.consent_id for c in page] == ids[1:3] and (page.offset, page.total) == (1, len(ids))
    (event,) = [e for e in audit_events(mem) if e.action == "consent_list"][-1:]
    assert event.record_ids == tuple(ids[1:3])
    scoped = mem.consents(ADMIN, within=["P2"])
    assert {c.patient_id for c in scoped} <= {"P2", "*"} and "C-P2" in {c.consent_id for c in scoped}
    assert scoped.total == len(scoped) == len([c for c in every if c.patient_id in ("P2", "*")])
    audited = mem.consents(AUDITOR, limit=1)
    assert len(audited) == 1 and audited.total == len(ids) and audited[0].patient_id not in ("P2", "P3")
    before = len(audit_events(mem))
    with pytest.raises(InvalidInput, match="limit"):
        mem.consents(ADMIN, limit=0)
    assert len(audit_events(mem)) == before

"""MsmMem.audit_trail: the audit roles read the whole chain, a care role only its patient's
events after a consent check; pages, the tail, an unreadable event, and the read's own event."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from msm_mem import AccessDenied, AuditEvent, ConsentDenied, InvalidInput, ManifestRow, MsmMem, Principal
from tests.helpers import ADMIN, AUDITOR, CLINICIAN, INGEST, SYSTEM, png, raw_sql

RESEARCHER = Principal("agent-r", "agent", "research")


@pytest.fixture
def mem(tmp_path: Path) -> Iterator[Any]:
    m = MsmMem.init(tmp_path / "store", ADMIN)
    rows = [
        ManifestRow(p, f"S{i}", 1_600_000_000.0 + i, str(png(tmp_path, i)), "What is the impression?", "Clear.")
        for i, p in enumerate(["P1", "P1", "P2"])
    ]
    m.ingest(INGEST, rows)
    m.ask(CLINICIAN, "P1", str(png(tmp_path, 9)), "Any change?")
    yield m
    m.close()


def test_an_auditor_reads_every_event_with_pseudonyms_only(mem: Any) -> None:
    """The whole chain in order, patients as pseudonyms; the read itself is audited."""
    trail = mem.audit_trail(AUDITOR)
    seqs = [e.seq for e in trail.events]
    assert seqs == list(range(1, trail.head_seq + 1)) and trail.next_after is None
    assert all(isinstance(e, AuditEvent) for e in trail.events)
    assert not any(e.patient in ("P1", "P2") for e in trail.events)
    assert {e.patient for e in trail.events if e.patient} and trail.unreadable_seq is None
    assert trail.checkpoints and trail.checkpoints[-1].size == trail.head_seq
    after = mem.audit_trail(AUDITOR, after_seq=trail.head_seq)
    assert [(e.action, e.actor) for e in after.events] == [("audit_read", AUDITOR.id)]


def test_pages_and_the_tail(mem: Any) -> None:
    """``limit`` pages from ``after_seq`` (next_after says where the next page starts); ``tail``
    gives the last ``limit`` events."""
    first = mem.audit_trail(ADMIN, limit=3)
    assert [e.seq for e in first.events] == [1, 2, 3] and first.next_after == 3
    second = mem.audit_trail(ADMIN, after_seq=first.next_after, limit=3)
    assert [e.seq for e in second.events] == [4, 5, 6]
    last = mem.audit_trail(ADMIN, limit=2, tail=True)
    assert [e.seq for e in last.events] == [last.head_seq - 1, last.head_seq]
    for bad in ({"limit": 0}, {"limit": 5001}, {"after_seq": -1}, {"limit": True}):
        with pytest.raises(InvalidInput):
            mem.audit_trail(ADMIN, **bad)


def test_a_care_role_reads_only_its_patients_events(mem: Any) -> None:
    """A clinician names a patient and gets only that patient's events (by its pseudonym),
    after a consent check; without a patient, or for a purpose no consent permits, refused."""
    trail = mem.audit_trail(CLINICIAN, "P1")
    assert trail.events and len({e.patient for e in trail.events}) == 1
    everything = mem.audit_trail(AUDITOR)
    other = {e.patient for e in everything.events if e.patient} - {trail.events[0].patient}
    assert other, "P2 has events of its own"
    assert not other & {e.patient for e in trail.events}
    assert {"consent", "write", "read"} <= {e.action for e in trail.events}
    with pytest.raises(InvalidInput, match="patient_id"):
        mem.audit_trail(CLINICIAN)
    with pytest.raises(InvalidInput, match="pseudonym"):
        mem.audit_trail(AUDITOR, "P1")
    with pytest.raises(ConsentDenied):
        mem.audit_trail(RESEARCHER, "P1")
    with pytest.raises(AccessDenied):
        mem.audit_trail(SYSTEM)
    mine = mem.audit_trail(CLINICIAN, "P1", after_seq=trail.events[-1].seq)
    # the first call's own turn (consent, then the read of the audit tier), the refused researcher
    assert [(e.action, e.outcome) for e in mine.events] == [
        ("consent", "success"),
        ("read", "success"),
        ("consent", "denied"),
    ]
    assert mine.events[1].source_tier == "audit" and mine.events[1].actor == CLINICIAN.id


def test_an_edited_event_stops_the_page_there(mem: Any) -> None:
    """An event whose stored bytes no longer match its hash is named, and the page ends before it."""
    raw_sql(
        mem,
        "UPDATE audit SET payload = CAST(replace(CAST(payload AS TEXT), 'success', 'denied') AS BLOB) WHERE seq = 4",
    )
    trail = mem.audit_trail(AUDITOR)
    assert trail.unreadable_seq == 4 and [e.seq for e in trail.events] == [1, 2, 3]
    assert mem.verify_audit(AUDITOR).first_bad_seq == 4


def test_a_care_roles_view_parses_only_its_patients_events(mem: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A patient's view holds exactly the events of the whole chain that name its pseudonym,
    and only those are parsed: the other patients' events are checked against their hash
    only (a long chain would otherwise be parsed event by event for each such read)."""
    p1 = next(e.patient for e in mem.audit_trail(CLINICIAN, "P1").events)
    whole = mem.audit_trail(AUDITOR)
    expected = [e for e in whole.events if e.patient == p1]
    parsed: list[int] = []
    real = AuditEvent.from_row.__func__  # type: ignore[attr-defined]

    def counting(cls: type[AuditEvent], seq: int, payload: bytes, event_hash: str) -> AuditEvent:
        parsed.append(seq)
        return real(cls, seq, payload, event_hash)  # type: ignore[no-any-return]

    monkeypatch.setattr(AuditEvent, "from_row", classmethod(counting))
    trail = mem.audit_trail(CLINICIAN, "P1")
    assert list(trail.events) == expected and 0 < len(expected) < len(whole.events)
    assert parsed == [e.seq for e in expected]


def test_another_patients_edited_event_stops_a_care_roles_page(mem: Any) -> None:
    """An edited event of another patient (its bytes no longer match its hash) is named in a
    patient's view too, and the page ends before it."""
    p2 = next(e.patient for e in mem.audit_trail(CLINICIAN, "P2").events)
    whole = mem.audit_trail(AUDITOR)
    seq = next(e.seq for e in whole.events if e.patient == p2 and e.outcome == "success")
    raw_sql(
        mem,
        "UPDATE audit SET payload = CAST(replace(CAST(payload AS TEXT), 'success', 'denied') AS BLOB)"
        f" WHERE seq = {seq}",
    )
    trail = mem.audit_trail(CLINICIAN, "P1")
    assert trail.unreadable_seq == seq
    assert trail.events and all(e.seq < seq for e in trail.events)

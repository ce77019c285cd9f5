"""Tests of population memory without identities and PHI at rest (issue 13, items 1 and 8).

Identifiers are seeded into every free-text field (question, answer, decision, report, view) of
many patients; none may reach another patient's answer, evidence, memory, export or log, nor
any file the store writes, before and after decay and shredding.
"""

from __future__ import annotations

import json
import logging
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from msm_mem import ConsentRecord, MsmMem
from msm_mem._agent.agent import AgentAnswer
from msm_mem._governance.deid import find_identifiers
from msm_mem._records import ManifestRow, State, new_id
from msm_mem.testing import FixedClock
from tests.helpers import ADMIN, AGENT, AUDITOR, CRITIC, EXPORTER, INGEST, SYSTEM, png
from tests.layers import Views


@pytest.fixture
def views() -> Iterator[Views]:
    """Handles of their own on the stores a test opens (``tests/layers.py``), closed after it."""
    with Views() as opened:
        yield opened


T0 = 1_700_000_000.0
YEAR = 365.25 * 86400
SOURCES = [f"PX{i}" for i in range(6)]
#: what must never be found outside its own patient's records (and never in clear at rest)
TOKENS = ["Smithers", "Johnathan", "Gonzalez", "Okafor", "8675309", "555-0142", "example.org", "Wallaby", "March 14"]


def _phi(i: int) -> dict[str, str]:
    """Free text of patient ``i``: names with and without a cue, MRN, phone, e-mail, address, date."""
    return {
        "question": f"Johnathan Q. Smithers (MRN: 8675309-{i}) asks on March 14, 2021: any consolidation?",
        "answer": (
            f"Right lower lobe pneumonia, reviewed by Dr. Maria Gonzalez; call 617-555-0142 or "
            f"jq.smithers{i}@example.org; lives at {i + 40} Wallaby Way"
        ),
        "decision": "admit; tell Smithers, Johnathan and his wife Grace Okafor",
        "report": f"IMPRESSION: pneumonia. Signed by Maria Gonzalez, MD on March 14, 2021, MRN: 8675309-{i}",
        "view": "PA, Johnathan Smithers",
    }


def _rows(folder: Path) -> list[ManifestRow]:
    rows = []
    for i, patient in enumerate(SOURCES):
        t = _phi(i)
        rows.append(
            ManifestRow(
                patient,
                f"S{i}",
                T0 - 86400 * (10 - i),
                str(png(folder, i)),
                t["question"],
                t["answer"],
                report=t["report"],
                decision=t["decision"],
                view=t["view"],
            )
        )
    return rows


def _deny(patient: str, purpose: str) -> ConsentRecord:
    """The patient's opt-out of population use by agents."""
    return ConsentRecord(
        consent_id=new_id("C"),
        patient_id=patient,
        grantee="role:agent",
        purpose=purpose,
        decision="deny",
        data_classes=("population",),
        start=0.0,
        created_at=T0,
    )


def _leaks(text: str) -> list[str]:
    return [t for t in TOKENS if t.lower() in text.lower()]


def _answer_text(a: AgentAnswer) -> str:
    return json.dumps(a.to_json()) + a.prompt


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock(T0)


@pytest.fixture
def mem(tmp_path: Path, clock: FixedClock) -> Iterator[MsmMem]:
    m = MsmMem.init(tmp_path / "s", ADMIN, clock=clock)
    m.ingest(INGEST, _rows(tmp_path))
    yield m
    m.close()


def _own_memory(mem: MsmMem, patient: str) -> str:
    """Everything the API shows of ``patient``'s memory, as one text."""
    parts: list[object] = []
    parts += [
        (e.question, e.answer, e.decision, e.media_path, e.media_description) for e in mem.episodes(AGENT, patient)
    ]
    parts += [(v.media_path, v.visual_tag) for v in mem.visuals(AGENT, patient)]
    parts += [[(i.text, i.decision) for i in s.impressions] for s in mem.semantic_state(AGENT, patient)]
    parts += [(c.content, c.source) for c in mem.claims(AGENT, patient)]
    parts += [str(i.payload) for i in mem.stm_items(AGENT, patient)]
    return json.dumps(parts)


def _store_files(directory: Path) -> list[Path]:
    return [p for p in directory.rglob("*") if p.is_file()]


def _assert_nothing_at_rest(directory: Path) -> None:
    """No file the store wrote holds a seeded identifier in clear (bytes, any case)."""
    files = _store_files(directory)
    assert any(p.name.endswith(".sqlite") for p in files)
    for path in files:
        data = path.read_bytes().lower()
        found = [t for t in TOKENS if t.lower().encode() in data]
        assert not found, (path.name, found)


def _assert_private(directory: Path) -> None:
    for path in [directory, *directory.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode & 0o077 == 0, (path.relative_to(directory.parent), oct(mode))


def test_seeded_identifiers_reach_no_other_patient(
    mem: MsmMem, tmp_path: Path, clock: FixedClock, caplog: pytest.LogCaptureFixture, views: Views
) -> None:
    """Another patient's identifiers reach no answer, evidence, memory, export, log or file, before
    and after shredding and decay; population answers list their population evidence."""
    caplog.set_level(logging.DEBUG)
    store = tmp_path / "s"
    assert all(find_identifiers(v) for v in _phi(0).values())
    asked: list[AgentAnswer] = []
    for j, patient in enumerate(["PNEW", "PTHIRD", "PFOURTH"]):
        a = mem.ask(AGENT, patient, png(tmp_path, j), "Any consolidation?", study_id=f"N{j}", visual_tag="PA")
        asked.append(a)
        assert a.source == "population-prior" and a.evidence
        assert {e.kind for e in a.evidence} <= {"population-episodic", "population-visual"}
        assert not _leaks(_answer_text(a)), patient
        assert "pneumonia" in a.answer.lower()
        assert not _leaks(_own_memory(mem, patient)), patient
        (episode,) = mem.episodes(AGENT, patient)  # written as the agent's, naming its sources
        assert episode.source.startswith("population:") and episode.evidence_tier == "agent"
    # the second new patient's answer may come from the first's (derived) answer: still clean
    _assert_nothing_at_rest(store)
    _assert_private(store)

    mem.shred(ADMIN, "PX0", "erasure request")
    derived = [e for e in views(mem).store.iter_episodes() if e.patient_id in ("PNEW", "PTHIRD", "PFOURTH")]
    px0 = {e.id for a in asked for e in a.evidence}
    assert px0  # every copy derived (directly or not) from PX0's records is gone; the rest stays
    for e in derived:
        if e.state != State.RETRACTED:
            assert e.answer and not _leaks(e.answer)
    after = mem.ask(AGENT, "PFIFTH", png(tmp_path, 0), "Any consolidation?", study_id="N9")
    assert not _leaks(_answer_text(after)) and not _leaks(_own_memory(mem, "PFIFTH"))
    _assert_nothing_at_rest(store)

    clock.advance(10 * YEAR)
    mem.maintain(SYSTEM)
    for e in views(mem).store.iter_episodes():  # anonymised: scrubbed, names without a cue included
        if e.state == State.ANONYMIZED:
            text = " ".join((e.question, e.answer, e.decision, e.media_description))
            assert not _leaks(text) and find_identifiers(text) == [], text
    for v in views(mem).store.iter_visuals():
        if v.state == State.ANONYMIZED:
            assert not _leaks(v.visual_tag)
    late = mem.ask(AGENT, "PSIXTH", png(tmp_path, 1), "Any consolidation?", study_id="N10")
    assert late.evidence and not _leaks(_answer_text(late)) and not _leaks(_own_memory(mem, "PSIXTH"))
    _assert_nothing_at_rest(store)

    export = tmp_path / "paper"
    mem.export_paper(EXPORTER, export)
    for line in (export / "episodic.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if row.get("patient_id", "") not in SOURCES:
            assert not _leaks(line), line
    for path in (export / "semantic").glob("*.json"):
        if path.stem not in SOURCES:
            assert not _leaks(path.read_text(encoding="utf-8")), path.name
    fhir = tmp_path / "audit.ndjson"
    mem.export_fhir(AUDITOR, fhir)
    assert not _leaks(fhir.read_text(encoding="utf-8"))
    assert stat.S_IMODE(fhir.stat().st_mode) & 0o077 == 0
    assert not _leaks(" ".join(r.getMessage() for r in caplog.records))
    _assert_private(store)


def test_shredding_removes_every_derived_copy(mem: MsmMem, tmp_path: Path, views: Views) -> None:
    """An answer derived from PX0 (and one derived from that) is retracted and blanked when PX0
    is shredded: records, claim, semantic state; other patients' own records stay."""
    for patient in SOURCES[1:]:  # only PX0 may inform the new patients
        deny = _deny(patient, "*")
        mem.grant(ADMIN, [deny])
    first = mem.ask(AGENT, "PNEW", png(tmp_path, 0), "Any consolidation?", study_id="N0")
    assert {e.kind for e in first.evidence} == {"population-episodic"}
    second = mem.ask(AGENT, "PTHIRD", png(tmp_path, 0), "Any consolidation?", study_id="N1")
    assert second.evidence and mem.episodes(AGENT, "PTHIRD")[0].source.startswith("population:")
    mem.shred(ADMIN, "PX0", "erasure request")
    for patient in ("PNEW", "PTHIRD"):
        assert mem.episodes(AGENT, patient) == [] and mem.visuals(AGENT, patient) == []
        assert mem.claims(AGENT, patient) == [] and mem.semantic_state(AGENT, patient) == []
    blanked = [e for e in views(mem).store.iter_episodes() if e.patient_id in ("PNEW", "PTHIRD")]
    assert blanked and all(e.state == State.RETRACTED and e.answer == "" for e in blanked)
    assert all(mem.episodes(AGENT, p) for p in SOURCES[1:])
    again = mem.ask(AGENT, "PNEW", png(tmp_path, 0), "Any consolidation?", study_id="N2")
    assert not _leaks(_answer_text(again))


def test_population_use_needs_consent(mem: MsmMem, tmp_path: Path) -> None:
    """A patient whose consent denies the class population never informs another's answer."""
    deny = _deny("PX0", "treatment")
    mem.grant(ADMIN, [deny])
    a = mem.ask(AGENT, "PNEW", png(tmp_path, 0), "Any consolidation?", write_back=False)
    px0 = {e.episode_id for e in mem.episodes(CRITIC, "PX0")}
    assert a.evidence and not px0 & {e.id for e in a.evidence}
    assert mem.episodes(AGENT, "PX0")  # the patient's own care is untouched


def test_store_files_are_private(mem: MsmMem, tmp_path: Path) -> None:
    """Every directory of a store is 0700 and every file 0600: database, WAL, caches, keys,
    checkpoints, settings."""
    mem.ask(AGENT, "PNEW", png(tmp_path, 0), "Any consolidation?")
    mem.maintain(SYSTEM)
    mem.close()
    with MsmMem.open(tmp_path / "s") as again:
        again.ask(AGENT, "PNEW", png(tmp_path, 1), "Any change?")
    names = {p.name for p in _store_files(tmp_path / "s")}
    assert {"msm-mem.sqlite", "checkpoints.jsonl"} <= names and any(n.endswith(".faiss") for n in names)
    _assert_private(tmp_path / "s")

"""Tests of decay in maintenance (msm_mem._memory.maintenance): records past their decay time (the
ten-year default retention after the patient's last activity; the rule is tested in
``tests/test_maintenance_retention.py``) anonymised in place (no Safe Harbor identifier left,
the scanner finds none), leaving the patient scope with no link to their old ids, the audit
naming only the old id, a rejected answer never coming back, and the semantic state decaying
too."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from msm_mem import Principal
from msm_mem._api.mem import MsmMem
from msm_mem._governance.deid import find_identifiers
from msm_mem._memory.retrieval import Retrieval
from msm_mem._records import State
from msm_mem.plugins.images import load_image
from msm_mem.testing import FixedBackbone, FixedClock
from tests.conftest import MemFactory
from tests.helpers import AGENT, SYSTEM, audit_events, raw_sql
from tests.helpers import png as _png
from tests.layers import Layers, layers_of
from tests.test_maintenance import ANSWER, CORRECTION, CRITIC, YEAR

#: Safe Harbor identifiers the scanner must not find after decay
PHI_ANSWER = (
    "Pneumonia in the right lower lobe per Dr. Alice Walker on March 3, 2020; call 617-555-0123 "
    "or jdoe@example.com; MRN: 1234567; Boston, MA 02114; 92-year-old man"
)
PHI_QUESTION = "Dr. Bob Jones asks on March 4, 2020 about MRN: 7654321: any pneumonia?"
PHI_CORRECTION = "Consolidation seen by Dr. Carol King on 04/05/2020, aged 93, phone (617) 555-0199"


def audit_payloads(layers: Layers) -> list[bytes]:
    """The stored payload of every audit event, oldest first."""
    return [r.payload for r in layers.store.iter_audit()]


@pytest.fixture
def backbone() -> FixedBackbone:
    """The backbone of ``mem``: it answers ANSWER until a test gives it another answer."""
    return FixedBackbone(ANSWER, "treat")


@pytest.fixture
def mem(new_mem: MemFactory, clock: FixedClock, backbone: FixedBackbone) -> Iterator[MsmMem]:
    """A store on each backend answering ANSWER, on conftest's clock."""
    m = new_mem("s", clock=clock, backbone=backbone)
    yield m
    m.close()


@pytest.fixture
def layers(mem: MsmMem, clock: FixedClock) -> Iterator[Layers]:
    """The layers under ``mem``, built from its directory through their own constructors."""
    with layers_of(mem, clock) as built:
        yield built


def _retrieve(layers: Layers, patient_id: str, z: np.ndarray, **options: Any) -> Retrieval:
    """The memory core's retrieval after seeing what ``mem`` committed (a governed turn would sync too)."""
    layers.store.sync()
    return layers.gm.memory.retrieve(patient_id, z, **options)


# decay: anonymisation in place ------------------------------------------------------------------


def _phi_store(mem: MsmMem, layers: Layers, backbone: FixedBackbone, folder: Path) -> None:
    """Claims, episodes and visuals full of Safe Harbor identifiers, one of them corrected by a critic."""
    backbone.answer, backbone.decision = PHI_ANSWER, "Call Dr. Eve Stone at 617-555-0142 on May 5, 2020"
    mem.ask(AGENT, "PAT-0042", _png(folder, 1), PHI_QUESTION, study_id="ACC-778899")
    mem.ask(AGENT, "PAT-0042", _png(folder, 2), PHI_QUESTION, study_id="ACC-778900")
    layers.maintainer().critic_verdict(CRITIC, "PAT-0042", "ACC-778899", accept=False, correction=PHI_CORRECTION)
    g = layers.gm
    turn = g.begin(Principal("ingest", "system", "operations"), "PAT-0042")
    z = layers.encoder.encode([load_image(_png(folder, 3))])[0]
    item = g.observe(
        turn,
        z,
        PHI_QUESTION,
        study_id="ACC-778901",
        media_path=str(_png(folder, 3)),
        media_description="Dictated by Dr. Ann Lee, DOB: 01/02/1930, jane.roe@mail.com",
    )
    g.consolidate(turn, item, PHI_ANSWER, evidence_tier="ground_truth", confidence=1.0, source="manifest", force=True)
    g.commit(turn)


def _decayed_texts(mem: MsmMem, layers: Layers) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for e in layers.store.iter_episodes():
        if e.state == State.ANONYMIZED:
            out[e.episode_id] = [
                e.question,
                e.answer,
                e.decision,
                e.media_path,
                e.media_description,
                e.study_id,
                e.source,
                e.patient_id,
            ]
    for v in layers.store.iter_visuals():
        if v.state == State.ANONYMIZED:
            out[v.visual_id] = [v.media_path, v.visual_tag, v.source, v.patient_id]
    con_ids = raw_sql(mem, "SELECT id FROM claims WHERE state = 'anonymized'")
    for c in layers.store.get_claims([r[0] for r in con_ids]):
        out[c.claim_id] = [c.content, c.source, c.patient_id]
    return out


def test_decay_anonymises_in_place(
    mem: MsmMem, layers: Layers, backbone: FixedBackbone, tmp_path: Path, clock: FixedClock
) -> None:
    """Past decay_at every LTM record is anonymised: no patient id, a fresh random id, identifiers removed."""
    _phi_store(mem, layers, backbone, tmp_path)
    old = {("episodic", e.episode_id) for e in layers.store.iter_episodes()}
    old |= {("visual", v.visual_id) for v in layers.store.iter_visuals()}
    old_claims = {
        c.claim_id
        for a in layers.store.claims_active("PAT-0042")
        for c in layers.store.claim_history("PAT-0042", a.key)
    }
    assert len({c.key for c in layers.store.claims_active("PAT-0042")}) == 3  # one question about each of 3 studies
    assert layers.maintainer().decay() == (0, 0)  # nothing due yet
    active_claims = {c.claim_id for c in layers.store.claims_active("PAT-0042")}
    active = [e for e in layers.store.iter_episodes() if e.state == State.ACTIVE]
    active += [v for v in layers.store.iter_visuals() if v.state == State.ACTIVE]  # type: ignore[misc]
    clock.advance(10 * YEAR)
    report = mem.maintain(SYSTEM)
    # active records are anonymised; superseded ones and the semantic versions are retracted
    assert report.anonymized == len(active) + len(active_claims)
    retracted = [e for e in audit_events(layers.store) if e.action == "decay" and e.reason == "retracted"]
    assert report.retracted == len(retracted) >= len(old_claims - active_claims) + 1  # + the semantic versions
    assert layers.store.record_ids("episodic", "PAT-0042") == [] and layers.store.record_ids("claims", "PAT-0042") == []
    decayed = _decayed_texts(mem, layers)
    assert len(decayed) == report.anonymized
    old_ids = {i for _, i in old} | old_claims
    for new_id, fields in decayed.items():
        assert new_id not in old_ids
        assert "PAT-0042" not in new_id and not any(o[2:] in new_id for o in old_ids)
        assert fields[-1] == ""  # patient id removed
    for e in layers.store.iter_episodes():
        assert (e.study_id, e.source, e.media_path) == ("", "", "")
    for v in layers.store.iter_visuals():
        assert (v.media_path, v.source) == ("", "")


def test_decay_scanner_finds_no_identifiers(
    mem: MsmMem, layers: Layers, backbone: FixedBackbone, tmp_path: Path, clock: FixedClock
) -> None:
    """find_identifiers reports nothing in any text field of any decayed record, while the content survives."""
    _phi_store(mem, layers, backbone, tmp_path)
    assert find_identifiers(PHI_ANSWER) and find_identifiers(PHI_QUESTION) and find_identifiers(PHI_CORRECTION)
    clock.advance(10 * YEAR)
    mem.maintain(SYSTEM)
    decayed = _decayed_texts(mem, layers)
    assert decayed
    for rid, fields in decayed.items():
        for text in fields:
            assert find_identifiers(text) == [], (rid, text)
    answers = " ".join(e.answer for e in layers.store.iter_episodes())
    assert "right lower lobe" in answers and "Alice" not in answers and "617-555" not in answers


def test_decayed_records_leave_the_patient_scope(
    mem: MsmMem, layers: Layers, tmp_path: Path, clock: FixedClock
) -> None:
    """Anonymised records are found by population and anonymous retrieval, not by the patient's scope."""
    mem.ask(AGENT, "P1", _png(tmp_path, 1), "Any consolidation?", study_id="S1")
    z = layers.encoder.encode([load_image(_png(tmp_path, 1))])[0]
    assert len(_retrieve(layers, "P1", z).episodic) == 1
    clock.advance(10 * YEAR)
    mem.maintain(SYSTEM)
    assert _retrieve(layers, "P1", z).episodic == ()
    for scope in ("population", "anonymous"):
        hits = _retrieve(layers, "P9", z, scope=scope).episodic
        assert len(hits) == 1 and hits[0].record.patient_id == "" and hits[0].record.state == State.ANONYMIZED
    answer = mem.ask(AGENT, "P9", _png(tmp_path, 1), "Any consolidation?", write_back=False)
    assert answer.source != "empty"  # population experience feeds a new patient's answer


def test_decay_audit_names_only_the_old_id(mem: MsmMem, layers: Layers, tmp_path: Path, clock: FixedClock) -> None:
    """Each decay event names the old id, no patient, and the new id appears in no audit payload."""
    mem.ask(AGENT, "P1", _png(tmp_path, 1), "Any consolidation?", study_id="S1")
    (old_ep,) = list(layers.store.iter_episodes())
    clock.advance(10 * YEAR)
    mem.maintain(SYSTEM)
    (new_ep,) = list(layers.store.iter_episodes())
    decay = [e for e in audit_events(layers.store) if e.action == "decay"]
    assert len(decay) == 4  # episode, visual, claim (anonymised), semantic state (retracted)
    assert all(len(e.record_ids) == 1 and e.patient == "" and e.role == "system" for e in decay)
    assert old_ep.episode_id in {e.record_ids[0] for e in decay}
    assert not any(new_ep.episode_id.encode() in p for p in audit_payloads(layers))


def test_decayed_records_keep_no_link_to_old_ids(
    mem: MsmMem, layers: Layers, tmp_path: Path, clock: FixedClock
) -> None:
    """No anonymised row holds an id or study identifier that the patient's audit trail names."""
    mem.ask(AGENT, "P1", _png(tmp_path, 1), "Any consolidation?", study_id="ACC-778899")
    layers.maintainer().critic_verdict(CRITIC, "P1", "ACC-778899", accept=False, correction=CORRECTION)
    clock.advance(10 * YEAR)
    mem.maintain(SYSTEM)
    audited = b"".join(audit_payloads(layers))
    links = [e.supersedes or "" for e in layers.store.iter_episodes()]
    links += [v.source_episode_id for v in layers.store.iter_visuals()]
    rows = raw_sql(mem, "SELECT key, supersedes FROM claims")
    links += [r[1] or "" for r in rows]
    assert not [x for x in links if x and x.encode() in audited]
    assert not [r[0] for r in rows if "ACC-778899" in r[0]]


def test_rejected_answer_does_not_return_after_decay(
    mem: MsmMem, layers: Layers, tmp_path: Path, clock: FixedClock
) -> None:
    """After decay the population pool holds the critic's correction, not the answer it rejected."""
    mem.ask(AGENT, "P1", _png(tmp_path, 1), "Any consolidation?", study_id="S1")
    layers.maintainer().critic_verdict(CRITIC, "P1", "S1", accept=False, correction=CORRECTION)
    clock.advance(10 * YEAR)
    mem.maintain(SYSTEM)
    z = layers.encoder.encode([load_image(_png(tmp_path, 1))])[0]
    answers = [h.record.answer for h in _retrieve(layers, "P9", z, scope="anonymous").episodic]  # type: ignore[union-attr]
    assert answers == [CORRECTION]


def test_semantic_state_decays_too(
    mem: MsmMem, layers: Layers, backbone: FixedBackbone, tmp_path: Path, clock: FixedClock
) -> None:
    """Ten years after the patient's last activity the patient's semantic history goes as well (retracted)."""
    _phi_store(mem, layers, backbone, tmp_path)
    clock.advance(10 * YEAR)
    mem.maintain(SYSTEM)
    assert layers.store.semantic_active("PAT-0042") == []

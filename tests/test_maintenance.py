"""Tests of maintenance and corrections (msm_mem._memory.maintenance): STM expiry, age-threshold
consolidation, decay (anonymisation in place, Safe Harbor scan), critic verdicts, shredding."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from msm_mem import Principal
from msm_mem._api.mem import MsmMem
from msm_mem._errors import IllegalTransition, InvalidInput, NotFound
from msm_mem._governance.deid import find_identifiers
from msm_mem._records import State
from msm_mem._tier_records import StmState
from msm_mem.plugins.images import load_image
from msm_mem.testing import FixedBackbone, FixedClock
from tests.conftest import MemFactory
from tests.helpers import AGENT, SYSTEM, audit_events, raw_sql
from tests.helpers import png as _png

T0 = 1_700_000_000.0
YEAR = 365.25 * 86400
ANSWER = "Bilateral lower lobe opacities consistent with pneumonia"
CRITIC = Principal("rad-1", "critic")
CORRECTION = "Right lower lobe consolidation, pneumonia confirmed"
#: Safe Harbor identifiers the scanner must not find after decay
PHI_ANSWER = (
    "Pneumonia in the right lower lobe per Dr. Alice Walker on March 3, 2020; call 617-555-0123 "
    "or jdoe@example.com; MRN: 1234567; Boston, MA 02114; 92-year-old man"
)
PHI_QUESTION = "Dr. Bob Jones asks on March 4, 2020 about MRN: 7654321: any pneumonia?"
PHI_CORRECTION = "Consolidation seen by Dr. Carol King on 04/05/2020, aged 93, phone (617) 555-0199"


def _payloads(mem: MsmMem) -> list[bytes]:
    return [r.payload for r in mem._store.iter_audit()]


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock(T0)


@pytest.fixture
def mem(new_mem: MemFactory, clock: FixedClock) -> Iterator[MsmMem]:
    m = new_mem("s", clock=clock, backbone=FixedBackbone(ANSWER, "treat"))
    yield m
    m.close()


def _held(mem: MsmMem, folder: Path) -> str:
    """Ask twice with the same image: the second item is held in STM (not novel); its id."""
    mem.ask(AGENT, "P1", _png(folder, 1), "Any consolidation?", study_id="S1")
    second = mem.ask(AGENT, "P1", _png(folder, 1), "Any change?", study_id="S2")
    assert second.gate is not None and second.gate.reasons == ("not_novel",)
    (item,) = mem._store.stm_list(state=StmState.ACTIVE)
    return item.item_id


# STM expiry ---------------------------------------------------------------------------------


def test_expire_after_ttl_purges_payload(mem: MsmMem, tmp_path: Path, clock: FixedClock) -> None:
    """Past expires_at, maintain marks the held item EXPIRED and forgets payload and embedding."""
    item_id = _held(mem, tmp_path)
    clock.advance(mem.settings.stm_ttl_s - 1)
    assert mem._maintainer().expire() == 0
    clock.advance(1)
    report = mem.maintain(SYSTEM)
    assert report.expired == 1
    (item,) = mem._store.stm_get([item_id])
    assert (item.state, item.payload, item.z) == (StmState.EXPIRED, None, None)
    expire = [e for e in audit_events(mem._store) if e.action == "expire"]
    assert [(e.role, e.record_ids, e.source_tier, e.target_tier) for e in expire] == [
        ("system", (item_id,), "stm", "stm")
    ]
    assert mem._audit.verify().ok


def test_consolidated_items_do_not_expire(mem: MsmMem, tmp_path: Path, clock: FixedClock) -> None:
    """Only ACTIVE short-term items expire; consolidated ones keep their state."""
    mem.ask(AGENT, "P1", _png(tmp_path, 1), "Any consolidation?")
    clock.advance(2 * mem.settings.stm_ttl_s)
    assert mem._maintainer().expire() == 0
    assert mem._store.stm_list()[0].state == StmState.CONSOLIDATED


# age-threshold consolidation -------------------------------------------------------------------


def test_age_threshold_discards_items_that_still_fail_the_gate(mem: MsmMem, tmp_path: Path, clock: FixedClock) -> None:
    """A held item older than consolidate_after_s is gated once more and discarded (purged) if it fails."""
    item_id = _held(mem, tmp_path)
    assert mem._maintainer().consolidate_aged() == (0, 0)  # too young
    clock.advance(mem._maintainer().consolidate_after_s)
    assert mem._maintainer().consolidate_aged() == (0, 1)
    (item,) = mem._store.stm_get([item_id])
    assert (item.state, item.payload) == (StmState.DISCARDED, None)
    discard = [e for e in audit_events(mem._store) if e.action == "discard"]
    assert len(discard) == 1 and discard[0].role == "system" and discard[0].reason == "not_novel"


def test_age_threshold_consolidates_an_answered_item(mem: MsmMem, tmp_path: Path, clock: FixedClock) -> None:
    """An answered STM item that passes the gate is consolidated by the system's age_threshold trigger."""
    g = mem._gm
    turn = g.begin(Principal("agent-1", "agent"), "P1")
    z = mem._encoder.encode([load_image(_png(tmp_path, 1))])[0]
    item = g.observe(turn, z, "Any consolidation?", study_id="S1")
    # an answered item that was never gated (for example a turn interrupted before write-back)
    staged = turn.batch.stm[0]
    assert staged.payload is not None
    turn.batch.stm[0] = replace(staged, payload=staged.payload.answered(ANSWER))
    g.commit(turn)
    clock.advance(mem._maintainer().consolidate_after_s + 1)
    assert mem.maintain(SYSTEM).consolidated == 1
    assert mem._store.stm_get([item.item_id])[0].state == StmState.CONSOLIDATED
    assert mem._store.count("episodic") == 1
    aged = [e for e in audit_events(mem._store) if e.action == "age_threshold"]
    assert len(aged) == 1 and aged[0].role == "system" and aged[0].record_ids[0] == item.item_id


def test_age_threshold_does_not_duplicate_semantic_impressions(mem: MsmMem, tmp_path: Path, clock: FixedClock) -> None:
    """Re-gating a held item must not add its answer to the semantic history a second time."""
    _held(mem, tmp_path)
    clock.advance(mem._maintainer().consolidate_after_s)
    mem._maintainer().consolidate_aged()
    (state,) = mem._store.semantic_active("P1")
    assert len(state.impressions) == 2


# critic verdicts ------------------------------------------------------------------------------


def test_critic_reject_supersedes_claim_semantic_and_episode(mem: MsmMem, tmp_path: Path) -> None:
    """A rejection supersedes the claim, the semantic state and the episode; the new ones carry the correction."""
    mem.ask(AGENT, "P1", _png(tmp_path, 1), "Any consolidation?", study_id="S1")
    (old_claim,) = mem._store.claims_active("P1")
    (old_sem,) = mem._store.semantic_active("P1")
    (old_ep,) = list(mem._store.iter_episodes())
    claim = mem._maintainer().critic_verdict(CRITIC, "P1", "S1", accept=False, correction=CORRECTION, decision="admit")
    assert (claim.content, claim.evidence_tier, claim.confidence) == (CORRECTION, "critic", 1.0)
    assert claim.supersedes == old_claim.claim_id
    assert mem._store.get_claims([old_claim.claim_id])[0].state == State.SUPERSEDED
    assert mem._store.get_claims([old_claim.claim_id])[0].content == ANSWER  # never rewritten
    (sem,) = mem._store.semantic_active("P1")
    assert sem.supersedes == old_sem.state_id and sem.evidence_tier == "critic"
    assert [i.text for i in sem.impressions] == [CORRECTION]
    episodes = {e.episode_id: e for e in mem._store.iter_episodes()}
    assert episodes[old_ep.episode_id].state == State.SUPERSEDED and episodes[old_ep.episode_id].answer == ANSWER
    (new_ep,) = [e for e in episodes.values() if e.state == State.ACTIVE]
    assert (new_ep.answer, new_ep.evidence_tier, new_ep.decision) == (CORRECTION, "critic", "admit")
    assert new_ep.supersedes == old_ep.episode_id
    event = [e for e in audit_events(mem._store) if e.action == "critic_reject"][-1]
    named = {claim.claim_id, old_claim.claim_id, new_ep.episode_id, old_ep.episode_id, sem.state_id}
    assert named <= set(event.record_ids)
    assert event.role == "critic"


def test_critic_accept_raises_tier_without_changing_content(mem: MsmMem, tmp_path: Path) -> None:
    """An accepted impression is superseded by a critic-tier claim with the same content."""
    mem.ask(AGENT, "P1", _png(tmp_path, 1), "Any consolidation?", study_id="S1")
    claim = mem._maintainer().critic_verdict(CRITIC, "P1", "S1", accept=True)
    assert (claim.content, claim.evidence_tier) == (ANSWER, "critic")
    history = mem._store.claim_history("P1", "study:S1")
    assert [c.state for c in history] == [State.SUPERSEDED, State.ACTIVE]


def test_critic_reject_needs_a_correction_and_a_claim(mem: MsmMem, tmp_path: Path) -> None:
    """A rejection without a correction is invalid; a verdict on an unknown study is NotFound."""
    mem.ask(AGENT, "P1", _png(tmp_path, 1), "Any consolidation?", study_id="S1")
    with pytest.raises(InvalidInput):
        mem._maintainer().critic_verdict(CRITIC, "P1", "S1", accept=False)
    with pytest.raises(NotFound):
        mem._maintainer().critic_verdict(CRITIC, "P1", "S9", accept=True)


@pytest.mark.parametrize("accept", [False, True])
def test_critic_verdict_by_agent_role_is_refused(mem: MsmMem, tmp_path: Path, accept: bool) -> None:
    """An agent cannot give a critic verdict (reject or accept): IllegalTransition, nothing written, denial audited."""
    mem.ask(AGENT, "P1", _png(tmp_path, 1), "Any consolidation?", study_id="S1")
    claims = mem._store.claim_history("P1", "study:S1")
    semantic = mem._store.semantic_history("P1", "impression")
    with pytest.raises(IllegalTransition):
        mem._maintainer().critic_verdict(
            Principal("agent-1", "agent"), "P1", "S1", accept=accept, correction=CORRECTION
        )
    assert mem._store.claim_history("P1", "study:S1") == claims
    assert mem._store.semantic_history("P1", "impression") == semantic
    last = audit_events(mem._store)[-1]
    assert (last.outcome, last.role, last.reason) == ("denied", "agent", "illegal_transition")


def test_critic_promotes_a_held_item(mem: MsmMem, tmp_path: Path) -> None:
    """A critic's verdict on a study held in STM (not novel) consolidates it with the correction."""
    item_id = _held(mem, tmp_path)
    episodes = mem._store.count("episodic")
    mem._maintainer().critic_verdict(CRITIC, "P1", "S2", accept=False, correction=CORRECTION)
    assert mem._store.stm_get([item_id])[0].state == StmState.CONSOLIDATED
    assert mem._store.count("episodic") == episodes + 1
    promoted = [e for e in mem._store.iter_episodes() if e.study_id == "S2"]
    assert len(promoted) == 1 and promoted[0].answer == CORRECTION and promoted[0].evidence_tier == "critic"
    assert [e.role for e in audit_events(mem._store) if e.action == "critic_promote"] == ["critic"]
    (claim,) = mem._store.claims_active("P1", "study:S2")
    assert claim.content == CORRECTION
    assert json.loads(claim.source)["episode"] == promoted[0].episode_id


@pytest.mark.parametrize("held", [False, True])
def test_second_verdict_corrects_the_corrected_episode(mem: MsmMem, tmp_path: Path, held: bool) -> None:
    """A later rejection of the same study supersedes the episode the first verdict wrote."""
    if held:
        _held(mem, tmp_path)
        study = "S2"
    else:
        mem.ask(AGENT, "P1", _png(tmp_path, 1), "Any consolidation?", study_id="S1")
        study = "S1"
    mem._maintainer().critic_verdict(CRITIC, "P1", study, accept=False, correction=CORRECTION)
    mem._maintainer().critic_verdict(CRITIC, "P1", study, accept=False, correction="Left lower lobe pneumonia instead")
    active = [e for e in mem._store.iter_episodes() if e.study_id == study and e.state == State.ACTIVE]
    assert [e.answer for e in active] == ["Left lower lobe pneumonia instead"]
    (claim,) = mem._store.claims_active("P1", f"study:{study}")
    assert json.loads(claim.source)["episode"] == active[0].episode_id


# decay: anonymisation in place ------------------------------------------------------------------


def _phi_store(mem: MsmMem, folder: Path) -> None:
    """Claims, episodes and visuals full of Safe Harbor identifiers, one of them corrected by a critic."""
    mem._agent.backbone = FixedBackbone(PHI_ANSWER, "Call Dr. Eve Stone at 617-555-0142 on May 5, 2020")
    mem.ask(AGENT, "PAT-0042", _png(folder, 1), PHI_QUESTION, study_id="ACC-778899")
    mem.ask(AGENT, "PAT-0042", _png(folder, 2), PHI_QUESTION, study_id="ACC-778900")
    mem._maintainer().critic_verdict(CRITIC, "PAT-0042", "ACC-778899", accept=False, correction=PHI_CORRECTION)
    g = mem._gm
    turn = g.begin(Principal("ingest", "system", "operations"), "PAT-0042")
    z = mem._encoder.encode([load_image(_png(folder, 3))])[0]
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


def _decayed_texts(mem: MsmMem) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for e in mem._store.iter_episodes():
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
    for v in mem._store.iter_visuals():
        if v.state == State.ANONYMIZED:
            out[v.visual_id] = [v.media_path, v.visual_tag, v.source, v.patient_id]
    con_ids = raw_sql(mem, "SELECT id FROM claims WHERE state = 'anonymized'")
    for c in mem._store.get_claims([r[0] for r in con_ids]):
        out[c.claim_id] = [c.content, c.source, c.patient_id]
    return out


def test_decay_anonymises_in_place(mem: MsmMem, tmp_path: Path, clock: FixedClock) -> None:
    """Past decay_at every LTM record is anonymised: no patient id, a fresh random id, identifiers removed."""
    _phi_store(mem, tmp_path)
    old = {("episodic", e.episode_id) for e in mem._store.iter_episodes()}
    old |= {("visual", v.visual_id) for v in mem._store.iter_visuals()}
    old_claims = {
        c.claim_id
        for k in ("ACC-778899", "ACC-778900", "ACC-778901")
        for c in mem._store.claim_history("PAT-0042", f"study:{k}")
    }
    assert mem._maintainer().decay() == (0, 0)  # nothing due yet
    active_claims = {c.claim_id for c in mem._store.claims_active("PAT-0042")}
    active = [e for e in mem._store.iter_episodes() if e.state == State.ACTIVE]
    active += [v for v in mem._store.iter_visuals() if v.state == State.ACTIVE]  # type: ignore[misc]
    clock.advance(10 * YEAR)
    report = mem.maintain(SYSTEM)
    # active records are anonymised; superseded ones and the semantic versions are retracted
    assert report.anonymized == len(active) + len(active_claims)
    retracted = [e for e in audit_events(mem._store) if e.action == "decay" and e.reason == "retracted"]
    assert report.retracted == len(retracted) >= len(old_claims - active_claims) + 1  # + the semantic versions
    assert mem._store.record_ids("episodic", "PAT-0042") == [] and mem._store.record_ids("claims", "PAT-0042") == []
    decayed = _decayed_texts(mem)
    assert len(decayed) == report.anonymized
    old_ids = {i for _, i in old} | old_claims
    for new_id, fields in decayed.items():
        assert new_id not in old_ids
        assert "PAT-0042" not in new_id and not any(o[2:] in new_id for o in old_ids)
        assert fields[-1] == ""  # patient id removed
    for e in mem._store.iter_episodes():
        assert (e.study_id, e.source, e.media_path) == ("", "", "")
    for v in mem._store.iter_visuals():
        assert (v.media_path, v.source) == ("", "")


def test_decay_scanner_finds_no_identifiers(mem: MsmMem, tmp_path: Path, clock: FixedClock) -> None:
    """find_identifiers reports nothing in any text field of any decayed record, while the content survives."""
    _phi_store(mem, tmp_path)
    assert find_identifiers(PHI_ANSWER) and find_identifiers(PHI_QUESTION) and find_identifiers(PHI_CORRECTION)
    clock.advance(10 * YEAR)
    mem.maintain(SYSTEM)
    decayed = _decayed_texts(mem)
    assert decayed
    for rid, fields in decayed.items():
        for text in fields:
            assert find_identifiers(text) == [], (rid, text)
    answers = " ".join(e.answer for e in mem._store.iter_episodes())
    assert "right lower lobe" in answers and "Alice" not in answers and "617-555" not in answers


def test_decayed_records_leave_the_patient_scope(mem: MsmMem, tmp_path: Path, clock: FixedClock) -> None:
    """Anonymised records are found by population and anonymous retrieval, not by the patient's scope."""
    mem.ask(AGENT, "P1", _png(tmp_path, 1), "Any consolidation?", study_id="S1")
    z = mem._encoder.encode([load_image(_png(tmp_path, 1))])[0]
    assert len(mem._gm.memory.retrieve("P1", z).episodic) == 1
    clock.advance(10 * YEAR)
    mem.maintain(SYSTEM)
    assert mem._gm.memory.retrieve("P1", z).episodic == ()
    for scope in ("population", "anonymous"):
        hits = mem._gm.memory.retrieve("P9", z, scope=scope).episodic
        assert len(hits) == 1 and hits[0].record.patient_id == "" and hits[0].record.state == State.ANONYMIZED
    answer = mem.ask(AGENT, "P9", _png(tmp_path, 1), "Any consolidation?", write_back=False)
    assert answer.source != "empty"  # population experience feeds a new patient's answer


def test_decay_audit_names_only_the_old_id(mem: MsmMem, tmp_path: Path, clock: FixedClock) -> None:
    """Each decay event names the old id, no patient, and the new id appears in no audit payload."""
    mem.ask(AGENT, "P1", _png(tmp_path, 1), "Any consolidation?", study_id="S1")
    (old_ep,) = list(mem._store.iter_episodes())
    clock.advance(10 * YEAR)
    mem.maintain(SYSTEM)
    (new_ep,) = list(mem._store.iter_episodes())
    decay = [e for e in audit_events(mem._store) if e.action == "decay"]
    assert len(decay) == 4  # episode, visual, claim (anonymised), semantic state (retracted)
    assert all(len(e.record_ids) == 1 and e.patient == "" and e.role == "system" for e in decay)
    assert old_ep.episode_id in {e.record_ids[0] for e in decay}
    assert not any(new_ep.episode_id.encode() in p for p in _payloads(mem))


def test_decayed_records_keep_no_link_to_old_ids(mem: MsmMem, tmp_path: Path, clock: FixedClock) -> None:
    """No anonymised row holds an id or study identifier that the patient's audit trail names."""
    mem.ask(AGENT, "P1", _png(tmp_path, 1), "Any consolidation?", study_id="ACC-778899")
    mem._maintainer().critic_verdict(CRITIC, "P1", "ACC-778899", accept=False, correction=CORRECTION)
    clock.advance(10 * YEAR)
    mem.maintain(SYSTEM)
    audited = b"".join(_payloads(mem))
    links = [e.supersedes or "" for e in mem._store.iter_episodes()]
    links += [v.source_episode_id for v in mem._store.iter_visuals()]
    rows = raw_sql(mem, "SELECT key, supersedes FROM claims")
    links += [r[1] or "" for r in rows]
    assert not [x for x in links if x and x.encode() in audited]
    assert not [r[0] for r in rows if "ACC-778899" in r[0]]


def test_rejected_answer_does_not_return_after_decay(mem: MsmMem, tmp_path: Path, clock: FixedClock) -> None:
    """After decay the population pool holds the critic's correction, not the answer it rejected."""
    mem.ask(AGENT, "P1", _png(tmp_path, 1), "Any consolidation?", study_id="S1")
    mem._maintainer().critic_verdict(CRITIC, "P1", "S1", accept=False, correction=CORRECTION)
    clock.advance(10 * YEAR)
    mem.maintain(SYSTEM)
    z = mem._encoder.encode([load_image(_png(tmp_path, 1))])[0]
    answers = [h.record.answer for h in mem._gm.memory.retrieve("P9", z, scope="anonymous").episodic]  # type: ignore[union-attr]
    assert answers == [CORRECTION]


def test_semantic_state_decays_too(mem: MsmMem, tmp_path: Path, clock: FixedClock) -> None:
    """Long after every other record decayed, the patient's semantic history is anonymised as well."""
    _phi_store(mem, tmp_path)
    clock.advance(10 * YEAR)
    mem.maintain(SYSTEM)
    assert mem._store.semantic_active("PAT-0042") == []


# erasure --------------------------------------------------------------------------------------


def test_shred_retracts_everything_of_one_patient(mem: MsmMem, tmp_path: Path) -> None:
    """shred retracts the patient's LTM rows and derived graph, purges active STM, and audits
    with the reason; others intact."""
    _held(mem, tmp_path)
    mem.ask(AGENT, "P2", _png(tmp_path, 5), "Any consolidation?", study_id="S1")
    with pytest.raises(IllegalTransition):
        mem._maintainer().shred(Principal("agent-1", "agent"), "P1", "request")
    with pytest.raises(InvalidInput):
        mem._maintainer().shred(Principal("root", "admin"), "P1", " ")
    assert mem._store.entities("P1") and mem._store.relationships("P1")
    p2_graph = (mem._store.entities("P2"), mem._store.relationships("P2"))
    count = mem._maintainer().shred(Principal("root", "admin"), "P1", "erasure request")
    assert count > 0
    assert mem._store.record_ids("episodic", "P1") == [] and mem._store.claims_active("P1") == []
    assert mem._store.entities("P1") == [] and mem._store.relationships("P1") == []
    assert (mem._store.entities("P2"), mem._store.relationships("P2")) == p2_graph
    assert all(i.state != StmState.ACTIVE for i in mem._store.stm_list(patient_id="P1"))
    assert mem._store.claims_active("P2")[0].content == ANSWER
    last = audit_events(mem._store)[-1]
    assert (last.action, last.role, last.reason, last.purpose) == ("retract", "admin", "erasure request", "erasure")
    assert mem._audit.verify().ok

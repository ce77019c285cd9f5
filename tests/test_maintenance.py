"""Tests of maintenance and corrections (msm_mem._memory.maintenance): STM expiry, age-threshold
consolidation, critic verdicts, shredding (decay is in ``tests/test_maintenance_decay.py``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from msm_mem import Principal
from msm_mem._api.mem import MsmMem
from msm_mem._errors import IllegalTransition, InvalidInput, NotFound
from msm_mem._memory.claim_evidence import claim_key
from msm_mem._records import State
from msm_mem._tier_records import StmState
from msm_mem.plugins.images import load_image
from msm_mem.testing import FixedBackbone, FixedClock
from tests.conftest import MemFactory
from tests.helpers import AGENT, SYSTEM, audit_events
from tests.helpers import png as _png
from tests.layers import Layers, layers_of

YEAR = 365.25 * 86400
ANSWER = "Bilateral lower lobe opacities consistent with pneumonia"
CRITIC = Principal("rad-1", "critic")
CORRECTION = "Right lower lobe consolidation, pneumonia confirmed"


@pytest.fixture
def mem(new_mem: MemFactory, clock: FixedClock) -> Iterator[MsmMem]:
    """A store on each backend answering ANSWER, on conftest's clock."""
    m = new_mem("s", clock=clock, backbone=FixedBackbone(ANSWER, "treat"))
    yield m
    m.close()


@pytest.fixture
def layers(mem: MsmMem, clock: FixedClock) -> Iterator[Layers]:
    """The layers under ``mem``, built from its directory through their own constructors."""
    with layers_of(mem, clock) as built:
        yield built


def _held(mem: MsmMem, layers: Layers, folder: Path) -> str:
    """Ask twice with the same image: the second item is held in STM (not novel); its id."""
    mem.ask(AGENT, "P1", _png(folder, 1), "Any consolidation?", study_id="S1")
    second = mem.ask(AGENT, "P1", _png(folder, 1), "Any change?", study_id="S2")
    assert second.gate is not None and second.gate.reasons == ("not_novel",)
    (item,) = layers.store.stm_list(state=StmState.ACTIVE)
    return item.item_id


# STM expiry ---------------------------------------------------------------------------------


def test_expire_after_ttl_purges_payload(mem: MsmMem, layers: Layers, tmp_path: Path, clock: FixedClock) -> None:
    """Past expires_at, maintain marks the held item EXPIRED and forgets payload and embedding."""
    item_id = _held(mem, layers, tmp_path)
    clock.advance(mem.settings.stm_ttl_s - 1)
    assert layers.maintainer().expire() == 0
    clock.advance(1)
    report = mem.maintain(SYSTEM)
    assert report.expired == 1
    (item,) = layers.store.stm_get([item_id])
    assert (item.state, item.payload, item.z) == (StmState.EXPIRED, None, None)
    expire = [e for e in audit_events(layers.store) if e.action == "expire"]
    assert [(e.role, e.record_ids, e.source_tier, e.target_tier) for e in expire] == [
        ("system", (item_id,), "stm", "stm")
    ]
    assert layers.audit.verify().ok


def test_consolidated_items_do_not_expire(mem: MsmMem, layers: Layers, tmp_path: Path, clock: FixedClock) -> None:
    """Only ACTIVE short-term items expire; consolidated ones keep their state."""
    mem.ask(AGENT, "P1", _png(tmp_path, 1), "Any consolidation?")
    clock.advance(2 * mem.settings.stm_ttl_s)
    assert layers.maintainer().expire() == 0
    assert layers.store.stm_list()[0].state == StmState.CONSOLIDATED


# age-threshold consolidation -------------------------------------------------------------------


def test_age_threshold_discards_items_that_still_fail_the_gate(
    mem: MsmMem, layers: Layers, tmp_path: Path, clock: FixedClock
) -> None:
    """A held item older than consolidate_after_s is gated once more and discarded (purged) if it fails."""
    item_id = _held(mem, layers, tmp_path)
    assert layers.maintainer().consolidate_aged() == (0, 0)  # too young
    clock.advance(layers.maintainer().consolidate_after_s)
    assert layers.maintainer().consolidate_aged() == (0, 1)
    (item,) = layers.store.stm_get([item_id])
    assert (item.state, item.payload) == (StmState.DISCARDED, None)
    discard = [e for e in audit_events(layers.store) if e.action == "discard"]
    assert len(discard) == 1 and discard[0].role == "system" and discard[0].reason == "not_novel"


def test_age_threshold_consolidates_an_answered_item(
    mem: MsmMem, layers: Layers, tmp_path: Path, clock: FixedClock
) -> None:
    """An answered STM item that passes the gate is consolidated by the system's age_threshold trigger."""
    g = layers.gm
    turn = g.begin(Principal("agent-1", "agent"), "P1")
    z = layers.encoder.encode([load_image(_png(tmp_path, 1))])[0]
    item = g.observe(turn, z, "Any consolidation?", study_id="S1")
    # an answered item that was never gated (for example a turn interrupted before write-back)
    staged = turn.batch.stm[0]
    assert staged.payload is not None
    turn.batch.stm[0] = replace(staged, payload=staged.payload.answered(ANSWER))
    g.commit(turn)
    clock.advance(layers.maintainer().consolidate_after_s + 1)
    assert mem.maintain(SYSTEM).consolidated == 1
    assert layers.store.stm_get([item.item_id])[0].state == StmState.CONSOLIDATED
    assert layers.store.count("episodic") == 1
    aged = [e for e in audit_events(layers.store) if e.action == "age_threshold"]
    assert len(aged) == 1 and aged[0].role == "system" and aged[0].record_ids[0] == item.item_id


def test_a_held_answer_adds_no_impression_when_held_again(
    mem: MsmMem, layers: Layers, tmp_path: Path, clock: FixedClock
) -> None:
    """A held answer reaches neither the semantic history nor a claim, and the age sweep that
    holds it again (still not novel) adds none either."""
    _held(mem, layers, tmp_path)
    (state,) = layers.store.semantic_active("P1")
    assert [i.text for i in state.impressions] == [ANSWER]
    assert [c.key for c in layers.store.claims_active("P1")] == [claim_key("S1", "Any consolidation?")]
    clock.advance(layers.maintainer().consolidate_after_s)
    assert layers.maintainer().consolidate_aged() == (0, 1)
    assert layers.store.semantic_active("P1") == [state]
    assert [c.key for c in layers.store.claims_active("P1")] == [claim_key("S1", "Any consolidation?")]


# critic verdicts ------------------------------------------------------------------------------


def test_critic_reject_supersedes_claim_semantic_and_episode(mem: MsmMem, layers: Layers, tmp_path: Path) -> None:
    """A rejection supersedes the claim, the semantic state and the episode; the new ones carry the correction."""
    mem.ask(AGENT, "P1", _png(tmp_path, 1), "Any consolidation?", study_id="S1")
    (old_claim,) = layers.store.claims_active("P1")
    (old_sem,) = layers.store.semantic_active("P1")
    (old_ep,) = list(layers.store.iter_episodes())
    claim = layers.maintainer().critic_verdict(
        CRITIC, "P1", "S1", accept=False, correction=CORRECTION, decision="admit"
    )
    assert (claim.content, claim.evidence_tier, claim.confidence) == (CORRECTION, "critic", 1.0)
    assert claim.supersedes == old_claim.claim_id
    assert layers.store.get_claims([old_claim.claim_id])[0].state == State.SUPERSEDED
    assert layers.store.get_claims([old_claim.claim_id])[0].content == ANSWER  # never rewritten
    (sem,) = layers.store.semantic_active("P1")
    assert sem.supersedes == old_sem.state_id and sem.evidence_tier == "critic"
    assert [i.text for i in sem.impressions] == [CORRECTION]
    episodes = {e.episode_id: e for e in layers.store.iter_episodes()}
    assert episodes[old_ep.episode_id].state == State.SUPERSEDED and episodes[old_ep.episode_id].answer == ANSWER
    (new_ep,) = [e for e in episodes.values() if e.state == State.ACTIVE]
    assert (new_ep.answer, new_ep.evidence_tier, new_ep.decision) == (CORRECTION, "critic", "admit")
    assert new_ep.supersedes == old_ep.episode_id
    event = [e for e in audit_events(layers.store) if e.action == "critic_reject"][-1]
    named = {claim.claim_id, old_claim.claim_id, new_ep.episode_id, old_ep.episode_id, sem.state_id}
    assert named <= set(event.record_ids)
    assert event.role == "critic"


def test_critic_accept_raises_tier_without_changing_content(mem: MsmMem, layers: Layers, tmp_path: Path) -> None:
    """An accepted impression is superseded by a critic-tier claim with the same content."""
    mem.ask(AGENT, "P1", _png(tmp_path, 1), "Any consolidation?", study_id="S1")
    claim = layers.maintainer().critic_verdict(CRITIC, "P1", "S1", accept=True)
    assert (claim.content, claim.evidence_tier) == (ANSWER, "critic")
    history = layers.store.claim_history("P1", claim_key("S1", "Any consolidation?"))
    assert [c.state for c in history] == [State.SUPERSEDED, State.ACTIVE]


def test_critic_reject_needs_a_correction_and_a_claim(mem: MsmMem, layers: Layers, tmp_path: Path) -> None:
    """A rejection without a correction is invalid; a verdict on an unknown study is NotFound."""
    mem.ask(AGENT, "P1", _png(tmp_path, 1), "Any consolidation?", study_id="S1")
    with pytest.raises(InvalidInput):
        layers.maintainer().critic_verdict(CRITIC, "P1", "S1", accept=False)
    with pytest.raises(NotFound):
        layers.maintainer().critic_verdict(CRITIC, "P1", "S9", accept=True)


@pytest.mark.parametrize("accept", [False, True])
def test_critic_verdict_by_agent_role_is_refused(mem: MsmMem, layers: Layers, tmp_path: Path, accept: bool) -> None:
    """An agent cannot give a critic verdict (reject or accept): IllegalTransition, nothing written, denial audited."""
    mem.ask(AGENT, "P1", _png(tmp_path, 1), "Any consolidation?", study_id="S1")
    claims = layers.store.claim_history("P1", claim_key("S1", "Any consolidation?"))
    assert claims
    semantic = layers.store.semantic_history("P1", "impression")
    with pytest.raises(IllegalTransition):
        layers.maintainer().critic_verdict(
            Principal("agent-1", "agent"), "P1", "S1", accept=accept, correction=CORRECTION
        )
    assert layers.store.claim_history("P1", claim_key("S1", "Any consolidation?")) == claims
    assert layers.store.semantic_history("P1", "impression") == semantic
    last = audit_events(layers.store)[-1]
    assert (last.outcome, last.role, last.reason) == ("denied", "agent", "illegal_transition")


def test_critic_promotes_a_held_item(mem: MsmMem, layers: Layers, tmp_path: Path) -> None:
    """A critic's verdict on a study held in STM (not novel) consolidates it with the correction."""
    item_id = _held(mem, layers, tmp_path)
    episodes = layers.store.count("episodic")
    layers.maintainer().critic_verdict(CRITIC, "P1", "S2", accept=False, correction=CORRECTION)
    assert layers.store.stm_get([item_id])[0].state == StmState.CONSOLIDATED
    assert layers.store.count("episodic") == episodes + 1
    promoted = [e for e in layers.store.iter_episodes() if e.study_id == "S2"]
    assert len(promoted) == 1 and promoted[0].answer == CORRECTION and promoted[0].evidence_tier == "critic"
    assert [e.role for e in audit_events(layers.store) if e.action == "critic_promote"] == ["critic"]
    (claim,) = layers.store.claims_active("P1", claim_key("S2", "Any change?"))
    assert claim.supersedes is None  # the held answer was no claim: the verdict starts the chain
    assert claim.content == CORRECTION
    assert json.loads(claim.source)["episode"] == promoted[0].episode_id


@pytest.mark.parametrize("held", [False, True])
def test_second_verdict_corrects_the_corrected_episode(mem: MsmMem, layers: Layers, tmp_path: Path, held: bool) -> None:
    """A later rejection of the same study supersedes the episode the first verdict wrote."""
    if held:
        _held(mem, layers, tmp_path)
        study = "S2"
    else:
        mem.ask(AGENT, "P1", _png(tmp_path, 1), "Any consolidation?", study_id="S1")
        study = "S1"
    layers.maintainer().critic_verdict(CRITIC, "P1", study, accept=False, correction=CORRECTION)
    layers.maintainer().critic_verdict(
        CRITIC, "P1", study, accept=False, correction="Left lower lobe pneumonia instead"
    )
    active = [e for e in layers.store.iter_episodes() if e.study_id == study and e.state == State.ACTIVE]
    assert [e.answer for e in active] == ["Left lower lobe pneumonia instead"]
    asked = "Any change?" if held else "Any consolidation?"
    (claim,) = layers.store.claims_active("P1", claim_key(study, asked))
    assert json.loads(claim.source)["episode"] == active[0].episode_id


# erasure --------------------------------------------------------------------------------------


def test_shred_retracts_everything_of_one_patient(mem: MsmMem, layers: Layers, tmp_path: Path) -> None:
    """shred retracts the patient's LTM rows and derived graph, purges active STM, and audits
    with the reason; others intact."""
    _held(mem, layers, tmp_path)
    mem.ask(AGENT, "P2", _png(tmp_path, 5), "Any consolidation?", study_id="S1")
    with pytest.raises(IllegalTransition):
        layers.maintainer().shred(Principal("agent-1", "agent"), "P1", "request")
    with pytest.raises(InvalidInput):
        layers.maintainer().shred(Principal("root", "admin"), "P1", " ")
    assert layers.store.entities("P1") and layers.store.relationships("P1")
    p2_graph = (layers.store.entities("P2"), layers.store.relationships("P2"))
    receipt = layers.maintainer().shred(Principal("root", "admin"), "P1", "erasure request")
    assert receipt.records > 0
    assert layers.store.record_ids("episodic", "P1") == [] and layers.store.claims_active("P1") == []
    assert layers.store.entities("P1") == [] and layers.store.relationships("P1") == []
    assert (layers.store.entities("P2"), layers.store.relationships("P2")) == p2_graph
    assert all(i.state != StmState.ACTIVE for i in layers.store.stm_list(patient_id="P1"))
    assert layers.store.claims_active("P2")[0].content == ANSWER
    last = audit_events(layers.store)[-1]
    assert (last.action, last.role, last.reason, last.purpose) == ("retract", "admin", "erasure request", "erasure")
    assert layers.audit.verify().ok

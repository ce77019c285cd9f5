"""Tests of the governed tiers (msm_mem._memory.tiers): fail-closed transitions, short-term items,
consolidation, supersession of claims and semantic state, atomic turns."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from msm_mem import Principal, StmPayload
from msm_mem._api.mem import MsmMem
from msm_mem._errors import IllegalTransition, InvalidInput, NotFound
from msm_mem._memory.claim_evidence import claim_key
from msm_mem._records import State, new_id
from msm_mem._storage.base import Store, WriteBatch
from msm_mem._tier_records import ConsentRecord, StmChange, StmItem, StmState
from msm_mem._transitions import Trigger
from msm_mem.plugins.backbones.base import BackboneReply, BackboneRequest
from msm_mem.testing import FixedBackbone, FixedClock
from tests.conftest import MemFactory
from tests.helpers import ADMIN, audit_events
from tests.helpers import png as _png
from tests.layers import Layers, layers_of
from tests.tiers_support import AGENT, ANSWER, T0, _counts, _grant_auditor, _z


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock(T0)


@pytest.fixture
def mem(new_mem: MemFactory, clock: FixedClock) -> Iterator[MsmMem]:
    m = new_mem("s", clock=clock, backbone=FixedBackbone(ANSWER, "treat"))
    yield m
    m.close()


@pytest.fixture
def layers(mem: MsmMem, clock: FixedClock) -> Iterator[Layers]:
    """The governed tiers (and the store, audit log, maintainer) of ``mem``'s directory."""
    with layers_of(mem, clock) as built:
        yield built


def test_auditor_cannot_write_to_stm(mem: MsmMem, layers: Layers, tmp_path: Path) -> None:
    """A refused observe raises IllegalTransition, writes no STM and audits the denial."""
    _grant_auditor(mem)
    before = layers.store.audit_head()[0]
    turn = layers.gm.begin(Principal("aud-1", "auditor"), "P1")
    with pytest.raises(IllegalTransition):
        layers.gm.observe(turn, _z(layers, tmp_path, 1), "Any consolidation?")
    assert layers.store.stm_list() == []
    new = audit_events(layers.store)[before:]
    assert [(e.action, e.outcome) for e in new] == [("consent", "success"), ("write", "denied")]
    denied = new[-1]
    assert (denied.role, denied.source_tier, denied.target_tier, denied.reason) == (
        "auditor",
        "source",
        "stm",
        "illegal_transition",
    )
    assert turn.audit == []  # nothing of the refused turn is left to commit
    assert layers.audit.verify().ok


def test_auditor_cannot_consolidate(mem: MsmMem, layers: Layers, tmp_path: Path) -> None:
    """Consolidation by a role outside the table is refused before anything is staged into LTM."""
    _grant_auditor(mem)
    agent_turn = layers.gm.begin(AGENT, "P1")
    item = layers.gm.observe(agent_turn, _z(layers, tmp_path, 1), "Any consolidation?")
    layers.gm.commit(agent_turn)
    counts = _counts(layers.store)
    turn = layers.gm.begin(Principal("aud-1", "auditor"), "P1")
    with pytest.raises(IllegalTransition):
        layers.gm.consolidate(turn, item, ANSWER)
    assert not turn.batch.episodes and not turn.batch.claims and not turn.batch.semantic
    assert _counts(layers.store) == counts
    last = audit_events(layers.store)[-1]
    assert (last.action, last.outcome, last.source_tier, last.target_tier) == ("consolidate", "denied", "stm", "ltm")


def test_illegal_trigger_is_refused_even_for_admin(mem: MsmMem, layers: Layers, tmp_path: Path) -> None:
    """A consolidation trigger that is not in the table is refused for every caller."""
    mem.grant(ADMIN, [ConsentRecord(new_id("C"), "*", "role:admin", "treatment", "permit", ("*",), 0.0, created_at=T0)])
    turn = layers.gm.begin(Principal("root", "admin"), "P1")
    with pytest.raises(IllegalTransition):
        layers.gm.observe(turn, _z(layers, tmp_path, 1), "q?")  # admin is not a writer
    turn = layers.gm.begin(AGENT, "P1")
    item = layers.gm.observe(turn, _z(layers, tmp_path, 1), "q?")
    with pytest.raises(IllegalTransition):
        layers.gm.consolidate(turn, item, ANSWER, trigger=Trigger.SUPERSEDE)  # not a stm -> ltm trigger
    assert audit_events(layers.store)[-1].outcome == "denied"
    with pytest.raises(IllegalTransition):
        layers.gm.consolidate(turn, item, ANSWER, trigger="rewrite")  # type: ignore[arg-type]
    assert audit_events(layers.store)[-1].outcome == "denied"


def test_auditor_may_read(mem: MsmMem, layers: Layers, tmp_path: Path) -> None:
    """Reads are open to the auditor role and are audited with the ids returned."""
    mem.ask(AGENT, "P1", _png(tmp_path, 1), "Any consolidation?")
    _grant_auditor(mem)
    turn = layers.gm.begin(Principal("aud-1", "auditor"), "P1")
    ranked = layers.gm.retrieve(turn, _z(layers, tmp_path, 2))
    layers.gm.commit(turn)
    ids = tuple(h.id for h, _ in ranked.ranked)
    assert len(ids) == 3
    assert audit_events(layers.store)[-1].action == "read" and audit_events(layers.store)[-1].record_ids == ids


# short-term memory -------------------------------------------------------------------------


def test_stm_item_needs_scope_and_positive_ttl() -> None:
    """A short-term item without a patient or with expires_at <= created_at is refused."""
    with pytest.raises(InvalidInput):
        StmItem("M-1", "", "interaction", StmPayload("q", T0), T0, T0 + 1)
    with pytest.raises(InvalidInput):
        StmItem("M-1", "P1", "interaction", StmPayload("q", T0), T0, T0)


def test_observe_writes_scoped_item_with_ttl(mem: MsmMem, layers: Layers, tmp_path: Path, clock: FixedClock) -> None:
    """observe lands the turn in STM with the patient scope, embedding and a TTL from settings."""
    turn = layers.gm.begin(AGENT, "P1")
    z = _z(layers, tmp_path, 1)
    item = layers.gm.observe(turn, z, "Any consolidation?", study_id="S1")
    assert layers.store.stm_list() == []  # nothing before commit
    layers.gm.commit(turn)
    (stored,) = layers.store.stm_list()
    assert stored.item_id == item.item_id and stored.patient_id == "P1" and stored.state == StmState.ACTIVE
    assert stored.expires_at == clock.now() + mem.settings.stm_ttl_s
    assert stored.z is not None and np.allclose(stored.z, z) and stored.actor == AGENT.id
    assert stored.payload is not None and stored.payload.question == "Any consolidation?"
    event = audit_events(layers.store)[-1]
    assert (event.action, event.source_tier, event.target_tier, event.record_ids) == (
        "write",
        "source",
        "stm",
        (item.item_id,),
    )


def test_observe_refuses_an_empty_question(layers: Layers, tmp_path: Path) -> None:
    """An empty question is invalid input and stages nothing."""
    turn = layers.gm.begin(AGENT, "P1")
    with pytest.raises(InvalidInput):
        layers.gm.observe(turn, _z(layers, tmp_path, 1), "   ")
    assert not turn.batch.stm


def test_stm_change_refresh_keeps_an_item_past_its_ttl(
    mem: MsmMem, layers: Layers, tmp_path: Path, clock: FixedClock
) -> None:
    """A StmChange ACTIVE->ACTIVE with expires_at (what GovernedMemory.refresh writes) extends the TTL."""
    mem.ask(AGENT, "P1", _png(tmp_path, 1), "Any consolidation?")
    mem.ask(AGENT, "P1", _png(tmp_path, 1), "Again?")  # held: not novel, stays ACTIVE
    held = layers.store.stm_list(state=StmState.ACTIVE)[0]
    later = held.expires_at + 3600
    refresh = StmChange(held.item_id, StmState.ACTIVE, StmState.ACTIVE, expires_at=later)
    layers.store.write(WriteBatch(stm_changes=[refresh]))
    clock.advance(mem.settings.stm_ttl_s + 1)
    assert layers.maintainer().expire() == 0
    assert layers.store.stm_get([held.item_id])[0].expires_at == later


def test_stm_change_expecting_wrong_state_is_refused(mem: MsmMem, layers: Layers, tmp_path: Path) -> None:
    """A consolidated item cannot be flipped again (the store checks the expected state)."""
    mem.ask(AGENT, "P1", _png(tmp_path, 1), "Any consolidation?")
    (item,) = layers.store.stm_list()
    assert item.state == StmState.CONSOLIDATED
    with pytest.raises(IllegalTransition):
        layers.store.write(WriteBatch(stm_changes=[StmChange(item.item_id, StmState.ACTIVE, StmState.EXPIRED)]))


def test_consolidated_and_held_items(mem: MsmMem, layers: Layers, tmp_path: Path) -> None:
    """A novel answer is consolidated (STM CONSOLIDATED and emptied, episode + visual); a repeat
    image is held ACTIVE with its content."""
    first = mem.ask(AGENT, "P1", _png(tmp_path, 1), "Any consolidation?", study_id="S1")
    second = mem.ask(AGENT, "P1", _png(tmp_path, 1), "Again?", study_id="S2")
    assert first.gate is not None and first.gate.written
    assert second.gate is not None and not second.gate.written and "not_novel" in second.gate.reasons
    items = {i.state: i for i in layers.store.stm_list()}
    assert sorted(items) == [StmState.ACTIVE, StmState.CONSOLIDATED]
    # the consolidated item moved to long-term memory: no second, undecayed copy stays in STM
    assert items[StmState.CONSOLIDATED].payload is None and items[StmState.CONSOLIDATED].z is None
    assert items[StmState.ACTIVE].payload is not None and items[StmState.ACTIVE].payload.study_id == "S2"
    assert layers.store.get_episodes(layers.store.record_ids("episodic", "P1"))[0].study_id == "S1"
    assert layers.store.count("episodic") == layers.store.count("visual") == 1
    held = [e for e in audit_events(layers.store) if e.action == "hold"]
    assert len(held) == 1 and held[0].reason == "not_novel"
    # the held item keeps its answer so a critic or the age sweep can promote it later
    held = layers.store.stm_list(state=StmState.ACTIVE)[0].payload
    assert held is not None and held.answer == ANSWER


# long-term memory: supersession -----------------------------------------------------------


def test_semantic_state_and_claim_superseded_every_turn(mem: MsmMem, layers: Layers, tmp_path: Path) -> None:
    """Each written answer adds a semantic version superseding the last and supersedes the
    claim of its question about its study; old rows stay."""
    for i, study in enumerate(["S1", "S2", "S1"]):
        mem.ask(AGENT, "P1", _png(tmp_path, i + 1), "Any effusion?", study_id=study)
    history = layers.store.semantic_history("P1", "impression")
    assert [s.version for s in history] == [1, 2, 3]
    assert [s.state for s in history] == [State.SUPERSEDED, State.SUPERSEDED, State.ACTIVE]
    assert [s.supersedes for s in history] == [None, history[0].state_id, history[1].state_id]
    claims = layers.store.claim_history("P1", claim_key("S1", "Any effusion?"))
    assert [c.state for c in claims] == [State.SUPERSEDED, State.ACTIVE]
    assert claims[1].supersedes == claims[0].claim_id
    assert len(layers.store.claims_active("P1")) == 2


def test_claims_of_different_questions_about_one_study_stand_apart(mem: MsmMem, layers: Layers, tmp_path: Path) -> None:
    """Answers to two questions about one study are two claims, neither superseding the other;
    a verdict must name its question when both are open, and supersedes that claim only."""
    icu, survived = "Is the patient in the ICU?", "Did the patient survive?"
    mem.ask(AGENT, "P1", _png(tmp_path, 1), icu, study_id="S1")
    mem.ask(AGENT, "P1", _png(tmp_path, 2), survived, study_id="S1")
    active = {c.key: c for c in layers.store.claims_active("P1")}
    assert sorted(active) == sorted([claim_key("S1", icu), claim_key("S1", survived)])
    assert all(c.supersedes is None for c in active.values())
    critic = Principal("rad-1", "critic")
    with pytest.raises(InvalidInput, match="2 questions") as refused:
        mem.feedback(critic, "P1", "S1", accept=False, correction="Not in the ICU, ward care.")
    assert claim_key("S1", icu) in str(refused.value) and claim_key("S1", survived) in str(refused.value)
    assert "ICU" not in str(refused.value)  # the message names keys, never a question's text
    verdict = mem.feedback(
        critic, "P1", "S1", accept=False, correction="Not in the ICU, ward care.", question="is the patient in the icu"
    )
    assert verdict.key == claim_key("S1", icu) and verdict.supersedes == active[claim_key("S1", icu)].claim_id
    after = {c.key: c for c in layers.store.claims_active("P1")}
    assert after[claim_key("S1", survived)] == active[claim_key("S1", survived)]
    assert after[claim_key("S1", icu)].content == "Not in the ICU, ward care."
    with pytest.raises(NotFound, match="no answer to that question"):
        mem.feedback(critic, "P1", "S1", accept=True, question="Was a chest drain placed?")


def test_store_refuses_a_second_active_claim(mem: MsmMem, layers: Layers, tmp_path: Path) -> None:
    """Writing a claim for an active key without superseding it fails and stores nothing."""
    from msm_mem._tier_records import Claim

    mem.ask(AGENT, "P1", _png(tmp_path, 1), "Any consolidation?", study_id="S1")
    seq = layers.store.audit_head()[0]
    key = claim_key("S1", "Any consolidation?")
    rogue = Claim(new_id("C"), "P1", key, "rewritten", "{}", 0.5, "agent", T0)
    with pytest.raises(IllegalTransition):
        layers.store.write(WriteBatch(claims=[rogue]))
    assert len(layers.store.claim_history("P1", key)) == 1
    assert layers.store.audit_head()[0] == seq


# property: supersession never rewrites, at most one ACTIVE version --------------------------

_STEP = st.one_of(
    st.tuples(st.just("ask"), st.sampled_from(["P1", "P2"]), st.integers(0, 3), st.sampled_from(["S1", "S2", "S3"])),
    st.tuples(st.just("verdict"), st.sampled_from(["P1", "P2"]), st.booleans(), st.sampled_from(["S1", "S2", "S3"])),
)


def _snapshot(s: Store) -> dict[str, tuple[str, str]]:
    """id -> (state, content) of every claim, episode and semantic version."""
    out: dict[str, tuple[str, str]] = {}
    for p in ("P1", "P2"):
        for x in ("S1", "S2", "S3"):
            for c in s.claim_history(p, claim_key(x, f"Question about {x}?")):
                out[c.claim_id] = (c.state.value, c.content)
    for e in s.iter_episodes():
        out[e.episode_id] = (e.state.value, e.answer)
    for v in s.iter_semantic():
        out[v.state_id] = (v.state.value, repr(v.impressions))
    return out


def _check_invariants(s: Store, before: dict[str, tuple[str, str]]) -> dict[str, tuple[str, str]]:
    for p in ("P1", "P2"):
        for x in ("S1", "S2", "S3"):
            key = claim_key(x, f"Question about {x}?")
            history = s.claim_history(p, key)
            active = [c for c in history if c.state == State.ACTIVE]
            assert len(active) == (1 if history else 0)
            assert len(s.claims_active(p, key)) == len(active)
            for older, newer in zip(history, history[1:], strict=False):
                assert newer.supersedes == older.claim_id and older.state == State.SUPERSEDED
        sem = s.semantic_history(p, "impression")
        assert len([v for v in sem if v.state == State.ACTIVE]) == (1 if sem else 0)
        assert len(s.semantic_active(p)) <= 1
        assert [v.version for v in sem] == list(range(1, len(sem) + 1))
    after = _snapshot(s)
    for rid, (state, content) in before.items():
        assert rid in after, f"{rid} disappeared"
        new_state, new_content = after[rid]
        assert new_content == content, f"{rid} rewritten in place"
        assert (state, new_state) in {("active", "active"), ("active", "superseded"), ("superseded", "superseded")}
    return after


#: examples of the property per backend (a PostgreSQL store costs a schema per example)
SUPERSESSION_EXAMPLES = {"sqlite": 25, "postgres": 8}


def test_supersession_property(new_mem: MemFactory, backend: str, tmp_path: Path) -> None:
    """Over any asks and critic verdicts: one ACTIVE claim per key and semantic state per patient,
    linear supersession chains, and no stored row ever changes its content."""
    folder = tmp_path / "images"
    folder.mkdir()
    made = iter(range(10**6))

    @settings(max_examples=SUPERSESSION_EXAMPLES[backend], suppress_health_check=[HealthCheck.too_slow])
    @given(steps=st.lists(_STEP, min_size=1, max_size=8))
    def check(steps: list[tuple[str, str, object, str]]) -> None:
        clock = FixedClock(T0)
        mem = new_mem(f"s{next(made)}", clock=clock, backbone=FixedBackbone(ANSWER, "treat"))
        try:
            with layers_of(mem, clock) as layers:
                snap = _snapshot(layers.store)
                for kind, patient, arg, study in steps:
                    if kind == "ask":
                        mem.ask(AGENT, patient, _png(folder, int(arg)), f"Question about {study}?", study_id=study)  # type: ignore[call-overload]
                    else:
                        try:
                            layers.maintainer().critic_verdict(
                                Principal("rad-1", "critic"),
                                patient,
                                study,
                                accept=bool(arg),
                                correction="Right lower lobe consolidation",
                            )
                        except NotFound:
                            pass  # no claim for that study yet
                    clock.advance(60)
                    snap = _check_invariants(layers.store, snap)
                assert layers.audit.verify().ok
        finally:
            mem.close()

    check()


# agent failure paths: typed error, nothing written, reads and the error audited ---------------


def test_refresh_extends_an_active_item(new_mem: MemFactory, clock: FixedClock) -> None:
    """refresh moves expires_at forward from now and is audited; another patient's item is refused."""
    mem = new_mem("r", clock=clock)
    with layers_of(mem, clock) as layers:
        gm, agent = layers.gm, Principal("agent-1", "agent")
        turn = gm.begin(agent, "P1")
        item = gm.observe(turn, np.ones(1024, dtype=np.float32), "q?")
        gm.commit(turn)
        clock.advance(100)
        turn = gm.begin(agent, "P1")
        expires = gm.refresh(turn, item.item_id, ttl_s=500)
        gm.commit(turn)
        assert expires == clock.now() + 500 and layers.store.stm_get([item.item_id])[0].expires_at == expires
        other = gm.begin(agent, "P2")
        with pytest.raises(IllegalTransition):
            gm.refresh(other, item.item_id)


def test_cross_scope_copy_needs_admin_and_reason(new_mem: MemFactory, clock: FixedClock) -> None:
    """Copying an STM item to another patient's scope is refused for agents and without a reason."""
    mem = new_mem("x", clock=clock)
    with layers_of(mem, clock) as layers:
        gm = layers.gm
        turn = gm.begin(Principal("agent-1", "agent"), "P1")
        item = gm.observe(turn, np.ones(1024, dtype=np.float32), "q?")
        gm.commit(turn)
        with pytest.raises(IllegalTransition):
            gm.cross_scope_copy(gm.begin(Principal("agent-1", "agent"), "P2"), item.item_id, reason="merge")
        mem.grant(ADMIN, [ConsentRecord("C-admin", "*", "role:admin", "treatment", "permit", ("*",), 0.0)])
        with pytest.raises(IllegalTransition):
            gm.cross_scope_copy(gm.begin(Principal("root", "admin"), "P2"), item.item_id, reason=" ")
        turn = gm.begin(Principal("root", "admin"), "P2")
        copy = gm.cross_scope_copy(turn, item.item_id, reason="duplicate patient record merge")
        gm.commit(turn)
        stored = layers.store.stm_get([copy.item_id])[0]
        assert stored.patient_id == "P2" and stored.payload == layers.store.stm_get([item.item_id])[0].payload


class _EffusionBackbone:
    name = "effusion"

    def generate(self, request: BackboneRequest) -> BackboneReply:
        return BackboneReply("Small right pleural effusion. No pneumothorax.", source="fake")


def test_claims_derive_finding_entities_and_relationships(
    new_mem: MemFactory, tmp_path: Path, clock: FixedClock
) -> None:
    """A claim's findings become the patient's entities once, each linked by asserts / negates."""
    mem = new_mem("e", clock=clock, backbone=_EffusionBackbone())
    with layers_of(mem, clock) as layers:
        mem.ask(AGENT, "P1", _png(tmp_path, 1), "Any effusion?", study_id="S1")
        mem.ask(AGENT, "P1", _png(tmp_path, 2), "Any effusion?", study_id="S2")
        entities = {e.name: e for e in layers.store.entities("P1")}
        assert set(entities) == {"Pleural Effusion", "Pneumothorax"}
        links = layers.store.relationships("P1")
        claims = {c.claim_id for c in layers.store.claims_active("P1")}
        assert len(links) == 4 and {r.source_id for r in links} == claims
        kinds = {(r.target_id, r.type) for r in links}
        assert kinds == {
            (entities["Pleural Effusion"].entity_id, "asserts"),
            (entities["Pneumothorax"].entity_id, "negates"),
        }
        assert layers.store.entities("P2") == []


def test_commit_many_refuses_two_turns_of_one_patient(layers: Layers, tmp_path: Path) -> None:
    """Turns staged against the same stored state cannot share a transaction: refused, nothing written."""
    gm = layers.gm
    turns = []
    for seed in (1, 2):
        turn = gm.begin(AGENT, "P1")
        item = gm.observe(turn, _z(layers, tmp_path, seed), "Any effusion?", study_id=f"S{seed}")
        gm.consolidate(turn, item, ANSWER)
        turns.append(turn)
    before = _counts(layers.store)
    with pytest.raises(InvalidInput, match="different patients"):
        gm.commit_many(turns)
    assert _counts(layers.store) == before
    gm.commit_many(turns[:1])
    assert layers.store.count("episodic") == 1

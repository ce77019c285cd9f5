"""Tests of critic verdicts propagating (msm_mem._memory.corrections, propagation, claims): a
rejected answer never reaches the backbone again, through any kind of record, on either store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from msm_mem import MsmMem
from msm_mem._memory.claim_evidence import claim_key
from msm_mem._records import State
from msm_mem.plugins.backbones.base import BackboneReply, BackboneRequest
from msm_mem.testing import FixedClock
from tests.conftest import MemFactory
from tests.helpers import AGENT, CRITIC, png
from tests.layers import Views


@pytest.fixture
def views() -> Iterator[Views]:
    """Handles of their own on the stores a test opens (``tests/layers.py``), closed after it."""
    with Views() as opened:
        yield opened


T0 = 1_700_000_000.0
DAY = 86_400.0
WRONG = "Large right pneumothorax with mediastinal shift"
RIGHT = "Left lower lobe consolidation, pneumonia"
FLAGS = {
    "semantic": {"use_epi": False, "use_vis": False},
    "episodic": {"use_sem": False, "use_vis": False},
    "visual": {"use_sem": False, "use_epi": False},
    "claim": {"use_epi": False, "use_vis": False},
}


class Scripted:
    """Answers with ``answer`` and records every request it is given."""

    name = "scripted"

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.requests: list[BackboneRequest] = []

    def generate(self, request: BackboneRequest) -> BackboneReply:
        self.requests.append(request)
        return BackboneReply(self.answer, source="memory")


def seen(request: BackboneRequest) -> str:
    """Everything a backbone was given, as one text."""
    texts = [request.prompt] + [f"{c.text} {c.decision}" for c in (*request.candidates, *request.prior)]
    return "\n".join(texts)


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock(T0)


@pytest.fixture
def bb() -> Scripted:
    return Scripted(WRONG)


@pytest.fixture
def mem(new_mem: MemFactory, clock: FixedClock, bb: Scripted) -> Iterator[MsmMem]:
    m = new_mem("s", clock=clock, backbone=bb)
    yield m
    m.close()


def ask(mem: MsmMem, tmp_path: Path, seed: int, study: str, when: float, patient: str = "P1", **flags: bool) -> None:
    mem.ask(AGENT, patient, png(tmp_path, seed), f"Findings of {study}?", timestamp=when, study_id=study, **flags)


@pytest.mark.parametrize("kind", sorted(FLAGS))
def test_a_rejected_answer_never_reaches_the_backbone_again(
    mem: MsmMem, bb: Scripted, tmp_path: Path, kind: str
) -> None:
    """After a rejection the wrong answer is in no prompt line and no candidate of any kind; the
    correction is what each kind of record carries."""
    ask(mem, tmp_path, 1, "S1", T0 - 30 * DAY)
    mem.feedback(CRITIC, "P1", "S1", accept=False, correction=RIGHT)
    bb.requests.clear()
    ask(mem, tmp_path, 1, "S2", T0, write_back=False, **FLAGS[kind])
    (request,) = bb.requests
    assert WRONG not in seen(request)
    mine = [c for c in request.candidates if c.kind == kind]
    assert mine and all(c.text == RIGHT for c in mine), request.candidates


def test_the_visual_record_follows_its_corrected_episode(mem: MsmMem, tmp_path: Path) -> None:
    """The visual record of a corrected episode is superseded by one pointing at the critic's copy."""
    ask(mem, tmp_path, 1, "S1", T0 - 30 * DAY)
    mem.feedback(CRITIC, "P1", "S1", accept=False, correction=RIGHT)
    episodes = {e.episode_id: e for e in mem.episodes(CRITIC, "P1")}
    visuals = mem.visuals(CRITIC, "P1")
    (live,) = [v for v in visuals if v.state == State.ACTIVE]
    (old,) = [v for v in visuals if v.state == State.SUPERSEDED]
    assert live.supersedes == old.visual_id and live.evidence_tier == "critic"
    assert episodes[live.source_episode_id].answer == RIGHT and episodes[live.source_episode_id].state == State.ACTIVE
    assert episodes[old.source_episode_id].state == State.SUPERSEDED


def test_every_unverified_answer_of_the_study_is_superseded(mem: MsmMem, bb: Scripted, tmp_path: Path) -> None:
    """Two consolidated answers and a held one about one study: a verdict leaves none of them live."""
    ask(mem, tmp_path, 1, "S1", T0 - 30 * DAY)
    ask(mem, tmp_path, 2, "S1", T0 - 30 * DAY)  # another image of the study: consolidated again
    ask(mem, tmp_path, 2, "S1", T0 - 30 * DAY)  # the same image: held by the gate
    mem.feedback(CRITIC, "P1", "S1", accept=False, correction=RIGHT)
    live = [e for e in mem.episodes(CRITIC, "P1") if e.state == State.ACTIVE]
    assert [(e.answer, e.evidence_tier) for e in live] == [(RIGHT, "critic")]
    assert [v.evidence_tier for v in mem.visuals(CRITIC, "P1") if v.state == State.ACTIVE] == ["critic"]
    held = [i for i in mem.stm_items(CRITIC, "P1") if i.state.value == "active" and i.payload is not None]
    assert all(i.payload.answer != WRONG for i in held if i.payload is not None)
    bb.requests.clear()
    ask(mem, tmp_path, 3, "S2", T0, write_back=False)
    assert WRONG not in seen(bb.requests[-1])


def test_the_consolidated_answer_carries_the_verdict_and_held_ones_are_discarded(mem: MsmMem, tmp_path: Path) -> None:
    """A question with a consolidated answer and two held ones: the critic's copy of the
    consolidated episode carries the verdict, and both held answers of the question go."""
    ask(mem, tmp_path, 1, "S1", T0 - 30 * DAY)
    ask(mem, tmp_path, 1, "S1", T0 - 30 * DAY)  # held
    ask(mem, tmp_path, 1, "S1", T0 - 30 * DAY)  # held
    mem.feedback(CRITIC, "P1", "S1", accept=False, correction=RIGHT)
    states = sorted(i.state.value for i in mem.stm_items(CRITIC, "P1"))
    assert states == ["consolidated", "discarded", "discarded"]
    live = [e for e in mem.episodes(CRITIC, "P1") if e.state == State.ACTIVE]
    assert [(e.answer, e.evidence_tier) for e in live] == [(RIGHT, "critic")]


def test_a_held_answer_alone_is_promoted_by_the_verdict(mem: MsmMem, tmp_path: Path) -> None:
    """An answer the gate held is no claim; a verdict on its question promotes the held item
    with the verdict's text and starts the question's claim at the critic's tier."""
    ask(mem, tmp_path, 1, "S1", T0 - 30 * DAY)
    ask(mem, tmp_path, 1, "S2", T0)  # the same image: not novel, held
    assert [c.key for c in mem.claims(CRITIC, "P1")] == [claim_key("S1", "Findings of S1?")]
    claim = mem.feedback(CRITIC, "P1", "S2", accept=False, correction=RIGHT)
    assert (claim.key, claim.content, claim.evidence_tier, claim.supersedes) == (
        claim_key("S2", "Findings of S2?"),
        RIGHT,
        "critic",
        None,
    )
    s2 = [e for e in mem.episodes(CRITIC, "P1") if e.study_id == "S2"]
    assert [(e.answer, e.evidence_tier, e.state) for e in s2] == [(RIGHT, "critic", State.ACTIVE)]
    assert sorted(i.state.value for i in mem.stm_items(CRITIC, "P1")) == ["consolidated", "consolidated"]


def test_the_rejected_finding_leaves_the_knowledge_graph(mem: MsmMem, tmp_path: Path, views: Views) -> None:
    """The rejected claim's relationships are superseded, and so is the finding no active claim names."""
    ask(mem, tmp_path, 1, "S1", T0 - 30 * DAY)
    store = views(mem).store
    before = {e.name for e in store.entities("P1")}
    assert "Pneumothorax" in before
    mem.feedback(CRITIC, "P1", "S1", accept=False, correction=RIGHT)
    names = {e.entity_id: e.name for e in store.entities("P1")}
    assert "Pneumothorax" not in names.values() and "Consolidation" in names.values()
    (claim,) = mem.claims(CRITIC, "P1")
    rels = store.relationships("P1")
    assert rels and {r.source_id for r in rels} == {claim.claim_id}
    assert {names[r.target_id] for r in rels} >= {"Consolidation", "Pneumonia"}


def test_a_finding_another_claim_asserts_stays(mem: MsmMem, bb: Scripted, tmp_path: Path, views: Views) -> None:
    """A finding entity still named by another study's active claim is not retired with the rejected one."""
    ask(mem, tmp_path, 1, "S1", T0 - 60 * DAY)
    ask(mem, tmp_path, 2, "S2", T0 - 30 * DAY)
    mem.feedback(CRITIC, "P1", "S2", accept=False, correction=RIGHT)
    assert "Pneumothorax" in {e.name for e in views(mem).store.entities("P1")}


def test_a_rejected_answer_is_no_population_experience(new_mem: MemFactory, clock: FixedClock, tmp_path: Path) -> None:
    """Another patient's population read finds the correction, never the rejected answer."""
    bb = Scripted(WRONG)
    mem = new_mem("p", clock=clock, backbone=bb)
    ask(mem, tmp_path, 1, "S1", T0 - 30 * DAY)
    mem.feedback(CRITIC, "P1", "S1", accept=False, correction=RIGHT)
    bb.requests.clear()
    ask(mem, tmp_path, 1, "S9", T0, patient="P2", write_back=False)
    (request,) = bb.requests
    assert request.prior and all(c.text == RIGHT for c in request.prior)
    assert WRONG not in seen(request)


def test_an_accepted_answer_is_lifted_to_the_critic_tier(mem: MsmMem, tmp_path: Path) -> None:
    """Accepting supersedes the episode and visual record by critic-tier copies of the same answer."""
    ask(mem, tmp_path, 1, "S1", T0 - 30 * DAY)
    mem.feedback(CRITIC, "P1", "S1", accept=True)
    (e,) = [e for e in mem.episodes(CRITIC, "P1") if e.state == State.ACTIVE]
    (v,) = [v for v in mem.visuals(CRITIC, "P1") if v.state == State.ACTIVE]
    assert (e.answer, e.evidence_tier, e.confidence) == (WRONG, "critic", 1.0)
    assert (v.source_episode_id, v.evidence_tier) == (e.episode_id, "critic")


def test_a_second_verdict_judges_the_critics_copy(mem: MsmMem, bb: Scripted, tmp_path: Path) -> None:
    """A later verdict on the same study supersedes the first correction in every record."""
    ask(mem, tmp_path, 1, "S1", T0 - 30 * DAY)
    mem.feedback(CRITIC, "P1", "S1", accept=False, correction=WRONG + " reconsidered")
    mem.feedback(CRITIC, "P1", "S1", accept=False, correction=RIGHT)
    bb.requests.clear()
    ask(mem, tmp_path, 2, "S2", T0, write_back=False)
    assert WRONG not in seen(bb.requests[-1])
    assert [e.answer for e in mem.episodes(CRITIC, "P1") if e.state == State.ACTIVE] == [RIGHT]


def test_a_verdict_leaves_the_answers_to_the_studys_other_questions(mem: MsmMem, bb: Scripted, tmp_path: Path) -> None:
    """Two questions about one study, each with a consolidated and a held answer: a verdict on
    one question supersedes its records and discards its held answer only; the other
    question's episode, claim, impression and held answer stay as they were."""
    other, effusion = "Any pleural effusion?", "Small left pleural effusion, no pneumothorax"
    for image in (1, 1):  # the second time the same image: held
        bb.answer = WRONG
        mem.ask(AGENT, "P1", png(tmp_path, image), "Findings of S1?", timestamp=T0 - 30 * DAY, study_id="S1")
        bb.answer = effusion
        mem.ask(AGENT, "P1", png(tmp_path, image + 1), other, timestamp=T0 - 30 * DAY, study_id="S1")
    before = {c.key: c for c in mem.claims(CRITIC, "P1")}
    (state_before,) = mem.semantic_state(CRITIC, "P1")
    mem.feedback(CRITIC, "P1", "S1", accept=False, correction=RIGHT, question="findings of s1")
    held = [i for i in mem.stm_items(CRITIC, "P1") if i.state.value == "active"]
    assert [i.payload.question for i in held if i.payload is not None] == [other]
    after = {c.key: c for c in mem.claims(CRITIC, "P1")}
    assert after[claim_key("S1", other)] == before[claim_key("S1", other)]
    assert after[claim_key("S1", "Findings of S1?")].content == RIGHT
    live = [(e.question, e.answer, e.evidence_tier) for e in mem.episodes(CRITIC, "P1") if e.state == State.ACTIVE]
    assert sorted(live) == sorted([(other, effusion, "agent"), ("Findings of S1?", RIGHT, "critic")])
    (state,) = mem.semantic_state(CRITIC, "P1")
    assert sorted(i.text for i in state.impressions) == sorted([effusion, RIGHT])
    assert sorted(i.text for i in state_before.impressions) == sorted([WRONG, effusion])


def test_a_claim_of_an_earlier_version_is_judged_by_its_study(mem: MsmMem, tmp_path: Path, views: Views) -> None:
    """A claim keyed by its study alone (``study:<id>``, written by an earlier version) is the
    study's answer to no particular question: a verdict with or without a question supersedes
    it, keeping its key."""
    import json

    from msm_mem._records import new_id
    from msm_mem._storage.base import WriteBatch
    from msm_mem._tier_records import Claim

    ask(mem, tmp_path, 1, "S1", T0 - 30 * DAY)  # the patient and its data key exist
    source = json.dumps({"by": "agent", "stm": "", "episode": "", "time": T0 - 10 * DAY})
    legacy = Claim(new_id("C"), "P1", "study:S9", WRONG, source, 0.6, "agent", T0)
    views(mem).store.write(WriteBatch(claims=[legacy]))
    first = mem.feedback(CRITIC, "P1", "S9", accept=False, correction=RIGHT, question="Any new finding?")
    assert (first.key, first.content, first.supersedes) == ("study:S9", RIGHT, legacy.claim_id)
    second = mem.feedback(CRITIC, "P1", "S9", accept=True)
    assert (second.key, second.content, second.supersedes) == ("study:S9", RIGHT, first.claim_id)

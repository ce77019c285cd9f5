"""Tests of the memory-conditioned nonparametric backbone (a weighted vote over evidence)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from msm_mem.plugins.backbones import (
    Backbone,
    BackboneReply,
    BackboneRequest,
    Candidate,
    get_backbone,
)
from msm_mem.plugins.backbones.nonparametric import EMPTY_ANSWER, NonparametricBackbone


def c(id_: str, text: str, weight: float, time: float = 0.0, kind: str = "episodic", decision: str = "") -> Candidate:
    return Candidate(id_, kind, text, decision, weight, time)


def ask(*cands: Candidate, prior: tuple[Candidate, ...] = (), semantic_weight: float = 1.0) -> BackboneReply:
    return NonparametricBackbone(semantic_weight).generate(BackboneRequest("prompt", "question?", tuple(cands), prior))


def test_registry_and_protocol() -> None:
    """get_backbone('nonparametric') gives a Backbone named 'nonparametric'."""
    backbone = get_backbone("nonparametric", semantic_weight=2.0)
    assert isinstance(backbone, NonparametricBackbone) and isinstance(backbone, Backbone)
    assert backbone.name == "nonparametric" and backbone.semantic_weight == 2.0


def test_total_weight_beats_single_strongest() -> None:
    """Two weaker votes for one answer (0.5 + 0.5) beat one stronger vote (0.9) for another."""
    reply = ask(c("E-1", "effusion", 0.9), c("E-2", "pneumonia", 0.5), c("E-3", "Pneumonia", 0.5))
    assert reply.answer in ("pneumonia", "Pneumonia") and reply.cited == ("E-2", "E-3")
    assert reply.confidence == pytest.approx(1.0 / 1.9) and reply.source == "memory"


def test_answers_are_grouped_case_and_space_insensitively() -> None:
    """'No  acute Findings' and 'no acute findings' are one answer shown as the latest text."""
    reply = ask(
        c("E-1", "No  acute Findings", 0.4, time=1),
        c("E-2", "no acute findings ", 0.4, time=5),
        c("E-3", "cardiomegaly", 0.7, time=9),
    )
    assert reply.answer == "no acute findings" and reply.cited == ("E-1", "E-2")


def test_negative_weights_do_not_subtract() -> None:
    """A negative ranking weight counts as 0, it cannot vote against an answer."""
    reply = ask(c("E-1", "a", 0.3), c("E-2", "b", 0.2), c("E-3", "a", -5.0))
    assert reply.answer == "a" and reply.cited == ("E-1", "E-3")
    assert reply.confidence == pytest.approx(0.3 / 0.5)


def test_semantic_weight_scales_the_latest_semantic_impression_only() -> None:
    """The most recent semantic candidate votes with its weight times semantic_weight, never a fixed bonus."""
    cands = (
        c("E-1", "effusion", 0.8, time=3),
        c("S-old", "consolidation", 0.5, time=1, kind="semantic"),
        c("S-new", "improving consolidation", 0.5, time=2, kind="semantic", decision="follow-up"),
    )
    reply = ask(*cands, semantic_weight=2.0)
    assert reply.answer == "improving consolidation" and reply.cited == ("S-new",)
    assert reply.decision == "follow-up"
    assert reply.confidence == pytest.approx(1.0 / 2.3)
    assert ask(*cands, semantic_weight=1.0).answer == "effusion"  # its own weight: 0.5 < 0.8
    assert ask(*cands, semantic_weight=0.0).answer == "effusion"


def test_an_unranked_semantic_impression_has_no_vote() -> None:
    """A semantic candidate of weight 0 (an impression its rank gives nothing) cannot outvote ranked evidence."""
    cands = (c("E-1", "effusion", 0.01, time=1), c("S-1", "pneumothorax", 0.0, time=2, kind="semantic"))
    assert ask(*cands, semantic_weight=5.0).answer == "effusion"


def test_population_prior_used_only_without_patient_evidence() -> None:
    """With no usable patient candidates the prior votes (source 'population-prior')."""
    prior = (c("E-p1", "normal chest", 0.6), c("E-p2", "pneumothorax", 0.3))
    reply = ask(prior=prior)
    assert (reply.answer, reply.source, reply.cited) == (
        "normal chest",
        "population-prior",
        ("E-p1",),
    )
    blank = c("E-blank", "   ", 5.0)  # empty text is not evidence
    assert ask(blank, prior=prior).source == "population-prior"
    assert ask(c("E-1", "pneumothorax", 0.01), prior=prior).source == "memory"


def test_empty_answer_when_nothing_at_all() -> None:
    """No candidates and no prior: the fixed empty answer, no citations, zero confidence."""
    reply = ask(prior=(c("E-x", "", 1.0),))
    assert reply.answer == EMPTY_ANSWER and reply.source == "empty"
    assert reply.cited == () and reply.confidence == 0.0 and reply.decision == ""


def test_ties_break_by_recency_then_text() -> None:
    """Equal totals: the answer with the most recent evidence wins, then the smallest text."""
    assert ask(c("E-1", "beta", 0.5, time=1), c("E-2", "alpha", 0.5, time=2)).answer == "alpha"
    assert ask(c("E-1", "alpha", 0.5, time=2), c("E-2", "beta", 0.5, time=1)).answer == "alpha"
    assert ask(c("E-1", "beta", 0.5, time=7), c("E-2", "gamma", 0.5, time=9)).answer == "gamma"
    assert ask(c("E-1", "zeta", 0.5, time=4), c("E-2", "eta", 0.5, time=4)).answer == "eta"


def test_winner_decision_comes_from_its_most_recent_candidate() -> None:
    """The reply's text and decision are those of the winning answer's most recent candidate."""
    reply = ask(
        c("E-1", "Effusion", 0.5, time=1, decision="drain"), c("E-2", "effusion", 0.5, time=8, decision="observe")
    )
    assert (reply.answer, reply.decision) == ("effusion", "observe")


def test_duplicate_ids_are_cited_once() -> None:
    """A candidate id listed twice (episodic and visual views) appears once in cited."""
    reply = ask(c("E-1", "a", 0.5), c("E-1", "a", 0.5, kind="visual"), c("E-2", "a", 0.1))
    assert reply.cited == ("E-1", "E-2")


_cands = st.lists(
    st.builds(
        Candidate,
        id=st.sampled_from(["E-1", "E-2", "V-3", "S-4", "E-5"]),
        kind=st.sampled_from(["episodic", "visual", "semantic"]),
        text=st.sampled_from(["a", "b", "A ", "c", "", "b  c"]),
        decision=st.sampled_from(["", "x"]),
        weight=st.floats(-1, 1, allow_nan=False),
        time=st.integers(0, 5).map(float),
    ),
    max_size=6,
)


@given(_cands)
def test_deterministic_and_order_independent(cands: list[Candidate]) -> None:
    """Same evidence in any order gives the same answer and confidence (in [0, 1]).

    Semantic candidates get distinct times here: see the xfail test below for the tie.
    """
    semantic_times = [x.time for x in cands if x.kind == "semantic"]
    assume(len(set(semantic_times)) == len(semantic_times))
    first = ask(*cands)
    assert 0.0 <= first.confidence <= 1.0
    assert ask(*cands) == first
    for perm in itertools.islice(itertools.permutations(cands), 24):
        again = ask(*perm)
        assert again.answer.lower() == first.answer.lower()
        assert again.confidence == pytest.approx(first.confidence)
    reverse = ask(*reversed(cands))
    assert reverse.answer.lower() == first.answer.lower()


TIE_REASON = (
    "two semantic impressions with the same time: the bonus goes to whichever comes first, "
    "so the answer depends on candidate order"
)


def test_semantic_bonus_tie_is_order_independent() -> None:
    """Two equally recent semantic impressions: the answer should not depend on input order."""
    a = c("S-a", "consolidation", 0.0, time=1, kind="semantic")
    b = c("S-b", "effusion", 0.0, time=1, kind="semantic")
    assert ask(a, b).answer == ask(b, a).answer


# the question asked ------------------------------------------------------------------------------


def q(id_: str, text: str, weight: float, key: str, *, time: float = 0.0, tier: float = 1.0) -> Candidate:
    return Candidate(id_, "episodic", text, "", weight, time, tier, key)


def ask_q(question: str, key: str, *cands: Candidate, prior: tuple[Candidate, ...] = ()) -> BackboneReply:
    request = BackboneRequest("prompt", question, tuple(cands), prior, question_key=key)
    return NonparametricBackbone().generate(request)


def test_evidence_of_the_question_asked_votes_alone() -> None:
    """Evidence that answered the question asked decides, however strong other questions' evidence is."""
    reply = ask_q(
        "What is the diagnosis?",
        "kdiag",
        q("E-1", "yes", 0.9, "kicu"),
        q("E-2", "yes", 0.9, "kicu"),
        q("E-3", "COVID-19", 0.2, "kdiag", tier=0.6),
    )
    assert (reply.answer, reply.cited, reply.source) == ("COVID-19", ("E-3",), "memory")


def test_the_newest_verified_answer_of_a_changing_outcome_wins() -> None:
    """Thirteen older verified "yes" and three newer "no" to one question: the newest verified answer, "no"."""
    older = [q(f"E-{i}", "yes", 0.9, "kicu", time=float(i)) for i in range(13)]
    newer = [q(f"E-{i}", "no", 0.5, "kicu", time=float(i)) for i in range(13, 16)]
    reply = ask_q("Is the patient in the ICU?", "kicu", *older, *newer)
    assert reply.answer == "no" and reply.cited == ("E-13", "E-14", "E-15")
    assert reply.confidence == pytest.approx(1.5 / (13 * 0.9 + 1.5))


def test_two_verified_answers_at_one_time_the_closer_wins_whatever_the_ids() -> None:
    """Two views of one study (same time) answered differently: the one retrieval weighed
    higher is the newest verified answer, in either order and whichever id sorts first (ids
    are random in a store, so they must not decide)."""
    for ids in (("E-a", "E-b"), ("E-b", "E-a")):
        lateral = q(ids[0], "no", 0.4, "kicu", time=5.0)
        frontal = q(ids[1], "yes", 0.7, "kicu", time=5.0)
        for order in ((lateral, frontal), (frontal, lateral)):
            assert ask_q("Is the patient in the ICU?", "kicu", *order).answer == "yes"
    same = [q("E-b", "no", 0.5, "kicu", time=5.0), q("E-a", "yes", 0.5, "kicu", time=5.0)]
    assert ask_q("Is the patient in the ICU?", "kicu", *same).answer == "no"  # then retrieval's rank


def test_unverified_answers_of_the_question_are_voted_on() -> None:
    """Without a verified answer to the question the same-question evidence votes by weight."""
    reply = ask_q(
        "Is the patient in the ICU?",
        "kicu",
        q("E-1", "no", 0.3, "kicu", time=9.0, tier=0.6),
        q("E-2", "yes", 0.4, "kicu", time=1.0, tier=0.6),
        q("E-3", "yes", 0.4, "kicu", time=2.0, tier=0.6),
    )
    assert reply.answer == "yes" and reply.cited == ("E-2", "E-3")


def test_the_patients_own_evidence_of_the_form_comes_before_the_population() -> None:
    """No own answer to the question: the patient's own answers of the question's form vote
    before other patients' answers to the question; without any, those vote (the prior)."""
    prior = (q("P-1", "no", 0.2, "kint"), q("P-2", "no", 0.1, "kint"), q("P-3", "yes", 0.25, "kint"))
    own = ask_q("Was the patient intubated?", "kint", q("E-1", "yes", 0.9, "kicu"), prior=prior)
    assert (own.answer, own.source) == ("yes", "memory")
    reply = ask_q("Was the patient intubated?", "kint", q("E-1", "Pneumonia", 0.9, "kdx"), prior=prior)
    assert (reply.answer, reply.cited, reply.source) == ("no", ("P-1", "P-2"), "population-prior")


@pytest.mark.parametrize(
    ("question", "answer"),
    [("What is the diagnosis?", "Pneumonia"), ("Is there an effusion?", "yes"), ("Findings?", "yes")],
)
def test_an_answer_of_the_questions_form(question: str, answer: str) -> None:
    """Without evidence of the question itself: an open question is never answered by a bare yes
    or no, a yes/no question only by yes or no, a question of no telling form by the plain vote."""
    reply = ask_q(question, "knew", q("E-1", "yes", 0.9, "k1"), q("E-2", "Pneumonia", 0.3, "k2"))
    assert reply.answer == answer


def test_a_yes_no_question_without_yes_no_evidence_tries_the_prior_then_everything() -> None:
    """A yes/no question over label-only own evidence: the prior's yes/no evidence answers; with
    none anywhere, the plain vote over the patient's evidence."""
    own = (q("E-1", "Pneumonia", 0.9, "k1"),)
    assert ask_q("Is it severe?", "k", *own, prior=(q("P-1", "no", 0.1, "k2"),)).answer == "no"
    assert ask_q("Is it severe?", "k", *own).answer == "Pneumonia"

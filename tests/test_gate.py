"""The outcome-driven write-back gate."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from msm_mem._memory.gate import WriteBackGate
from msm_mem._memory.lexicon import Lexicon

LEX = Lexicon(["consolidation", "pleural effusion", "normal"])


def test_all_criteria_pass() -> None:
    """A novel, long enough answer with a clinical keyword is written, with the passed codes."""
    d = WriteBackGate(0.9, 3, LEX).decide(0.5, "Right lower lobe consolidation.")
    assert d.written and d.reasons == ("novel", "answer_long_enough", "clinical_keyword")
    assert d.keywords == ("consolidation",)


def test_new_patient_is_novel() -> None:
    """With no stored embedding (max cosine None) the novelty criterion passes."""
    assert WriteBackGate(0.9, 1, LEX).decide(None, "normal").written


def test_each_failing_criterion_is_named() -> None:
    """A duplicate image, a short answer and a missing keyword each give their own code."""
    gate = WriteBackGate(0.9, 3, LEX)
    assert gate.decide(0.95, "Right lower lobe consolidation.").reasons == ("not_novel",)
    assert gate.decide(0.1, "consolidation").reasons == ("answer_too_short",)
    assert gate.decide(0.1, "the heart looks fine").reasons == ("no_clinical_keyword",)
    d = gate.decide(0.99, "ok")
    assert not d.written and d.reasons == ("not_novel", "answer_too_short", "no_clinical_keyword")


def test_threshold_is_strict() -> None:
    """Novelty needs max cosine strictly below tau (paper: max cos < tau)."""
    gate = WriteBackGate(0.9, 0, LEX)
    assert not gate.decide(0.9, "normal").written
    assert gate.decide(0.8999, "normal").written


def test_keyword_matches_whole_words_only() -> None:
    """'abnormally' does not match the term 'normal'; a phrase matches across case."""
    gate = WriteBackGate(0.9, 0, LEX)
    assert not gate.decide(None, "abnormally shaped").written
    assert gate.decide(None, "Small PLEURAL EFFUSION").written


@given(
    cos=st.floats(-1, 1),
    tau_low=st.floats(-1, 1),
    tau_high=st.floats(-1, 1),
    answer=st.sampled_from(["", "normal", "right lower lobe consolidation", "nothing to see here"]),
)
def test_lower_tau_never_writes_more(cos: float, tau_low: float, tau_high: float, answer: str) -> None:
    """For any input, a gate with a lower tau writes only when one with a higher tau does."""
    low, high = sorted((tau_low, tau_high))
    if WriteBackGate(low, 2, LEX).decide(cos, answer).written:
        assert WriteBackGate(high, 2, LEX).decide(cos, answer).written


def test_structured_gate_judges_short_answers_by_novelty_alone() -> None:
    """With structured on, a novel one-word label is written (codes novel, structured_answer);
    a duplicate image is still refused; the paper's gate (default) refuses the same label."""
    gate = WriteBackGate(0.9, 3, LEX, structured=True)
    d = gate.decide(0.2, "COVID-19")
    assert d.written and d.reasons == ("novel", "structured_answer")
    assert gate.decide(0.95, "COVID-19").reasons == ("not_novel",)
    paper = WriteBackGate(0.9, 3, LEX).decide(0.2, "COVID-19")
    assert not paper.written and paper.reasons == ("answer_too_short", "no_clinical_keyword")


def test_structured_gate_keeps_the_keyword_rule_for_long_answers() -> None:
    """An answer of min_answer_words or more words still needs a clinical keyword."""
    gate = WriteBackGate(0.9, 3, LEX, structured=True)
    assert gate.decide(0.1, "the heart looks fine").reasons == ("no_clinical_keyword",)
    assert gate.decide(0.1, "Right lower lobe consolidation.").written
    assert gate.decide(0.1, "").reasons == ("answer_too_short", "no_clinical_keyword")

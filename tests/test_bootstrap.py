"""Paired bootstrap tests of S+E+V against its rivals, per question group."""

from __future__ import annotations

import pytest

from msm_mem import InvalidInput
from msm_mem.eval.bootstrap import paired_markdown, paired_tests, targets_and_rivals
from msm_mem.eval.fit import SCORERS
from msm_mem.eval.records import Answered

Q = "What is the diagnosis?"


def _answers(arm: str, right: list[bool], *, qt: str = "label", q: str = Q, phase: str = "WB4") -> list[Answered]:
    """One answer per entry: patient i // 2, study i; right answers match the reference."""
    return [
        Answered("frozen", phase, arm, f"p{i // 2}", f"s{i}", "COVID-19" if ok else "Pneumonia", "COVID-19", "", qt, q)
        for i, ok in enumerate(right)
    ]


def test_always_right_beats_always_wrong_and_the_reverse_loses() -> None:
    """Every pair +1: difference 1 with interval [1, 1], wins; the other way round loses."""
    answers = _answers("SEV", [True] * 10) + _answers("prior", [False] * 10)
    (win,) = paired_tests(answers, ["SEV"], ["prior"])
    assert (win.difference, win.low, win.high, win.verdict) == (1.0, 1.0, 1.0, "wins")
    assert (win.n, win.patients, win.target_score, win.rival_score) == (10, 5, 1.0, 0.0)
    (loss,) = paired_tests(answers, ["prior"], ["SEV"])
    assert (loss.difference, loss.verdict) == (-1.0, "loses")


def test_equal_arms_tie_and_noise_gives_an_interval_around_the_difference() -> None:
    """Identical answers: difference 0, a tie; mixed ones: the interval holds the point estimate."""
    same = _answers("SEV", [True, False] * 5) + _answers("E", [True, False] * 5)
    (t,) = paired_tests(same, ["SEV"], ["E"])
    assert (t.difference, t.low, t.high, t.verdict) == (0.0, 0.0, 0.0, "tie")
    mixed = _answers("SEV", [True] * 12) + _answers("E", [True, False, False] * 4)
    (m,) = paired_tests(mixed, ["SEV"], ["E"], n_resamples=500, seed=3)
    assert m.low <= m.difference <= m.high and m.difference == pytest.approx(2 / 3)


def test_same_seed_same_interval_and_the_seed_matters() -> None:
    """The resampling is seeded: the same seed gives the same bounds."""
    answers = _answers("SEV", [True, True, False] * 6) + _answers("S", [True, False, False] * 6)
    a = paired_tests(answers, ["SEV"], ["S"], seed=1)
    assert a == paired_tests(answers, ["SEV"], ["S"], seed=1)
    assert a != paired_tests(answers, ["SEV"], ["S"], seed=2)


def test_only_shared_queries_are_paired_and_groups_stay_apart() -> None:
    """Pairs need the same patient and study; each question group is tested on its own."""
    answers = (
        _answers("SEV", [True] * 4)
        + _answers("V", [False] * 2)
        + _answers("SEV", [False] * 4, qt="yes_no", q="Intubated?")
        + _answers("V", [True] * 4, qt="yes_no", q="Intubated?")
    )
    out = paired_tests(answers, ["SEV"], ["V"], scorers=SCORERS)
    by = {r.question_type: r for r in out}
    assert by["label"].n == 2 and by["label"].verdict == "wins"
    assert by["yes_no"].n == 4 and by["yes_no"].verdict == "loses"


def test_unknown_type_or_no_resample_is_invalid_input() -> None:
    """A question type without a scorer, or fewer than one resample, raises InvalidInput."""
    answers = _answers("SEV", [True], qt="essay") + _answers("S", [True], qt="essay")
    with pytest.raises(InvalidInput, match="essay"):
        paired_tests(answers, ["SEV"], ["S"])
    with pytest.raises(InvalidInput):
        paired_tests(_answers("SEV", [True]), ["SEV"], ["S"], n_resamples=0)


def test_targets_and_rivals_cover_baselines_single_memories_and_the_fitted_rows() -> None:
    """S+E+V (untrained and fitted) against every baseline, S, E, V, no memory and FT."""
    arms = ("none", "S", "E", "V", "SE", "SEV", "ft", "SEV-ft", "prior", "copy-prior", "nearest-neighbour")
    targets, rivals = targets_and_rivals(arms)
    assert targets == ["SEV", "SEV-ft"]
    assert set(rivals) == set(arms) - {"SE"}


def test_markdown_says_where_it_still_loses() -> None:
    """The report names each rival an S+E+V arm loses to."""
    answers = _answers("SEV", [False] * 6) + _answers("copy-prior", [True] * 6) + _answers("S", [False] * 6)
    text = paired_markdown(
        paired_tests(answers, ["SEV"], ["copy-prior", "S"]), mode="frozen", phase="WB4", n_resamples=1000
    )
    assert "SEV still loses to: copy-prior." in text and "| SEV | S | 6 |" in text


def test_markdown_gives_the_relative_gain_over_the_fitted_memory_free_row() -> None:
    """Beside the paper's +140% / +198%, the gain of S+E+V over ft is reported."""
    answers = _answers("SEV", [True] * 4 + [False] * 2) + _answers("ft", [True] * 3 + [False] * 3)
    text = paired_markdown(paired_tests(answers, ["SEV"], ["ft"]), mode="frozen", phase="WB4", n_resamples=1000)
    assert "(ft): SEV +33.3%" in text and "+198% MoE-FT" in text

"""Paired bootstrap tests of S+E+V against its rivals, per scope and by the scope's metric."""

from __future__ import annotations

from dataclasses import replace

import pytest

from msm_mem import InvalidInput
from msm_mem.eval.bootstrap import Paired, paired_markdown, paired_tests, targets_and_rivals
from msm_mem.eval.metrics import exact_match
from msm_mem.eval.records import Answered
from msm_mem.eval.scores import PER_ANSWER, PRIMARY, in_scope

Q = "What is the diagnosis?"


def _answers(arm: str, right: list[bool], *, qt: str = "label", q: str = Q, phase: str = "WB4") -> list[Answered]:
    """One answer per entry: patient i // 2, study i; right answers match the reference."""
    return [
        Answered("frozen", phase, arm, f"p{i // 2}", f"s{i}", "COVID-19" if ok else "Pneumonia", "COVID-19", "", qt, q)
        for i, ok in enumerate(right)
    ]


def _tests(answers: list[Answered], targets: list[str], rivals: list[str], **kw: int) -> list[Paired]:
    """The tests of the label scope by exact match."""
    return paired_tests(answers, targets, rivals, scope=("label", ""), metric="exact_match", score=exact_match, **kw)


def test_always_right_beats_always_wrong_and_the_reverse_loses() -> None:
    """Every pair +1: difference 1 with interval [1, 1], wins; the other way round loses."""
    answers = _answers("SEV", [True] * 10) + _answers("prior", [False] * 10)
    (win,) = _tests(answers, ["SEV"], ["prior"])
    assert (win.difference, win.low, win.high, win.verdict) == (1.0, 1.0, 1.0, "wins")
    assert (win.n, win.patients, win.target_score, win.rival_score) == (10, 5, 1.0, 0.0)
    (loss,) = _tests(answers, ["prior"], ["SEV"])
    assert (loss.difference, loss.verdict) == (-1.0, "loses")


def test_equal_arms_tie_and_noise_gives_an_interval_around_the_difference() -> None:
    """Identical answers: difference 0, a tie; mixed ones: the interval holds the point estimate."""
    same = _answers("SEV", [True, False] * 5) + _answers("E", [True, False] * 5)
    (t,) = _tests(same, ["SEV"], ["E"])
    assert (t.difference, t.low, t.high, t.verdict) == (0.0, 0.0, 0.0, "tie")
    mixed = _answers("SEV", [True] * 12) + _answers("E", [True, False, False] * 4)
    (m,) = _tests(mixed, ["SEV"], ["E"], n_resamples=500, seed=3)
    assert m.low <= m.difference <= m.high and m.difference == pytest.approx(2 / 3)


def test_same_seed_same_interval_and_the_seed_matters() -> None:
    """The resampling is seeded: the same seed gives the same bounds."""
    answers = _answers("SEV", [True, True, False] * 6) + _answers("S", [True, False, False] * 6)
    a = _tests(answers, ["SEV"], ["S"], seed=1)
    assert a == _tests(answers, ["SEV"], ["S"], seed=1)
    assert a != _tests(answers, ["SEV"], ["S"], seed=2)


def _yes_no(arm: str, right: list[bool]) -> list[Answered]:
    """Yes/no answers (reference yes) to another question about the same studies."""
    return [
        replace(a, prediction="yes" if ok else "no", reference="yes")
        for a, ok in zip(_answers(arm, right, qt="yes_no", q="Intubated?"), right, strict=True)
    ]


def test_only_shared_queries_are_paired_and_each_scope_has_its_metric() -> None:
    """Pairs need the same patient, study and question; each scope is tested on its own
    answers by its primary metric, and the overall scope pairs every question's answers."""
    answers = (
        _answers("SEV", [True] * 4)
        + _answers("V", [False] * 2)
        + _yes_no("SEV", [False] * 4)
        + _yes_no("V", [True] * 4)
    )
    by = {}
    for kind in ("all", "label", "yes_no"):
        metric = PRIMARY[kind]
        mine = in_scope(answers, kind, "")
        (by[kind],) = paired_tests(mine, ["SEV"], ["V"], scope=(kind, ""), metric=metric, score=PER_ANSWER[metric])
    assert by["label"].n == 2 and by["label"].verdict == "wins" and by["label"].metric == "exact_match"
    assert by["yes_no"].n == 4 and by["yes_no"].verdict == "loses" and by["yes_no"].metric == "accuracy"
    assert by["all"].n == 6 and by["all"].metric == "token_f1"
    assert by["all"].difference == pytest.approx((2 * 1.0 - 4 * 1.0) / 6)


def test_no_resample_is_invalid_input() -> None:
    """Fewer than one resample raises InvalidInput."""
    with pytest.raises(InvalidInput):
        _tests(_answers("SEV", [True]), ["SEV"], ["S"], n_resamples=0)


def test_targets_and_rivals_cover_baselines_single_memories_and_the_fitted_rows() -> None:
    """S+E+V (untrained and fitted) against every baseline, S, E, V, no memory and FT."""
    arms = ("none", "S", "E", "V", "SE", "SEV", "ft", "SEV-ft", "prior", "copy-prior", "nearest-neighbour")
    targets, rivals = targets_and_rivals(arms)
    assert targets == ["SEV", "SEV-ft"]
    assert set(rivals) == set(arms) - {"SE"}


def test_markdown_says_where_it_still_loses() -> None:
    """The report names each rival an S+E+V arm loses to."""
    answers = _answers("SEV", [False] * 6) + _answers("copy-prior", [True] * 6) + _answers("S", [False] * 6)
    text = paired_markdown(_tests(answers, ["SEV"], ["copy-prior", "S"]), mode="frozen", phase="WB4", n_resamples=1000)
    assert "SEV still loses to: copy-prior." in text and "| SEV | S | 6 |" in text


def test_markdown_gives_the_relative_gain_over_the_fitted_memory_free_row() -> None:
    """Beside the paper's +140% / +198%, the gain of S+E+V over ft is reported."""
    answers = _answers("SEV", [True] * 4 + [False] * 2) + _answers("ft", [True] * 3 + [False] * 3)
    text = paired_markdown(_tests(answers, ["SEV"], ["ft"]), mode="frozen", phase="WB4", n_resamples=1000)
    assert "(ft): SEV +33.3%" in text and "+198% MoE-FT" in text


def test_markdown_names_only_the_losses_of_each_scope() -> None:
    """A loss in one scope is not reported under another."""
    label = _tests(_answers("SEV", [False] * 6) + _answers("S", [True] * 6), ["SEV"], ["S"])
    other = paired_tests(
        _answers("SEV", [True] * 6, qt="text") + _answers("S", [False] * 6, qt="text"),
        ["SEV"],
        ["S"],
        scope=("text", ""),
        metric="token_f1",
        score=PER_ANSWER["token_f1"],
    )
    text = paired_markdown([*label, *other], mode="frozen", phase="WB4", n_resamples=1000)
    label_part, text_part = text.split("### text")
    assert "SEV still loses to: S." in label_part and "SEV loses to no rival." in text_part

"""Tests for msm_mem.eval.cohorts: first studies and follow-ups scored apart, with their n."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from msm_mem._settings import Settings
from msm_mem.eval.cohorts import cohort_of, cohort_records, cohorts_markdown, follow_up_rows
from msm_mem.eval.protocol import Answered, ProtocolRun, ProtocolSettings
from msm_mem.eval.report import write_reports
from msm_mem.eval.split import split_patients


def _run(answers: list[Answered]) -> ProtocolRun:
    split = split_patients(["a", "b", "c"], seed=0)
    data = {"name": "hand", "fingerprint": "0" * 64, "rows": 6, "labelled": 6, "patients": 3, "studies": {}}
    settings = ProtocolSettings(configs=("SEV",), baselines=("copy-prior",))
    return ProtocolRun(settings, Settings(), (split,), data, answers)


def _a(arm: str, patient: str, study: str, prediction: str, reference: str, prior: str = "") -> Answered:
    return Answered("frozen", "WB4", arm, patient, study, prediction, reference, question_type="yes_no", prior=prior)


HAND = [
    _a("SEV", "a", "1", "yes", "yes"),
    _a("SEV", "a", "2", "no", "yes", prior="1"),
    _a("SEV", "b", "3", "no", "no"),
    _a("SEV", "b", "4", "no", "no", prior="3"),
    _a("copy-prior", "a", "1", "no", "yes"),
    _a("copy-prior", "a", "2", "yes", "yes"),  # a baseline records no prior study: the row tells
    _a("copy-prior", "b", "3", "yes", "no"),
    _a("copy-prior", "b", "4", "no", "no"),
]


def test_a_first_study_has_no_earlier_study_in_its_probe() -> None:
    """An answer with no prior study of its patient is a first study; one with a prior, a
    follow-up; a baseline's answer about a row an agent arm answered as a follow-up is one too."""
    assert [cohort_of(a) for a in HAND[:4]] == ["first", "follow-up", "first", "follow-up"]
    rows = follow_up_rows(HAND)
    assert [cohort_of(a, rows) for a in HAND[4:]] == ["first", "follow-up", "first", "follow-up"]
    assert [cohort_of(a) for a in HAND[4:]] == ["first"] * 4


def test_each_cohort_is_scored_apart_with_its_n() -> None:
    """SEV: 2 of 2 first studies right, 1 of 2 follow-ups; copy-prior the other way round;
    each record names the scope's primary metric and counts its answers and patients."""
    records = cohort_records(_run(HAND), n_boot=200)
    got = {(r["question_type"], r["cohort"], r["arm"]): r for r in records if r["phase"] == "WB4"}
    assert got[("yes_no", "first", "SEV")]["score"]["mean"] == pytest.approx(1.0)
    assert got[("yes_no", "follow-up", "SEV")]["score"]["mean"] == pytest.approx(0.5)
    assert got[("yes_no", "first", "copy-prior")]["score"]["mean"] == pytest.approx(0.0)
    assert got[("yes_no", "follow-up", "copy-prior")]["score"]["mean"] == pytest.approx(1.0)
    first = got[("yes_no", "first", "SEV")]
    assert (first["n"], first["patients"], first["metric"]) == (2, 2, "accuracy")
    assert got[("all", "first", "SEV")]["metric"] == "token_f1"


def test_the_tables_show_both_cohorts_and_the_first_study_curve() -> None:
    """The markdown has a row per arm with both cohorts and their n, and the frozen first-study curve."""
    run = _run(HAND)
    text = cohorts_markdown(cohort_records(run, n_boot=100), run, titles={"SEV": "S+E+V"})
    assert "| S+E+V | 100.0 [100.0, 100.0] (n=2) | 50.0" in text
    assert "# First studies across the phases (frozen probe)" in text
    assert "| S+E+V | yes_no | — | — | — | — | 100.0 |" in text


def test_reports_write_the_cohorts(tmp_path: Path) -> None:
    """write_reports writes cohorts.md and the cohort records into results.json."""
    write_reports(_run(HAND), tmp_path, n_boot=50)
    assert (tmp_path / "cohorts.md").read_text(encoding="utf-8").startswith("# First studies and follow-ups")
    doc = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
    assert {(r["cohort"], r["arm"]) for r in doc["cohorts"]} == {
        (c, a) for c in ("first", "follow-up") for a in ("SEV", "copy-prior")
    }

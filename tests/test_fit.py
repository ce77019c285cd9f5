"""Fitting on the fine-tune split: disjoint from validation, fine-tune rows only, saved and loaded."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from msm_mem import InvalidInput, MissingExtra
from msm_mem.datasets.manifest import ManifestRow
from msm_mem.datasets.synthetic import generate
from msm_mem.eval.fit import FitSettings, fit_classifiers, fit_models, group_of
from msm_mem.eval.protocol import ProtocolRun, ProtocolSettings, run_protocol
from msm_mem.eval.split import split_patients
from msm_mem.plugins.backbones.base import BackboneRequest
from msm_mem.plugins.backbones.fitted_format import load

pytestmark = pytest.mark.slow

Q = "What is the diagnosis?"


@given(st.sets(st.text("abcdefgh", min_size=1, max_size=6), min_size=3, max_size=60), st.integers(0, 5))
@settings(max_examples=40, deadline=None)
def test_finetune_validation_and_memory_are_disjoint(ids: set[str], seed: int) -> None:
    """No patient is in two of memory, fine-tune and validation; together they are everyone."""
    s = split_patients(ids, seed=seed)
    memory, finetune, validation = set(s.memory), set(s.finetune), set(s.validation)
    assert not (memory & finetune) and not (memory & validation) and not (finetune & validation)
    assert memory | finetune | validation == ids


def _rows(answers: dict[str, list[str]]) -> tuple[list[ManifestRow], dict[tuple[str, str], np.ndarray]]:
    """Rows with embeddings: "Alpha" answers point one way, anything else the other way."""
    rng = np.random.default_rng(0)
    rows, z = [], {}
    for p, per in sorted(answers.items()):
        for i, a in enumerate(per):
            row = ManifestRow(p, f"{p}-{i}", 1e9 + i * 86_400, "/img.png", Q, a)
            v = rng.normal(size=16) * 0.1
            v[0] += 1.0 if a == "Alpha" else -1.0
            rows.append(row)
            z[(p, row.study_id)] = v / np.linalg.norm(v)
    return rows, z


def test_the_model_learns_the_image_signal_and_keeps_unique_answers_out() -> None:
    """Classes are answers of at least two patients; the classifier separates them by image."""
    answers = {f"p{i:02d}": ["Alpha" if i % 2 else "Beta"] * 2 for i in range(20)}
    answers["solo"] = ["Only this patient says it"]
    rows, z = _rows(answers)
    (clf,) = fit_classifiers(rows, z).values()
    assert clf.classes == ("Alpha", "Beta")
    assert clf.examples == 40 and clf.patients == 20
    ahead = np.zeros(16)
    ahead[0] = 1.0
    assert clf.classes[int(np.argmax(clf.coef @ ahead + clf.intercept))] == "Alpha"
    assert clf.cv_score == 1.0  # out-of-fold, every patient's answer is recovered from the image
    assert set(clf.oof) == {(r.patient_id, r.study_id) for r in rows}


def test_fit_models_refuses_router_examples_outside_its_rows() -> None:
    """The router may only learn from rows the model is fitted on (the fine-tune rows)."""
    rows, z = _rows({f"p{i}": ["Alpha" if i % 2 else "Beta"] for i in range(6)})
    stray = ManifestRow("validation-patient", "v1", 1e9, "/img.png", Q, "Alpha")
    with pytest.raises(InvalidInput, match="validation-patient"):
        fit_models(rows, z, [(stray, BackboneRequest("p", Q))], encoder="pixels")


def test_nothing_shared_is_nothing_to_fit() -> None:
    """With no answer given by two patients there is no model to fit."""
    rows, z = _rows({"p1": ["x"], "p2": ["y"]})
    with pytest.raises(InvalidInput, match="nothing to fit"):
        fit_models(rows, z, [], encoder="pixels")


def test_fit_settings_are_validated() -> None:
    """Bad fit settings raise InvalidInput."""
    for bad in ({"min_patients": 0}, {"c_grid": ()}, {"c_grid": (-1.0,)}, {"folds": 1}, {"router_c": 0.0}):
        with pytest.raises(InvalidInput):
            FitSettings(**bad)  # type: ignore[arg-type]


def test_without_scikit_learn_fitting_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fitting with scikit-learn missing raises MissingExtra naming the fit extra."""
    monkeypatch.setitem(sys.modules, "sklearn.linear_model", None)
    rows, z = _rows({f"p{i}": ["Alpha" if i % 2 else "Beta"] for i in range(6)})
    with pytest.raises(MissingExtra, match=r"msm-mem\[fit\]"):
        fit_classifiers(rows, z)


def test_group_of_is_the_rows_question_type_and_question() -> None:
    """A row's group is its question type (free text by default) with its question."""
    row = ManifestRow("p", "s", 1e9, "/img.png", Q, "Alpha")
    assert group_of(row) == ("text", Q)
    assert group_of(ManifestRow("p", "s", 1e9, "/img.png", Q, "yes", question_type="yes_no")) == ("yes_no", Q)


# ------------------------------------------------------------------ through the protocol


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> list[ManifestRow]:
    rows, _ = generate(tmp_path_factory.mktemp("syn"), patients=30, studies_per_patient=(2, 3), seed=5, size=64)
    return rows


SETTINGS = ProtocolSettings(configs=("SEV",), baselines=("copy-prior",), fit=True)


@pytest.fixture(scope="module")
def fitted_run(data: list[ManifestRow]) -> ProtocolRun:
    return run_protocol(data, SETTINGS)


def test_fitted_arms_stand_beside_the_untrained_ones(fitted_run: ProtocolRun) -> None:
    """With fit, ft and SEV-ft answer the same queries as SEV and the baselines."""
    assert fitted_run.arms == ("SEV", "ft", "SEV-ft", "copy-prior")
    queries = {
        arm: sorted((a.mode, a.phase, a.study_id) for a in fitted_run.answers if a.arm == arm)
        for arm in fitted_run.arms
    }
    assert len({tuple(q) for q in queries.values()}) == 1 and queries["ft"]
    assert fitted_run.fitted is not None
    record = fitted_run.fitted.fit
    assert record["finetune_patients"] == len(fitted_run.split.finetune)


def test_fitting_reads_fine_tune_rows_only(data: list[ManifestRow], fitted_run: ProtocolRun, tmp_path: Path) -> None:
    """Changing every validation answer leaves the fitted parameters bit for bit the same;
    changing fine-tune answers changes them (so the comparison can fail)."""
    split = fitted_run.split
    val, ft = set(split.validation), set(split.finetune)
    assert fitted_run.fitted is not None
    fitted_run.fitted.save(tmp_path / "a.npz")

    def rerun(patients: set[str], name: str) -> dict[str, np.ndarray]:
        changed = [replace(r, answer="Changed answer.") if r.patient_id in patients else r for r in data]
        run = run_protocol(changed, replace(SETTINGS, configs=(), baselines=()))
        assert run.split == split and run.fitted is not None
        run.fitted.save(tmp_path / name)
        with np.load(tmp_path / name) as npz:
            return {k: npz[k] for k in npz.files}

    with np.load(tmp_path / "a.npz") as npz:
        original = {k: npz[k] for k in npz.files}
    same = rerun(val, "b.npz")
    assert original.keys() == same.keys() and all(np.array_equal(original[k], same[k]) for k in original)
    other = rerun(set(sorted(ft)[: len(ft) // 2]), "c.npz")
    assert any(k not in other or not np.array_equal(original[k], other[k]) for k in original)


def test_the_saved_file_is_what_the_arms_read(fitted_run: ProtocolRun, tmp_path: Path) -> None:
    """The run's models save to a file that loads back to the same classes and record."""
    assert fitted_run.fitted is not None
    fitted_run.fitted.save(tmp_path / "fitted.npz")
    back = load(tmp_path / "fitted.npz")
    assert [g.classes for g in back.groups] == [g.classes for g in fitted_run.fitted.groups]
    assert back.meta() == fitted_run.fitted.meta()


def test_reports_keep_untrained_and_fitted_rows_with_paired_tests(fitted_run: ProtocolRun, tmp_path: Path) -> None:
    """table1 lists SEV, ft and SEV-ft beside the baseline; results.json carries the fitted
    record and the paired bootstrap; fitted.npz is written beside them and loads."""
    import json

    from msm_mem.eval.report import write_reports

    write_reports(fitted_run, tmp_path, n_boot=50)
    table = (tmp_path / "table1.md").read_text(encoding="utf-8")
    for title in ("| SEV |", "no memory, fitted image model (FT)", "SEV, fitted backbone and router (MoE-FT)"):
        assert title in table
    assert "Paired bootstrap" in table and (tmp_path / "paired.md").is_file()
    doc = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
    assert [f["file"] for f in doc["fitted"]] == ["fitted.npz"] and doc["fitted"][0]["groups"][0][
        "question_type"
    ] == "text"
    tests = doc["paired_bootstrap"]["tests"]
    assert doc["paired_bootstrap"]["resamples"] == 50
    frozen = {(t["target"], t["rival"]) for t in tests if t["mode"] == "frozen" and t["phase"] == "WB4"}
    assert frozen == {
        ("SEV", "ft"),
        ("SEV", "SEV-ft"),
        ("SEV", "copy-prior"),
        ("SEV-ft", "ft"),
        ("SEV-ft", "SEV"),
        ("SEV-ft", "copy-prior"),
    }
    assert {m["kind"] for m in doc["metrics"] if m["arm"] in ("ft", "SEV-ft")} == {"fitted"}
    assert load(tmp_path / "fitted.npz").meta() == fitted_run.fitted.meta()  # type: ignore[union-attr]


def test_each_question_group_is_fitted_on_its_own_and_the_run_holds_them_all(
    data: list[ManifestRow], tmp_path: Path
) -> None:
    """Two questions per study: each group fits its own model (saved in its work folder), the
    fitted arms answer both groups, the run's fitted models hold both groups, and the paired
    tests run overall and per question type, each by its primary metric."""
    from msm_mem.eval.bootstrap import scope_tests

    effusion = "Is there a pleural effusion?"
    asked = [
        replace(r, question=effusion, answer="yes" if "effusion" in r.answer else "no", question_type="yes_no")
        for r in data
    ]
    run = run_protocol([*data, *asked], SETTINGS, work_dir=tmp_path)
    assert run.fitted is not None
    assert sorted(g.key for g in run.fitted.groups) == [("text", data[0].question), ("yes_no", effusion)]
    assert (tmp_path / "q0-yes_no" / "fitted.npz").is_file() and (tmp_path / "q1-text" / "fitted.npz").is_file()
    assert {a.question_type for a in run.answers if a.arm == "SEV-ft"} == {"yes_no", "text"}
    assert run.fitted.fit["finetune_patients"] == len(run.split.finetune)
    metric = {(t.question_type, t.metric) for t in scope_tests(run, n_resamples=20)}
    assert metric == {("all", "token_f1"), ("yes_no", "accuracy"), ("text", "token_f1")}


def test_combine_models_joins_groups_and_refuses_other_encoders() -> None:
    """Groups fitted apart join into one file's models with their choices merged; models of
    another encoder or dimension are refused; nothing to combine is None."""
    from msm_mem.eval.fit import combine_models, fittable
    from msm_mem.plugins.backbones.fitted_format import FittedGroup, FittedModels

    def one(q: str, encoder: str = "pixels", dim: int = 4) -> FittedModels:
        group = FittedGroup("label", q, ("a", "b"), np.zeros((2, dim)), np.zeros(2))
        return FittedModels(encoder, dim, (group,), {"chosen_c": {q: 1.0}, "settings": {"folds": 5}})

    both = combine_models([one("A?"), one("B?")], {"finetune_patients": 3})
    assert both is not None and [g.question for g in both.groups] == ["A?", "B?"]
    assert both.fit["chosen_c"] == {"A?": 1.0, "B?": 1.0} and both.fit["finetune_patients"] == 3
    assert combine_models([]) is None
    with pytest.raises(InvalidInput, match="one encoder"):
        combine_models([one("A?"), one("B?", encoder="clip")])
    rows, _ = _rows({"p1": ["Alpha"], "p2": ["Alpha"]})
    assert fittable(rows) and not fittable(rows[:1])

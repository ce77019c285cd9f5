"""Tests for msm_mem.eval.report and msm_mem.eval.plots: metrics per phase, files, determinism."""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path

import pytest

from msm_mem._errors import MissingExtra
from msm_mem._memory.labeler import finding_f1
from msm_mem._settings import Settings
from msm_mem.datasets.manifest import ManifestRow
from msm_mem.datasets.synthetic import generate
from msm_mem.eval.plots import write_plots
from msm_mem.eval.protocol import Answered, ProtocolRun, ProtocolSettings, run_protocol
from msm_mem.eval.report import finding_counts, summarise, table1_markdown, write_reports
from msm_mem.eval.split import split_patients

PAIRS = [
    ("Right pleural effusion.", "Small right pleural effusion and cardiomegaly."),
    ("No acute cardiopulmonary abnormality.", "Left lower lobe consolidation."),
    ("Pulmonary edema.", "No edema."),
    ("Possible pneumothorax.", "Large pneumothorax."),
]


def test_finding_counts_pool_to_the_labelers_micro_f1() -> None:
    """Per-pair (TP, FP, FN) summed give finding_f1's micro F1 (uncertain counted positive)."""
    tp, fp, fn = (sum(c) for c in zip(*(finding_counts(p, r) for p, r in PAIRS), strict=True))
    assert finding_counts(*PAIRS[0]) == (1, 0, 1)  # effusion matched, cardiomegaly missed
    expected = finding_f1([p for p, _ in PAIRS], [r for _, r in PAIRS])["micro"]
    assert 2 * tp / (2 * tp + fp + fn) == pytest.approx(expected)


def _run(answers: list[Answered]) -> ProtocolRun:
    split = split_patients(["a", "b", "c"], seed=0)
    data = {"name": "hand", "fingerprint": "0" * 64, "rows": 4, "labelled": 4, "patients": 3, "studies": {}}
    settings = ProtocolSettings(configs=("SEV",), baselines=("prior",))
    return ProtocolRun(settings, Settings(), (split,), data, answers)


HAND = [
    Answered("online", "WB4", "SEV", "a", "1", "right pleural effusion", "Right pleural effusion.", "written"),
    Answered("online", "WB4", "SEV", "a", "2", "effusion", "right pleural effusion", "discarded:not_novel+too_short"),
    Answered("online", "WB4", "SEV", "b", "3", "cardiomegaly", "edema", "discarded:not_novel"),
    Answered("online", "WB4", "prior", "a", "1", "x", "x"),
]


def test_summary_metrics_by_hand() -> None:
    """SEV at WB4: F1 (1 + 0.5 + 0)/3, EM 1/3, gate 1 written / 2 discarded, not_novel twice."""
    records = summarise(_run(HAND), n_boot=200)
    sev = next(r for r in records if r["arm"] == "SEV")
    assert (sev["n"], sev["patients"], sev["kind"]) == (3, 2, "memory")
    assert sev["token_f1"]["mean"] == pytest.approx(1.5 / 3)
    assert sev["exact_match"]["mean"] == pytest.approx(1 / 3)
    assert sev["token_f1"]["low"] <= sev["token_f1"]["mean"] <= sev["token_f1"]["high"]
    assert sev["gate"] == {"written": 1, "discarded": 2, "reasons": {"not_novel": 2, "too_short": 1}}
    prior = next(r for r in records if r["arm"] == "prior")
    assert prior["kind"] == "baseline" and prior["gate"]["written"] == prior["gate"]["discarded"] == 0
    assert [(r["question_type"], r["arm"]) for r in records] == [
        ("all", "SEV"),
        ("all", "prior"),
        ("text", "SEV"),
        ("text", "prior"),
    ]


YES_NO = "Was the patient intubated?"
TYPED = [
    Answered("online", "WB4", "SEV", "a", "1", "COVID-19", "COVID-19", "", "label", "What is it?"),
    Answered("online", "WB4", "SEV", "b", "3", "Pneumonia", "COVID-19", "", "label", "What is it?"),
    Answered("online", "WB4", "SEV", "a", "1", "Yes.", "yes", "", "yes_no", YES_NO),
    Answered("online", "WB4", "SEV", "b", "3", "no", "yes", "", "yes_no", YES_NO),
    Answered("online", "WB4", "SEV", "c", "4", "No prior evidence in memory.", "no", "", "yes_no", YES_NO),
    Answered("online", "WB4", "SEV", "c", "4", "yes", "yes", "", "yes_no", "Did the patient survive?"),
    Answered("online", "WB4", "SEV", "a", "1", "severe ards intubated", "Severe ARDS, intubated.", "", "text", "N?"),
]


def test_each_question_type_is_scored_by_its_own_metrics() -> None:
    """label: exact match and label F1; yes/no: accuracy and yes/no F1 (an answer that is not
    yes or no is wrong); text: BLEU-1..4, ROUGE-L and CIDEr-D; all: the Table 1 columns; a type
    with several questions is also scored per question."""
    run = _run(TYPED)
    records = {(r["question_type"], r["question"]): r for r in summarise(run, n_boot=50)}
    assert list(records) == [
        ("all", ""),
        ("label", ""),
        ("yes_no", ""),
        ("yes_no", "Did the patient survive?"),
        ("yes_no", YES_NO),
        ("text", ""),
    ]
    label = records[("label", "")]
    assert label["exact_match"]["mean"] == pytest.approx(0.5) and "accuracy" not in label
    assert label["label_f1"]["mean"] == pytest.approx(2 / 3)  # one class, covid-19: TP 1, FN 1
    yn = records[("yes_no", "")]
    assert yn["n"] == 4 and yn["accuracy"]["mean"] == pytest.approx(2 / 4)
    # yes: TP 2, FP 0, FN 1 -> 4/5; no: TP 0, FP 1, FN 1 -> 0
    assert yn["yes_no_f1"]["mean"] == pytest.approx((4 / 5 + 0) / 2)
    assert records[("yes_no", YES_NO)]["accuracy"]["mean"] == pytest.approx(1 / 3)
    text = records[("text", "")]
    assert {"bleu1", "bleu4", "rouge_l", "cider", "finding_f1"} <= set(text) and "accuracy" not in text
    assert text["rouge_l"]["mean"] == pytest.approx(1.0) and text["bleu1"]["mean"] == pytest.approx(1.0)
    overall = records[("all", "")]
    assert overall["n"] == len(TYPED) and {"token_f1", "bleu4", "finding_f1"} <= set(overall)
    table = table1_markdown(list(records.values()), run)
    assert table.index("## all questions.") < table.index("## label questions") < table.index("## yes/no questions")
    assert "| SEV | ✓ | ✓ | ✓ | 4 | 50.00 [" in table.split("## yes/no questions.")[1]  # n, then accuracy


def test_table1_has_one_row_per_arm_with_marks() -> None:
    """Table 1 marks SEV with three ticks and names the baseline."""
    run = _run(HAND)
    text = table1_markdown(summarise(run, n_boot=50), run)
    assert "| SEV | ✓ | ✓ | ✓ | 3 | 50.00 [" in text  # with its n
    assert "baseline: population prior" in text
    assert "Frozen" not in text  # no frozen answers, no frozen table


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> list[ManifestRow]:
    rows, _ = generate(tmp_path_factory.mktemp("syn"), patients=20, studies_per_patient=(2, 3), seed=5, size=64)
    return rows


@pytest.fixture(scope="module")
def reports(rows: list[ManifestRow], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ProtocolRun]:
    run = run_protocol(rows, ProtocolSettings(configs=("none", "SEV"), seed=5), dataset="synthetic")
    out = tmp_path_factory.mktemp("out")
    write_reports(run, out, n_boot=100)
    return out, run


def test_reports_are_written_with_the_paper_shapes(reports: tuple[Path, ProtocolRun]) -> None:
    """table1.csv: one row per arm and mode at WB4; phases.csv: every mode, phase and arm."""
    out, run = reports
    table = list(csv.DictReader((out / "table1.csv").read_text(encoding="utf-8").splitlines()))
    scopes = {("all", ""), ("text", "")}
    assert {(r["question_type"], r["question"], r["mode"], r["arm"]) for r in table} == {
        (*s, m, a) for s in scopes for m in ("online", "frozen") for a in run.arms
    }
    assert {r["phase"] for r in table} == {"WB4"}
    phases = list(csv.DictReader((out / "phases.csv").read_text(encoding="utf-8").splitlines()))
    assert len(phases) == len(scopes) * len(run.arms) * (4 + 5)
    for name in ("table1.md", "phases.md", "answers.jsonl"):
        assert (out / name).stat().st_size > 0
    assert len((out / "answers.jsonl").read_text(encoding="utf-8").splitlines()) == len(run.answers)


def test_results_json_has_settings_fingerprint_split_and_no_random_ids(reports: tuple[Path, ProtocolRun]) -> None:
    """results.json holds the settings, the data fingerprint, the split, and no uuid-style ids."""
    out, run = reports
    text = (out / "results.json").read_text(encoding="utf-8")
    doc = json.loads(text)
    assert doc["settings"]["configs"] == ["none", "SEV"] and doc["settings"]["feedback"] == "truth"
    assert doc["settings"]["memory"]["tau"] == 0.9
    assert doc["data"]["fingerprint"] == run.data["fingerprint"]
    assert [sorted(s["patients"]["validation"]) for s in doc["splits"]] == [list(run.split.validation)]
    assert not re.search(r"[0-9a-f]{32}", text.replace(str(run.data["fingerprint"]), ""))


def test_same_seed_gives_byte_identical_results(
    rows: list[ManifestRow], reports: tuple[Path, ProtocolRun], tmp_path: Path
) -> None:
    """Running again with the same data, settings and seed writes identical results and tables."""
    out, _ = reports
    again = run_protocol(rows, ProtocolSettings(configs=("none", "SEV"), seed=5), dataset="synthetic")
    write_reports(again, tmp_path, n_boot=100)
    for name in ("results.json", "table1.csv", "phases.csv", "table1.md", "answers.jsonl"):
        assert (tmp_path / name).read_bytes() == (out / name).read_bytes(), name


def test_plots_are_pngs(reports: tuple[Path, ProtocolRun], tmp_path: Path) -> None:
    """Figure 6, the bars and the gate plot are written as PNG files."""
    out, run = reports
    records = json.loads((out / "results.json").read_text(encoding="utf-8"))["metrics"]
    paths = write_plots(records, tmp_path, arms=run.arms, configs=run.settings.configs)
    assert [p.name for p in paths] == ["figure6.png", "figure6_finding_f1.png", "configs.png", "gate.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)


def test_plots_without_matplotlib_raise_missing_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without matplotlib, plotting raises MissingExtra naming the plots extra."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MissingExtra, match="plots"):
        write_plots([], tmp_path, arms=(), configs=())

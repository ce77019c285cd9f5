"""Tests for the eval and demo commands of msm_mem.interfaces.cli (evaluate.py: thin CLI layers)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from msm_mem.interfaces.cli import main


def test_eval_writes_reports_and_prints_table1(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`msm-mem eval` on a small synthetic set exits 0, prints Table 1 and writes the reports;
    the data set options reach the loader (12 patients)."""
    out = tmp_path / "out"
    code = main(
        [
            "eval",
            "--dataset",
            "synthetic",
            str(tmp_path / "data"),
            "--out",
            str(out),
            "--configs",
            "s,sev",
            "--option",
            "patients=12",
            "--option",
            "size=64",
            "--bootstrap",
            "20",
            "--no-progress",
            "--no-plots",
            "--jobs",
            "1",
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0
    assert "# Table 1" in printed and "| SEV | ✓ | ✓ | ✓ |" in printed
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert doc["data"]["patients"] == 12 and doc["settings"]["configs"] == ["S", "SEV"]
    assert [s["counts"]["validation"] for s in doc["splits"]] == [3, 3, 2, 2, 2]  # 12 patients in 5 folds
    assert len({p for s in doc["splits"] for p in s["patients"]["validation"]}) == 12  # each patient probed once
    assert not list(out.glob("*.png"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--configs", "SX"], "unknown memory configuration"),
        (["--option", "patients"], "KEY=VALUE"),
        (["--option", "colour=3"], "unknown option"),
        (["--bootstrap", "0"], "--bootstrap"),
    ],
)
def test_eval_bad_arguments_are_one_line_errors(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str], message: str
) -> None:
    """Bad configurations, options or bootstrap counts exit 1 with one `error:` line."""
    code = main(["eval", "--dataset", "synthetic", str(tmp_path / "d"), "--out", str(tmp_path / "o"), *args])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("error:") and message in err and err.count("\n") == 1


def test_eval_unknown_feedback_is_a_usage_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """--feedback accepts only truth or none (usage error, status 2)."""
    assert main(["eval", "--dataset", "synthetic", str(tmp_path), "--out", str(tmp_path), "--feedback", "x"]) == 2


def _manifest(tmp_path: Path, patients: int) -> Path:
    """A JSONL manifest of two questions per synthetic study (text and yes/no), relative
    images, and two bad rows (lines 2 and 4 of the file)."""
    from dataclasses import replace

    from msm_mem.datasets.synthetic import generate

    rows, _ = generate(tmp_path / "data", patients=patients, studies_per_patient=(2, 2), seed=1, size=64)
    lines = []
    for r in rows:
        rel = str(Path(r.image).relative_to(tmp_path / "data"))
        lines.append(json.dumps(replace(r, image=rel).to_dict()))
        yes = "yes" if "effusion" in r.answer else "no"
        lines.append(
            json.dumps(replace(r, image=rel, question="Effusion?", answer=yes, question_type="yes_no").to_dict())
        )
    lines.insert(1, "{not json")
    lines.insert(3, json.dumps({**json.loads(lines[0]), "question_type": "essay"}))
    path = tmp_path / "data" / "mine.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_eval_on_a_manifest_reports_bad_rows_and_scores_each_question_type(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`msm-mem eval --dataset manifest FILE` prints every bad row with its line, reads the
    question types from the rows and writes tables per type and overall."""
    path = _manifest(tmp_path, 15)
    out = tmp_path / "out"
    argv = ["eval", "--dataset", "manifest", str(path), "--out", str(out), "--configs", "sev", "--no-baselines"]
    code = main([*argv, "--bootstrap", "10", "--no-progress", "--no-plots", "--jobs", "1"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "skipped 2 rows of manifest:" in captured.err
    assert "  line 2: invalid JSON" in captured.err and "  line 4: question_type must be one of" in captured.err
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert {tuple(q["question_type"] for q in f["questions"]) for f in doc["data"]["folds"]} == {("yes_no", "text")}
    assert {m["question_type"] for m in doc["metrics"]} == {"all", "yes_no", "text"}
    assert "## yes/no questions." in captured.out and "## free-text questions." in captured.out
    assert "no question_type" not in captured.err  # every readable row names its type


def test_eval_warns_of_rows_without_a_question_type(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A CSV manifest without the question_type column: eval warns, naming the rows' lines, that
    they are scored as free text (the rows are still evaluated)."""
    import csv

    from msm_mem.datasets.synthetic import generate

    rows, _ = generate(tmp_path / "data", patients=15, studies_per_patient=(2, 2), seed=1, size=64)
    path = tmp_path / "data" / "untyped.csv"
    with path.open("w", newline="", encoding="utf-8") as fh:
        out = csv.writer(fh)
        out.writerow(["patient_id", "study_id", "timestamp", "image", "question", "answer"])
        for r in rows:
            out.writerow([r.patient_id, r.study_id, r.timestamp, r.image, r.question, r.answer])
    argv = ["eval", "--dataset", "manifest", str(path), "--out", str(tmp_path / "out"), "--configs", "sev"]
    code = main(
        [*argv, "--no-baselines", "--bootstrap", "10", "--no-progress", "--no-plots", "--jobs", "1", "--no-fit"]
    )
    err = capsys.readouterr().err
    assert code == 0, err
    lines = ", ".join(str(n) for n in range(2, len(rows) + 2))  # every data line of the file
    assert f"warning: {path}: no question_type on line {lines}: scored as free text" in err


def test_eval_on_a_manifest_with_too_few_patients_is_an_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Two patients cannot be split: exit 1 with one error line saying so."""
    path = _manifest(tmp_path, 2)
    code = main(["eval", "--dataset", "manifest", str(path), "--out", str(tmp_path / "o"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 1
    assert "needs at least 3 labelled patients, got 2" in err


def _eval(tmp_path: Path, *extra: str) -> dict[str, object]:
    out = tmp_path / "out"
    args = ["--configs", "sev", "--option", "patients=16", "--option", "size=64", "--bootstrap", "20"]
    code = main(["eval", "--dataset", "synthetic", str(tmp_path / "data"), "--out", str(out), *args, *extra])
    assert code == 0
    doc: dict[str, object] = json.loads((out / "results.json").read_text(encoding="utf-8"))
    return doc


def test_eval_fits_by_default_and_no_fit_skips_it(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """By default eval adds the ft and SEV-ft rows and writes each fold's fitted models;
    --no-fit leaves them out."""
    doc = _eval(tmp_path / "a", "--no-progress", "--no-plots", "--jobs", "1")
    arms = {m["arm"] for m in doc["metrics"]}  # type: ignore[attr-defined]
    assert {"SEV", "ft", "SEV-ft"} <= arms
    written = sorted(p.name for p in (tmp_path / "a" / "out").glob("fitted*.npz"))
    assert written == [f"fitted-fold{k}.npz" for k in range(5)]
    assert [f["file"] for f in doc["fitted"]] == written  # type: ignore[attr-defined]
    assert "no memory, fitted image model (FT)" in capsys.readouterr().out
    doc = _eval(tmp_path / "b", "--no-fit", "--no-progress", "--no-plots", "--jobs", "1")
    assert not {"ft", "SEV-ft"} & {m["arm"] for m in doc["metrics"]}  # type: ignore[attr-defined]
    assert not list((tmp_path / "b" / "out").glob("fitted*.npz")) and "fitted" not in doc


def test_eval_structured_gate_is_recorded(tmp_path: Path) -> None:
    """--structured-gate sets the store setting, recorded in results.json."""
    doc = _eval(tmp_path, "--structured-gate", "--no-fit", "--no-progress", "--no-plots", "--jobs", "1")
    assert doc["settings"]["memory"]["structured_gate"] is True  # type: ignore[index]


def test_eval_on_a_manifest_whose_rows_were_all_skipped_says_so(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """eval on a manifest whose every row is skipped (images outside its folder) exits 1
    saying the rows were skipped, naming the first reason, not that answers are empty."""
    export = tmp_path / "export"
    export.mkdir()
    rows = [
        {
            "patient_id": f"P{i}",
            "study_id": "S1",
            "timestamp": "2020-01-01",
            "image": str(tmp_path / f"{i}.png"),
            "question": "Impression?",
            "answer": "Small effusion.",
        }
        for i in range(4)
    ]
    manifest = export / "m.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    code = main(["eval", "--dataset", "manifest", str(manifest), "--out", str(tmp_path / "o"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"error: no rows to evaluate: all 4 rows of {manifest} were skipped (line 1: image ")
    assert "outside the folder" in last and "answer is empty" not in err


def test_eval_warns_of_a_question_whose_validation_answers_are_one_class(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A question group whose frozen (validation) answers are all one answer is named in a
    warning; a group with two answers, and online answers, are not."""
    from msm_mem.eval.records import Answered
    from msm_mem.interfaces.cli.evaluate import _warn_one_class

    def a(mode: str, question: str, reference: str) -> Answered:
        return Answered(mode, "WB4", "SEV", "p", "s", "x", reference, question_type="yes_no", question=question)

    _warn_one_class(
        [
            a("frozen", "Intubated?", "No."),
            a("frozen", "Intubated?", "no"),
            a("online", "Intubated?", "yes"),
            a("frozen", "ICU?", "yes"),
            a("frozen", "ICU?", "no"),
        ]
    )
    err = capsys.readouterr().err
    assert "every validation answer of yes_no question 'Intubated?' is 'no'" in err
    assert "ICU?" not in err
    # with folds, a fold whose validation answers are one class is named, the others not
    b = [
        replace(a("frozen", "ICU?", "yes"), fold=0),
        replace(a("frozen", "ICU?", "no"), fold=0),
        replace(a("frozen", "ICU?", "yes"), fold=1),
        replace(a("frozen", "ICU?", "yes"), fold=1),
    ]
    _warn_one_class(b)
    err = capsys.readouterr().err
    assert "'ICU?' in fold 1 is 'yes'" in err and "fold 0" not in err

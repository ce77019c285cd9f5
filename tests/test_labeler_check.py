"""Tests for msm_mem.eval.labeler_check: the labeler's agreement with MeSH terms."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from msm_mem.eval.labeler_check import agreement, iu_reports, main, mesh_observations, table_markdown


def test_mesh_terms_map_to_observations() -> None:
    """Headings map by name, qualifiers where a heading needs one; unmapped headings name nothing."""
    terms = ["Opacity/lung/base/left", "Thickening/pleura/right", "Cardiac Shadow/enlarged/mild", "Spine/degenerative"]
    assert mesh_observations(terms) == {"Lung Opacity", "Pleural Other", "Cardiomegaly"}
    assert mesh_observations(["normal"]) == {"No Finding"}
    assert mesh_observations(["Thickening/bronchi", "Calcified Granuloma"]) == set()


def test_precision_and_recall_on_a_constructed_case() -> None:
    """Four reports: effusion found and indexed (TP), effusion found but not indexed (FP),
    cardiomegaly indexed but not found (FN), and an unindexed report that is left out."""
    reports = [
        ("Small right pleural effusion.", ["Pleural Effusion/right/small"]),
        ("Left pleural effusion.", ["Lung/hypoinflation"]),
        ("The lungs are clear.", ["Cardiomegaly/mild"]),
        ("Large pleural effusion and cardiomegaly.", ["No Indexing"]),
    ]
    rows, total = agreement(reports)
    by = {r.observation: r for r in rows}
    effusion, heart = by["Pleural Effusion"], by["Cardiomegaly"]
    assert (effusion.support, effusion.predicted, effusion.tp) == (1, 2, 1)
    assert (effusion.precision, effusion.recall, effusion.f1) == (0.5, 1.0, pytest.approx(2 / 3))
    assert (heart.support, heart.predicted, heart.tp) == (1, 0, 0)
    assert (heart.precision, heart.recall, heart.f1) == (0.0, 0.0, 0.0)
    # micro over every observation: the labeler's No Finding on report 3 counts against MeSH too
    assert total.support == sum(r.support for r in rows) and total.tp == sum(r.tp for r in rows)
    assert total.predicted == sum(r.predicted for r in rows)
    text = table_markdown(rows, total, 3)
    assert "| Pleural Effusion | 1 | 2 | 1 | 50.0 | 100.0 | 66.7 |" in text


def test_committed_table_is_what_the_script_writes(tmp_path: Path) -> None:
    """docs/results/labeler.md is the output of the script on the wheel's reports."""
    if importlib.util.find_spec("torchxrayvision") is None:
        pytest.skip("torchxrayvision is not installed (its wheel ships NLMCXR_reports.tgz)")
    assert iu_reports()  # the archive is readable
    main(["--out", str(tmp_path / "labeler.md")])
    committed = Path(__file__).resolve().parents[1] / "docs" / "results" / "labeler.md"
    assert (tmp_path / "labeler.md").read_text(encoding="utf-8") == committed.read_text(encoding="utf-8")

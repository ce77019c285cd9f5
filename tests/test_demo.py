"""Tests for msm_mem.interfaces.demo: the end-to-end demo on the synthetic set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from msm_mem.interfaces.demo import run_demo

pytestmark = pytest.mark.slow


def test_demo_runs_end_to_end_and_reruns_identically(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A small demo exits 0, prints Table 1 and writes reports, plots and the S+E+V store; a quiet
    rerun in the same folder prints the summary (S+E+V and the best baseline, named) and
    replaces its outputs (stray files in its data folder go) with identical results."""
    assert run_demo(tmp_path, patients=8, jobs=1) == 0
    printed = capsys.readouterr().out
    assert "# Table 1" in printed and "| SEV | ✓ | ✓ | ✓ |" in printed and "baseline: nearest neighbour" in printed
    for name in ("table1.md", "table1.csv", "phases.md", "phases.csv", "results.json", "figure6.png", "gate.png"):
        assert (tmp_path / name).is_file(), name
    first = (tmp_path / "results.json").read_bytes()
    (tmp_path / "data" / "stray.txt").write_text("old", encoding="utf-8")
    assert run_demo(tmp_path, patients=8, verbose=False, jobs=1) == 0
    quiet = capsys.readouterr().out.splitlines()
    assert quiet[0].startswith("mean token F1 with memory (S+E+V)")
    assert quiet[1].startswith("mean token F1 of the best baseline (")  # the strongest rival, named
    records = json.loads(first)["metrics"]
    final = {
        r["arm"]: r["token_f1"]["mean"]
        for r in records
        if r["question_type"] == "all" and r["mode"] == "frozen" and r["phase"] == "WB4" and r["kind"] == "baseline"
    }
    assert f"{max(final.values()):.3f}" in quiet[1]
    assert len(quiet) == (2 if max(final, key=lambda a: (final[a], a == "prior")) == "prior" else 3)
    assert (tmp_path / "store" / "msm-mem.sqlite").is_file() and not (tmp_path / "stores").exists()
    assert (tmp_path / "results.json").read_bytes() == first
    assert not (tmp_path / "data" / "stray.txt").exists()

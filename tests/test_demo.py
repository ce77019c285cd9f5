"""Tests for msm_mem.interfaces.demo: the end-to-end demo on the synthetic set."""

from __future__ import annotations

from pathlib import Path

import pytest

from msm_mem.interfaces.demo import run_demo


def test_demo_runs_end_to_end_and_reruns_identically(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A small demo exits 0, prints Table 1 and writes reports, plots and the S+E+V store; a quiet
    rerun in the same folder prints two summary lines and replaces its outputs (stray files in its
    data folder go) with identical results."""
    assert run_demo(tmp_path, patients=8, jobs=1) == 0
    printed = capsys.readouterr().out
    assert "# Table 1" in printed and "| SEV | ✓ | ✓ | ✓ |" in printed and "baseline: nearest neighbour" in printed
    for name in ("table1.md", "table1.csv", "phases.md", "phases.csv", "results.json", "figure6.png", "gate.png"):
        assert (tmp_path / name).is_file(), name
    first = (tmp_path / "results.json").read_bytes()
    (tmp_path / "data" / "stray.txt").write_text("old", encoding="utf-8")
    assert run_demo(tmp_path, patients=8, verbose=False, jobs=1) == 0
    quiet = capsys.readouterr().out.splitlines()
    assert len(quiet) == 2 and quiet[0].startswith("mean token F1 with memory (S+E+V)")
    assert (tmp_path / "store" / "msm-mem.sqlite").is_file() and not (tmp_path / "stores").exists()
    assert (tmp_path / "results.json").read_bytes() == first
    assert not (tmp_path / "data" / "stray.txt").exists()

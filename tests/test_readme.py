"""The README's library example runs as written (on generated images and a two-row manifest)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import png

README = Path(__file__).resolve().parents[1] / "README.md"


def test_library_example_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first python block under "As a library" runs and shows the critic's correction."""
    match = re.search(r"## As a library.*?```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert match, "README has no library example"
    monkeypatch.chdir(tmp_path)
    rows = "".join(
        f"P1,S{i},2020-01-0{i + 1},{png(tmp_path, i).name},What is the impression?,Right lower lobe consolidation.,,\n"
        for i in range(2)
    )
    (tmp_path / "studies.csv").write_text(
        "patient_id,study_id,timestamp,image,question,answer,report,decision\n" + rows
    )
    png(tmp_path, 2).rename(tmp_path / "cxr.png")
    exec(compile(match.group(1), str(README), "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out[-2] == "['Right lower lobe consolidation.', 'Left basal effusion.']"
    assert out[-1] == "True"

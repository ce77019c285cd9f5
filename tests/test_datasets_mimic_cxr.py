from __future__ import annotations

import csv
import gzip
from pathlib import Path

import pytest

from msm_mem._errors import InvalidInput
from msm_mem.datasets.mimic_cxr import QUESTION, load, sections

REPORT_FULL = """                                 FINAL REPORT
 EXAMINATION:  CHEST (PA AND LAT)

 INDICATION:  ___F with cough  // eval for infection

 COMPARISON:  None.

 FINDINGS:

 There is no focal consolidation, pleural effusion or pneumothorax.  The
 cardiomediastinal silhouette is normal.

 IMPRESSION:

 No acute cardiopulmonary process.
"""
REPORT_NO_IMPRESSION = """                                 FINAL REPORT
 FINDINGS:  Small left pleural effusion,
 unchanged.
"""
REPORT_NO_HEADERS = """                                 FINAL REPORT
 Portable chest radiograph.

 Lines and tubes in standard position.  Mild pulmonary edema.
"""
META_COLUMNS = [
    "dicom_id",
    "subject_id",
    "study_id",
    "PerformedProcedureStepDescription",
    "ViewPosition",
    "Rows",
    "Columns",
    "StudyDate",
    "StudyTime",
]
# (dicom_id, subject, study, view, date, time, image file written?)
IMAGES = [
    ("d-lat-1", "10000032", "50000001", "LATERAL", "21800506", "213951.656", True),
    ("d-pa-1", "10000032", "50000001", "PA", "21800506", "213951.656", True),
    ("d-pa-2", "10000032", "50000002", "PA", "21800601", "80556.875", False),
    ("d-ap-2", "10000032", "50000002", "AP", "21800601", "80556.875", True),
    ("d-x-3", "11000011", "50000003", "", "21900101", "", True),
    ("d-pa-4", "11000011", "50000004", "PA", "21900201", "120000", True),  # no report
    ("d-pa-5", "11000011", "50000005", "PA", "21900301", "120000", False),  # no image
    ("d-pa-6", "11000011", "50000006", "PA", "2190-04-01", "120000", True),  # bad date
]
REPORTS = {
    "50000001": REPORT_FULL,
    "50000002": REPORT_NO_IMPRESSION,
    "50000003": REPORT_NO_HEADERS,
    "50000005": REPORT_FULL,
    "50000006": REPORT_FULL,
}


def _gz_csv(path: Path, header: list[str], rows: list[list[str]]) -> None:
    with gzip.open(path, "wt", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        writer.writerows(rows)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A tiny MIMIC-CXR-JPG tree: 2 subjects, 3 good studies and 3 broken ones."""
    meta, split = [], []
    for dicom, subject, study, view, day, time, write in IMAGES:
        folder = tmp_path / "files" / f"p{subject[:2]}" / f"p{subject}"
        (folder / f"s{study}").mkdir(parents=True, exist_ok=True)
        if write:
            (folder / f"s{study}" / f"{dicom}.jpg").write_bytes(b"jpg")
        if study in REPORTS:
            (folder / f"s{study}.txt").write_text(REPORTS[study], encoding="utf-8")
        meta.append([dicom, subject, study, "CHEST", view, "3056", "2544", day, time])
        if dicom != "d-pa-6":  # one image the split file does not list
            split.append([dicom, study, subject, "test" if study == "50000003" else "train"])
    _gz_csv(tmp_path / "mimic-cxr-2.0.0-metadata.csv.gz", META_COLUMNS, meta)
    _gz_csv(
        tmp_path / "mimic-cxr-2.0.0-split.csv.gz",
        ["dicom_id", "study_id", "subject_id", "split"],
        split,
    )
    return tmp_path


def test_rows_and_problems(tree: Path) -> None:
    """Three studies load; missing report, missing image and bad date are problems with lines."""
    rows, problems = load(tree)
    assert [(r.patient_id, r.study_id) for r in rows] == [
        ("mimic-10000032", "50000001"),
        ("mimic-10000032", "50000002"),
        ("mimic-11000011", "50000003"),
    ]
    assert [p.line for p in problems] == [7, 8, 9]
    assert problems[0].reason == (
        "study 50000004 of subject 11000011: report missing: files/p11/p11000011/s50000004.txt"
    )
    assert problems[1].reason.endswith("no image file in files/p11/p11000011/s50000005")
    assert problems[2].reason.endswith("StudyDate '2190-04-01' is not YYYYMMDD")


def test_impression_extraction_and_fallbacks(tree: Path) -> None:
    """Impression first, then findings, then the last paragraph."""
    rows, _ = load(tree)
    answers = {r.study_id: r.answer for r in rows}
    assert answers == {
        "50000001": "No acute cardiopulmonary process.",
        "50000002": "Small left pleural effusion, unchanged.",
        "50000003": "Lines and tubes in standard position. Mild pulmonary edema.",
    }
    first = rows[0]
    assert first.question == QUESTION and first.decision == ""
    assert first.report.startswith("FINAL REPORT\nEXAMINATION:")
    assert "IMPRESSION:\n\nNo acute" in first.report


def test_image_choice_and_time(tree: Path) -> None:
    """PA beats lateral; a missing PA falls back to AP; StudyTime without leading zero."""
    rows, _ = load(tree)
    by_id = {r.study_id: r for r in rows}
    assert by_id["50000001"].image.endswith("s50000001/d-pa-1.jpg") and by_id["50000001"].view == "PA"
    assert Path(by_id["50000001"].image).is_absolute()
    assert by_id["50000002"].image.endswith("d-ap-2.jpg") and by_id["50000002"].view == "AP"
    assert by_id["50000001"].to_dict()["timestamp"] == "2180-05-06T21:39:51.656000+00:00"
    assert by_id["50000002"].to_dict()["timestamp"] == "2180-06-01T08:05:56.875000+00:00"
    assert by_id["50000003"].to_dict()["timestamp"] == "2190-01-01T00:00:00+00:00"


def test_split_filter(tree: Path) -> None:
    """split keeps one split; images absent from the split file are problems."""
    rows, problems = load(tree, split="test")
    assert [r.study_id for r in rows] == ["50000003"]
    assert [p.reason for p in problems] == ["dicom_id 'd-pa-6' not in the split file"]
    train, _ = load(tree, split="train")
    assert [r.study_id for r in train] == ["50000001", "50000002"]
    with pytest.raises(InvalidInput, match="unknown split"):
        load(tree, split="val")


def test_reports_dir_and_plain_csv(tree: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Reports may live in another folder; an uncompressed metadata CSV works too."""
    other = tmp_path_factory.mktemp("reports")
    for txt in (tree / "files").rglob("*.txt"):
        target = other / txt.relative_to(tree)
        target.parent.mkdir(parents=True, exist_ok=True)
        txt.rename(target)
    meta = tree / "mimic-cxr-2.0.0-metadata.csv.gz"
    (tree / "mimic-cxr-2.0.0-metadata.csv").write_bytes(gzip.decompress(meta.read_bytes()))
    meta.unlink()
    assert load(tree)[0] == []
    rows, _ = load(tree, reports_dir=other)
    assert len(rows) == 3


def test_missing_metadata_raises(tmp_path: Path) -> None:
    """A root without the metadata CSV raises InvalidInput."""
    with pytest.raises(InvalidInput, match="metadata"):
        load(tmp_path)


def test_sections_headers() -> None:
    """Headers at line start split sections; combined and plural headers are recognised."""
    text = "FINAL REPORT\nFINDINGS AND IMPRESSION:  Clear lungs.\n IMPRESSIONS: none\nfoo: bar"
    assert sections(text) == {
        "": "FINAL REPORT",
        "FINDINGS AND IMPRESSION": "Clear lungs.",
        "IMPRESSIONS": "none foo: bar",
    }

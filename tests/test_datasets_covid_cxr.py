from __future__ import annotations

import csv
import os
from collections import Counter, defaultdict
from datetime import date
from pathlib import Path

import pytest
from PIL import Image

from msm_mem._errors import InvalidInput
from msm_mem.datasets.covid_cxr import NOTES_QUESTION, QUESTION, YES_NO_QUESTIONS, attribution, load, parse_date
from tests.strategies import png_declaring

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
COVID = SHARED / "data" / "covid-cxr"

HEADER = [
    "patientid",
    "offset",
    "sex",
    "age",
    "finding",
    "survival",
    "intubated",
    "went_icu",
    "needed_supplemental_O2",
    "view",
    "date",
    "location",
    "clinical_notes",
    "other_notes",
    "doi",
    "url",
    "license",
    "image",
    "source_filename",
]


def _row(pid: str, offset: str, finding: str, image: str, **extra: str) -> dict[str, str]:
    row = dict.fromkeys(HEADER, "")
    row.update(patientid=pid, offset=offset, finding=finding, image=image, view="PA")
    row.update(clinical_notes=f"notes of {pid}", doi="10.1/x", url="https://e.org/" + image)
    row.update(license="CC BY 4.0", source_filename="src-" + image)
    row.update(extra)
    return row


@pytest.fixture
def fake(tmp_path: Path) -> Path:
    """A small covid-cxr-like folder exercising every rule."""
    (tmp_path / "images").mkdir()
    for stem in ("0000", "0001", "0002", "0003", "0004", "0005", "0007", "0008"):
        Image.new("L", (8, 8), 100).save(tmp_path / "images" / f"{stem}.jpg")
    (tmp_path / "images" / "0006.jpg").write_bytes(b"not a jpeg")
    rows = [
        _row(
            "1",
            "9",
            "COVID-19",
            "images/0001.jpg",
            date="January 31, 2020",
            survival="Y",
            went_icu="Y",
            intubated="N",
        ),
        _row("1", "3", "COVID-19", "images/0000.jpg", date="2020"),
        _row(
            "1", "", "COVID-19,  ARDS", "images/0002.jpg", clinical_notes="multi\nline\nnotes"
        ),  # empty offset: 3, from the row above
        _row("2", "?", "Pneumonia", "images/0003.jpg"),
        _row("3", "0", "todo", "images/0004.jpg", view="?", clinical_notes=""),
        _row("4", "2", "Pneumonia", "images/missing.jpg"),
        _row("5", "1", "Pneumonia", "images/0006.jpg"),
        _row("6", "1", "Pneumonia", "../escape.jpg"),
        _row("7", "", "No Finding", "images/0007.jpg", date="?"),
        _row("7", "5", "No Finding", "images/0005.jpg", date="March 2019", survival="N"),
        _row("8", "1", "Pneumonia", "images/0001.jpg"),  # same image as patient 1
    ]
    with (tmp_path / "metadata.csv").open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=HEADER)
        writer.writeheader()
        writer.writerows(rows)
    return tmp_path


def test_every_csv_row_is_a_row_or_a_problem(fake: Path) -> None:
    """Nothing is dropped silently: every CSV line is either rows (its questions) or one problem."""
    rows, problems = load(fake)
    kept, skipped = {r.line for r in rows}, [p.line for p in problems]
    assert not kept & set(skipped) and len(set(skipped)) == len(skipped)
    assert sorted([*kept, *skipped]) == [2, 3, 4, 7, 8, 9, 10, 11, 12, 13, 14]  # row 3 spans lines 4-6


def test_each_study_asks_the_questions_it_answers(fake: Path) -> None:
    """The finding is a label question; recorded Y/N outcomes are yes/no questions (unknown ones
    give none); non-empty clinical notes are a free-text question; all share the study's image."""
    rows, _ = load(fake)
    one = sorted((r.question_type, r.question, r.answer) for r in rows if r.study_id == "0001")
    assert one == sorted(
        [
            ("label", QUESTION, "COVID-19"),
            ("yes_no", YES_NO_QUESTIONS["survival"], "yes"),
            ("yes_no", YES_NO_QUESTIONS["went_icu"], "yes"),
            ("yes_no", YES_NO_QUESTIONS["intubated"], "no"),
            ("text", NOTES_QUESTION, "notes of 1"),
        ]
    )
    assert len({(r.image, r.timestamp, r.decision) for r in rows if r.study_id == "0001"}) == 1
    multi = [r for r in rows if r.study_id == "0002"]
    assert {(r.question_type, r.answer) for r in multi} == {("label", "COVID-19, ARDS"), ("text", "multi line notes")}
    five = {r.question for r in rows if r.study_id == "0005"}
    assert five == {QUESTION, YES_NO_QUESTIONS["survival"], NOTES_QUESTION}  # intubated etc. unknown: no row


def test_problem_reasons(fake: Path) -> None:
    """Bad offsets, unlabelled findings, missing, broken or escaping images and duplicates."""
    _, problems = load(fake)
    reasons = {p.line: p.reason for p in problems}
    assert reasons[7] == "offset '?' is not a whole number of days"
    assert reasons[8] == "no question answered (unlabelled finding 'todo', no outcome, no clinical notes)"
    assert reasons[9] == "image file missing: images/missing.jpg"
    assert reasons[10].startswith("unreadable image images/0006.jpg")
    assert reasons[11] == "image path '../escape.jpg' leaves the data set folder"
    assert reasons[14] == "duplicate image '0001' (line 2)"


def test_unlabelled_rows_can_be_kept(fake: Path) -> None:
    """keep_unlabelled keeps 'todo' rows with an empty answer and an empty '?' view."""
    rows, problems = load(fake, keep_unlabelled=True)
    kept = [r for r in rows if r.patient_id == "covid-3"]
    assert len(kept) == 1 and kept[0].answer == "" and kept[0].view == ""
    assert 8 not in {p.line for p in problems}


def test_fields_of_a_row(fake: Path) -> None:
    """Ids, question, normalised label, outcome decision, notes and absolute image path."""
    rows, _ = load(fake)
    row = next(r for r in rows if r.study_id == "0001" and r.question_type == "label")
    assert (row.patient_id, row.question, row.answer) == ("covid-1", QUESTION, "COVID-19")
    assert row.decision == "icu; not intubated; survived"
    assert row.report == "notes of 1" and row.view == "PA"
    assert row.image == str((fake / "images" / "0001.jpg").resolve())
    multi = next(r for r in rows if r.study_id == "0002" and r.question == QUESTION)
    assert multi.answer == "COVID-19, ARDS" and multi.report == "multi\nline\nnotes"
    assert next(r for r in rows if r.study_id == "0000").decision == ""


def test_times_follow_offsets_from_the_most_precise_date(fake: Path) -> None:
    """The day-precision date anchors patient 1; empty offsets carry forward; order by time."""
    rows, _ = load(fake)
    p1 = [r for r in rows if r.patient_id == "covid-1" and r.question == QUESTION]
    assert [r.study_id for r in p1] == ["0000", "0002", "0001"]
    days = [r.to_dict()["timestamp"][:10] for r in p1]
    assert days == ["2020-01-25", "2020-01-25", "2020-01-31"]
    p7 = [r for r in rows if r.patient_id == "covid-7" and r.question == QUESTION]
    # anchor = 1 March 2019 - 5 days; the empty offset on the first row is day 0
    assert [(r.study_id, r.to_dict()["timestamp"][:10]) for r in p7] == [
        ("0007", "2019-02-24"),
        ("0005", "2019-03-01"),
    ]
    assert rows == sorted(rows, key=lambda r: (r.patient_id, r.timestamp, r.study_id, r.question))


def test_parse_date_formats() -> None:
    """Years, month-years and full dates parse with their precision; junk does not."""
    assert parse_date("2015") == (date(2015, 1, 1), 1)
    assert parse_date("March 2020") == (date(2020, 3, 1), 2)
    assert parse_date("January 25, 2020") == (date(2020, 1, 25), 3)
    assert parse_date("Sept 3 2019") == (date(2019, 9, 3), 3)
    assert parse_date("2020-02-30") is None
    for junk in ("", "?", "Smarch 2020", "25/01/2020"):
        assert parse_date(junk) is None


def test_attribution_covers_every_study(fake: Path) -> None:
    """attribution lists doi, url and license for every CSV row, sorted by study id."""
    attr = attribution(fake / "metadata.csv")
    assert len(attr) == 11
    first = attr[0]
    assert first == {
        "study_id": "0000",
        "patient_id": "covid-1",
        "doi": "10.1/x",
        "url": "https://e.org/images/0000.jpg",
        "license": "CC BY 4.0",
        "source_filename": "src-images/0000.jpg",
    }


def test_missing_folder_or_columns_raise(tmp_path: Path) -> None:
    """A folder without metadata.csv, or a CSV without required columns, raises InvalidInput."""
    with pytest.raises(InvalidInput, match="metadata.csv"):
        load(tmp_path)
    (tmp_path / "metadata.csv").write_text("patientid,offset\n1,2\n", encoding="utf-8")
    with pytest.raises(InvalidInput, match="missing column"):
        load(tmp_path)


@pytest.mark.shared
class TestSharedData:
    """The real snapshot in ../shared/data/covid-cxr."""

    @pytest.fixture(autouse=True)
    def _need_data(self) -> None:
        if not (COVID / "metadata.csv").is_file():
            pytest.skip("../shared/data/covid-cxr absent")

    def test_counts_with_unlabelled_rows(self) -> None:
        """All 299 CSV rows are accounted for: 295 studies of 145 patients, 4 '?' offsets
        skipped; keep_unlabelled adds the 52 unlabelled findings as empty label rows."""
        rows, problems = load(COVID, keep_unlabelled=True)
        assert len({r.study_id for r in rows}) + len(problems) == 299
        assert (len({r.study_id for r in rows}), len(problems)) == (295, 4)
        assert all("offset '?'" in p.reason for p in problems)
        assert len({r.patient_id for r in rows}) == 145
        assert sum(r.question_type == "label" and not r.answer for r in rows) == 52

    def test_counts_by_default(self) -> None:
        """243 labelled findings, 381 recorded yes/no outcomes and 220 clinical notes: 844
        questions about 295 studies of 145 patients; unknown outcomes give no row."""
        rows, problems = load(COVID)
        assert len(problems) == 4
        kinds = Counter(r.question_type for r in rows)
        assert (kinds["label"], kinds["yes_no"], kinds["text"]) == (243, 381, 220)
        assert all(r.answer for r in rows)
        assert {r.answer for r in rows if r.question_type == "yes_no"} == {"yes", "no"}
        assert len({r.patient_id for r in rows}) == 145

    def test_longitudinal_patients_and_images(self) -> None:
        """48 patients have two or more times; time gaps equal offset gaps; images exist."""
        rows, _ = load(COVID, keep_unlabelled=True)
        with (COVID / "metadata.csv").open(encoding="utf-8", newline="") as fh:
            offsets = {Path(r["image"]).stem: r["offset"] for r in csv.DictReader(fh)}
        times: dict[str, list[tuple[float, str]]] = defaultdict(list)
        for r in rows:
            assert Path(r.image).is_file()
            if offsets[r.study_id].lstrip("-").isdigit():
                times[r.patient_id].append((r.timestamp, offsets[r.study_id]))
        for seq in times.values():
            for (t0, o0), (t1, o1) in zip(seq, seq[1:], strict=False):
                assert t1 - t0 == (int(o1) - int(o0)) * 86_400
        patient_times: dict[str, set[float]] = defaultdict(set)
        for r in rows:
            patient_times[r.patient_id].add(r.timestamp)
        assert sum(len(t) >= 2 for t in patient_times.values()) == 48
        assert len(attribution(COVID)) == 299


def _folder(tmp_path: Path, rows: list[dict[str, str]]) -> Path:
    with (tmp_path / "metadata.csv").open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=HEADER)
        writer.writeheader()
        writer.writerows(rows)
    return tmp_path


def test_links_fifos_huge_headers_and_bad_ids_are_problems(tmp_path: Path) -> None:
    """A link out of the folder, a FIFO, a 9000x9000 header and a wildcard or control-character
    patient id each become a problem on their line; the good row still loads."""
    data = tmp_path / "data"
    (data / "images").mkdir(parents=True)
    Image.new("L", (8, 8), 100).save(tmp_path / "outside.png")
    Image.new("L", (8, 8), 100).save(data / "images" / "0001.png")
    (data / "images" / "0002.png").symlink_to(tmp_path / "outside.png")
    os.mkfifo(data / "images" / "0003.png")
    (data / "images" / "0004.png").write_bytes(png_declaring(9000, 9000))
    for stem in ("0005", "0006"):
        Image.new("L", (8, 8), 100).save(data / "images" / f"{stem}.png")
    rows = [
        _row("1", "0", "Pneumonia", "images/0001.png"),
        _row("2", "0", "Pneumonia", "images/0002.png"),
        _row("3", "0", "Pneumonia", "images/0003.png"),
        _row("4", "0", "Pneumonia", "images/0004.png"),
        _row("*", "0", "Pneumonia", "images/0005.png"),
        _row("6\nx", "0", "Pneumonia", "images/0006.png"),
    ]
    got, problems = load(_folder(data, rows))
    assert {r.study_id for r in got} == {"0001"}
    reasons = {p.line: p.reason for p in problems}
    assert "leaves the data set folder" in reasons[3]
    assert "not a regular file" in reasons[4]
    assert "too large" in reasons[5]
    assert "wildcard" in reasons[6]
    assert "control" in reasons[7]

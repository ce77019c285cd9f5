"""Tests of msm_mem.datasets.manifest: reading, validation, line numbers and round trips (the
files it refuses, the bounds on a row and the fuzzing are in ``tests/test_manifest_bounds.py``)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from PIL import Image

from msm_mem import ManifestError, ManifestRow, RowProblem, read_manifest, write_manifest
from msm_mem.datasets.manifest import COLUMNS, parse_timestamp
from tests.manifest_support import GOOD, HEADER, by_line, json_row, write_file, write_jsonl

# reading --------------------------------------------------------------------------------------


def test_csv_good_rows_are_read_with_all_fields(tmp_path: Path) -> None:
    """A valid CSV row becomes a ManifestRow with every column and its line number."""
    path = write_file(tmp_path / "m.csv", f"{HEADER},view\n{GOOD},PA\n")
    rows, problems = read_manifest(path)
    assert problems == []
    (row,) = rows
    assert (row.patient_id, row.study_id, row.question) == ("p1", "s1", "What is seen?")
    assert (row.answer, row.report, row.decision, row.view) == (
        "small effusion",
        "report text",
        "follow up",
        "PA",
    )
    assert row.timestamp == datetime(2020, 1, 2, tzinfo=UTC).timestamp()
    assert row.line == 2


def test_jsonl_good_rows_are_read(tmp_path: Path) -> None:
    """Each JSONL object becomes a row numbered by its 1-based line; blank lines are skipped."""
    path = write_file(
        tmp_path / "m.jsonl",
        json.dumps(json_row()) + "\n\n" + json.dumps(json_row(study_id="s2")) + "\n",
    )
    rows, problems = read_manifest(path)
    assert problems == []
    assert [(r.study_id, r.line) for r in rows] == [("s1", 1), ("s2", 3)]


def test_optional_columns_may_be_absent_in_jsonl(tmp_path: Path) -> None:
    """answer, report, decision and view default to empty strings when absent."""
    obj = {k: v for k, v in json_row().items() if k not in ("answer", "report", "decision")}
    rows, problems = read_manifest(write_jsonl(tmp_path / "m.jsonl", [obj]))
    assert problems == []
    assert (rows[0].answer, rows[0].report, rows[0].decision, rows[0].view) == ("", "", "", "")


def test_csv_bom_is_ignored(tmp_path: Path) -> None:
    """A UTF-8 byte-order mark before the header does not corrupt the first column name."""
    path = tmp_path / "m.csv"
    path.write_bytes(("\ufeff" + f"{HEADER}\n{GOOD}\n").encode("utf-8"))
    rows, problems = read_manifest(path)
    assert problems == []
    assert rows[0].patient_id == "p1"


# bad rows -------------------------------------------------------------------------------------


def test_csv_every_bad_row_kind_is_reported_with_its_line(tmp_path: Path) -> None:
    """Each kind of bad CSV row is a problem on its own 1-based line; good rows survive."""
    text = "\n".join(
        [
            HEADER,  # 1
            GOOD,  # 2 good
            "p1,s2,2020-01-03,a.png,,answer,,",  # 3 empty question
            "p1,s3,yesterday,a.png,Q?,answer,,",  # 4 bad timestamp
            "p1,s4,2020-01-04,a.png,Q?,answer,,,extra",  # 5 extra field
            "p1,s1,2020-01-02,img/a.png,What is seen?,dup,,",  # 6 duplicate question of line 2
            ",s5,2020-01-06,a.png,Q?,answer,,",  # 7 empty patient id
            "p1,s6",  # 8 missing columns
            "p1,s7,2020-01-07,b.png,Q?,fine,,",  # 9 good
        ]
    )
    rows, problems = read_manifest(write_file(tmp_path / "m.csv", text + "\n"))
    assert [(r.study_id, r.line) for r in rows] == [("s1", 2), ("s7", 9)]
    reasons = by_line(problems)
    assert sorted(reasons) == [3, 4, 5, 6, 7, 8]
    assert "question" in reasons[3] and "empty" in reasons[3]
    assert "yesterday" in reasons[4]
    assert "more fields" in reasons[5]
    assert "duplicate" in reasons[6] and "line 2" in reasons[6]
    assert "patient_id" in reasons[7]
    assert "missing" in reasons[8] and "timestamp" in reasons[8] and "question" in reasons[8]


def test_csv_unknown_column_is_reported(tmp_path: Path) -> None:
    """A header column outside the schema makes its rows problems that name the column."""
    text = f"{HEADER},colour\n{GOOD},red\n"
    rows, problems = read_manifest(write_file(tmp_path / "m.csv", text))
    assert rows == []
    assert problems == [RowProblem(2, "unknown column(s): colour")]


def test_csv_missing_header_column_is_reported(tmp_path: Path) -> None:
    """A header without a required column reports every row as missing that column."""
    cols = [c for c in COLUMNS if c != "question"]
    text = ",".join(cols) + "\np1,s1,2020-01-02,a.png,ans,,\n"
    rows, problems = read_manifest(write_file(tmp_path / "m.csv", text))
    assert rows == []
    assert problems == [RowProblem(2, "missing required column(s): question")]


def test_csv_multiline_field_numbers_rows_by_their_first_line(tmp_path: Path) -> None:
    """A quoted report spanning lines keeps the row on its first line and later rows exact."""
    text = (
        f"{HEADER}\n"
        'p1,s1,2020-01-02,a.png,Q?,ans,"line one\nline two\nline three",\n'  # lines 2-4
        "p1,s2,2020-01-03,a.png,,ans,,\n"  # line 5: empty question
    )
    rows, problems = read_manifest(write_file(tmp_path / "m.csv", text))
    assert [(r.study_id, r.line) for r in rows] == [("s1", 2)]
    assert rows[0].report == "line one\nline two\nline three"
    assert [p.line for p in problems] == [5]


def test_csv_malformed_quoting_does_not_stop_reading(tmp_path: Path) -> None:
    """A row with broken quoting is a problem on its line; the rows after it are still read."""
    text = f'{HEADER}\np1,s1,2020-01-02,a.png,"Q?"x,ans,,\np1,s2,2020-01-03,a.png,Q?,ans,,\n'
    rows, problems = read_manifest(write_file(tmp_path / "m.csv", text))
    assert [r.study_id for r in rows] == ["s2"]
    assert rows[0].line == 3
    assert len(problems) == 1 and problems[0].line == 2
    assert "malformed CSV" in problems[0].reason


def test_csv_blank_lines_keep_line_numbers_physical(tmp_path: Path) -> None:
    """Blank lines are skipped but still counted, so numbers match an editor's."""
    text = f"{HEADER}\n\n{GOOD}\n\np1,s2,x,a.png,Q?,a,,\n"
    rows, problems = read_manifest(write_file(tmp_path / "m.csv", text))
    assert [r.line for r in rows] == [3]
    assert [p.line for p in problems] == [5]


def test_jsonl_every_bad_row_kind_is_reported_with_its_line(tmp_path: Path) -> None:
    """Invalid JSON, non-objects, unknown/missing columns and duplicates each name their line."""
    items: list[object] = [
        json_row(),  # 1 good
        "{not json",  # 2 invalid JSON
        [1, 2, 3],  # 3 not an object
        json_row(study_id="s2", colour="red"),  # 4 unknown column
        {k: v for k, v in json_row(study_id="s3").items() if k != "image"},  # 5 missing image
        json_row(study_id="s4", question="   "),  # 6 blank question
        json_row(study_id="s5", timestamp="2020-13-45"),  # 7 bad timestamp
        json_row(),  # 8 duplicate of line 1
        json_row(study_id="s6", answer=["a", "list"]),  # 9 non-text column
        json_row(study_id="s7", timestamp=None),  # 10 null timestamp
        json_row(study_id="s8"),  # 11 good
    ]
    rows, problems = read_manifest(write_jsonl(tmp_path / "m.jsonl", items))
    assert [(r.study_id, r.line) for r in rows] == [("s1", 1), ("s8", 11)]
    reasons = by_line(problems)
    assert sorted(reasons) == list(range(2, 11))
    assert reasons[2].startswith("invalid JSON")
    assert "object" in reasons[3]
    assert reasons[4] == "unknown column(s): colour"
    assert reasons[5] == "missing required column(s): image"
    assert "question" in reasons[6] and "empty" in reasons[6]
    assert "2020-13-45" in reasons[7]
    assert "duplicate" in reasons[8] and "first on line 1" in reasons[8]
    assert "answer" in reasons[9]
    assert "timestamp" in reasons[10]


def test_manifest_error_reason_and_line_match_row_problem(tmp_path: Path) -> None:
    """A problem's reason carries no 'line N:' prefix; the line is a separate field."""
    path = write_jsonl(tmp_path / "m.jsonl", [json_row(question="")])
    _, problems = read_manifest(path)
    assert problems[0].line == 1
    assert not problems[0].reason.startswith("line")


# timestamps -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("2020-01-02", datetime(2020, 1, 2, tzinfo=UTC)),
        ("2020-01-02T03:04:05", datetime(2020, 1, 2, 3, 4, 5, tzinfo=UTC)),
        ("2020-01-02T03:04:05Z", datetime(2020, 1, 2, 3, 4, 5, tzinfo=UTC)),
        ("2020-01-02T05:04:05+02:00", datetime(2020, 1, 2, 3, 4, 5, tzinfo=UTC)),
        ("1577934245", datetime(2020, 1, 2, 3, 4, 5, tzinfo=UTC)),
        (1577934245, datetime(2020, 1, 2, 3, 4, 5, tzinfo=UTC)),
        (1577934245.5, datetime(2020, 1, 2, 3, 4, 5, 500000, tzinfo=UTC)),
        (0, datetime(1970, 1, 1, tzinfo=UTC)),
    ],
)
def test_parse_timestamp_accepts_iso_dates_and_epoch(raw: object, expected: datetime) -> None:
    """ISO dates, date-times (naive = UTC, Z, offsets) and epoch seconds give UTC seconds."""
    assert parse_timestamp(raw) == expected.timestamp()


@pytest.mark.parametrize("raw", ["", "  ", "soon", "nan", "inf", "1e400", True, None, [], 1e300])
def test_parse_timestamp_rejects_bad_values(raw: object) -> None:
    """Empty, unparseable, non-finite, boolean, non-scalar and out-of-range values raise."""
    with pytest.raises(ValueError):
        parse_timestamp(raw)


def test_epoch_zero_timestamp_is_a_value_not_missing(tmp_path: Path) -> None:
    """A JSONL timestamp of 0 (the epoch) is accepted, not mistaken for a missing column."""
    rows, problems = read_manifest(write_jsonl(tmp_path / "m.jsonl", [json_row(timestamp=0)]))
    assert problems == []
    assert rows[0].timestamp == 0.0


# image paths ----------------------------------------------------------------------------------


def test_relative_image_paths_resolve_against_the_manifest_folder(tmp_path: Path) -> None:
    """A relative image path is joined to the manifest's folder; an absolute one is kept when
    it lies inside the allowed root (the manifest's folder unless the caller names another)."""
    folder = tmp_path / "data"
    folder.mkdir()
    absolute = tmp_path / "elsewhere" / "b.png"
    inner = folder / "img" / "c.png"
    items: list[object] = [
        json_row(image="img/a.png"),
        json_row(study_id="s2", image=str(absolute)),
        json_row(study_id="s3", image=str(inner)),
    ]
    manifest = write_jsonl(folder / "m.jsonl", items)
    rows, _ = read_manifest(manifest, root=tmp_path)
    assert rows[0].image == str(folder / "img" / "a.png")
    assert rows[1].image == str(absolute)
    assert rows[2].image == str(inner)
    rows, problems = read_manifest(manifest)  # by default only the manifest's folder
    assert [r.study_id for r in rows] == ["s1", "s3"]
    assert list(by_line(problems)) == [2] and "outside the folder" in problems[0].reason


def test_rows_carry_absolute_image_paths_whatever_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A manifest named by a relative path gives rows whose images are absolute (the folder the
    reader ran in joined to the manifest's folder), so a store finds them from anywhere."""
    folder = tmp_path / "data"
    folder.mkdir()
    write_jsonl(folder / "m.jsonl", [json_row(image="img/a.png")])
    monkeypatch.chdir(tmp_path)
    rows, problems = read_manifest("data/m.jsonl")
    assert problems == [] and rows[0].image == str(tmp_path / "data" / "img" / "a.png")
    monkeypatch.chdir(folder)
    assert read_manifest("m.jsonl")[0][0].image == rows[0].image


def test_several_roots_allow_images_under_any_of_them(tmp_path: Path) -> None:
    """root= takes several folders: an image under any of them is read, one under none is a
    problem naming every folder and the option that allows one; the manifest's own folder is
    then not allowed unless named."""
    export, pacs, other = tmp_path / "export", tmp_path / "pacs", tmp_path / "other"
    for folder in (export, pacs, other):
        folder.mkdir()
    items: list[object] = [
        json_row(image=str(pacs / "a.png")),
        json_row(study_id="s2", image=str(other / "b.png")),
        json_row(study_id="s3", image="c.png"),
    ]
    manifest = write_jsonl(export / "m.jsonl", items)
    rows, problems = read_manifest(manifest, root=[pacs, other])
    assert [r.study_id for r in rows] == ["s1", "s2"]
    assert list(by_line(problems)) == [3]
    assert f"outside the folders {pacs}, {other}" in problems[0].reason and "--image-root" in problems[0].reason
    rows, problems = read_manifest(manifest, root=[export, pacs])
    assert [r.study_id for r in rows] == ["s1", "s3"] and list(by_line(problems)) == [2]


def test_a_root_is_no_way_out_through_links_or_dotdot(tmp_path: Path) -> None:
    """Under a named root, '..' and a symlink leading out of it are problems like under the
    manifest's folder."""
    pacs = tmp_path / "pacs"
    pacs.mkdir()
    secret = tmp_path / "secret.png"
    secret.write_bytes(b"x")
    (pacs / "link.png").symlink_to(secret)
    items: list[object] = [
        json_row(image=str(pacs / ".." / "secret.png")),
        json_row(study_id="s2", image=str(pacs / "link.png")),
    ]
    rows, problems = read_manifest(write_jsonl(tmp_path / "m.jsonl", items), root=pacs)
    assert rows == [] and sorted(by_line(problems)) == [1, 2]
    assert all("outside the folder" in p.reason for p in problems)


@pytest.mark.parametrize("root", ["missing", "file.txt", []])
def test_a_root_that_is_not_a_folder_is_refused(tmp_path: Path, root: object) -> None:
    """A root that does not exist, is a file, or an empty list of roots is a ManifestError
    naming it, before any row is read."""
    (tmp_path / "file.txt").write_text("x")
    manifest = write_jsonl(tmp_path / "m.jsonl", [json_row()])
    given = tmp_path / root if isinstance(root, str) else root
    with pytest.raises(ManifestError, match="root"):
        read_manifest(manifest, root=given)  # type: ignore[arg-type]


# writing --------------------------------------------------------------------------------------


def _rows(tmp_path: Path) -> list[ManifestRow]:
    return [
        ManifestRow(
            "p1",
            "s1",
            1577934245.0,
            str(tmp_path / "a.png"),
            "What, if anything, is seen?",
            'effusion "small"',
            "multi\nline report",
            "follow up",
            "PA",
            line=1,
        ),
        ManifestRow("p2", "s1", 0.0, str(tmp_path / "b.png"), "Q?", "", line=2),
    ]


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_write_then_read_round_trips(tmp_path: Path, suffix: str) -> None:
    """write_manifest then read_manifest returns the same rows (quotes, commas, newlines)."""
    rows = _rows(tmp_path)
    path = tmp_path / f"out{suffix}"
    write_manifest(rows, path)
    back, problems = read_manifest(path)
    assert problems == []
    strip = [r.to_dict() for r in rows]
    assert [r.to_dict() for r in back] == strip
    assert [r.timestamp for r in back] == [r.timestamp for r in rows]


def test_write_manifest_refuses_unknown_suffix(tmp_path: Path) -> None:
    """Writing to a name that is neither .csv nor .jsonl raises ManifestError, creating nothing."""
    with pytest.raises(ManifestError):
        write_manifest(_rows(tmp_path), tmp_path / "out.txt")
    assert not (tmp_path / "out.txt").exists()


def test_to_dict_uses_iso_utc_and_omits_line(tmp_path: Path) -> None:
    """to_dict writes the timestamp as ISO 8601 UTC and leaves out the line number."""
    d = _rows(tmp_path)[0].to_dict()
    assert d["timestamp"] == "2020-01-02T03:04:05+00:00"
    assert "line" not in d
    assert set(d) == set(COLUMNS) | {"view", "question_type"}


def test_question_type_column_and_several_questions_per_study(tmp_path: Path) -> None:
    """question_type defaults to text; a study may carry several questions; a repeated question,
    an unknown type, or a second row of a study with another image are problems on their lines."""
    Image.new("L", (8, 8)).save(tmp_path / "a.png")
    Image.new("L", (8, 8)).save(tmp_path / "b.png")
    (tmp_path / "m.csv").write_text(
        "\n".join(
            [
                HEADER + ",question_type",
                "p1,s1,2020-01-05,a.png,What is it?,COVID-19,,,label",  # 2
                "p1,s1,2020-01-05,a.png,Intubated?,yes,,,yes_no",  # 3
                "p1,s1,2020-01-05,a.png,Notes?,free text,,,",  # 4: empty type -> text
                "p1,s1,2020-01-05,a.png,Intubated?,no,,,yes_no",  # 5 duplicate question
                "p1,s1,2020-01-05,b.png,Survived?,yes,,,yes_no",  # 6 another image
                "p1,s2,2020-01-06,b.png,What is it?,x,,,choice",  # 7 unknown type
                "p1,s2,2020-01-06,b.png,Survived?,unknown,,,yes_no",  # 8 neither yes nor no
                "p1,s2,2020-01-06,b.png,Intubated?,No.,,,yes_no",  # 9 good
            ]
        )
        + "\n",
        encoding="utf-8",
    )
    rows, problems = read_manifest(tmp_path / "m.csv")
    assert [(r.question, r.question_type) for r in rows] == [
        ("What is it?", "label"),
        ("Intubated?", "yes_no"),
        ("Notes?", "text"),
        ("Intubated?", "yes_no"),
    ]
    reasons = {p.line: p.reason for p in problems}
    assert sorted(reasons) == [5, 6, 7, 8]
    assert "answer must be yes, no or empty" in reasons[8]
    assert "duplicate question" in reasons[5] and "first on line 3" in reasons[5]
    assert "another image" in reasons[6] and "line 2" in reasons[6]
    assert "question_type must be one of label, yes_no, text" in reasons[7]
    (tmp_path / "n.csv").write_text(HEADER + "\np1,s1,2020-01-05,a.png,Q?,A,,\n", encoding="utf-8")
    assert read_manifest(tmp_path / "n.csv")[0][0].question_type == "text"  # no column: text


# hygiene ---------------------------------------------------------------------------------------


def test_a_csv_header_with_a_duplicate_column_is_refused_naming_it(tmp_path: Path) -> None:
    """A header naming answer twice is a ManifestError at line 1, not rows filed under the last answer."""
    text = f"{HEADER},answer\n{GOOD},other answer\n"
    with pytest.raises(ManifestError, match="duplicate CSV column.*'answer'") as info:
        read_manifest(write_file(tmp_path / "m.csv", text))
    assert info.value.line == 1


def test_a_jsonl_row_with_a_duplicate_key_is_a_problem_naming_its_line(tmp_path: Path) -> None:
    """A row repeating patient_id is reported at its line; the other rows are read."""
    good = json.dumps(json_row())
    twice = good[:-1] + ', "patient_id": "p2"}'
    rows, problems = read_manifest(write_jsonl(tmp_path / "m.jsonl", [good, twice]))
    assert [r.line for r in rows] == [1]
    assert problems == [RowProblem(2, "duplicate JSON key 'patient_id' in the row")]


def test_manifest_text_is_read_in_nfc(tmp_path: Path) -> None:
    """Decomposed ids and text in a manifest are stored composed."""
    row = json_row(patient_id="Jose\u0301", question="Is the re\u0301sume\u0301 clear?")
    (read,), problems = read_manifest(write_jsonl(tmp_path / "m.jsonl", [row]))
    assert problems == []
    assert (read.patient_id, read.question) == ("Jos\u00e9", "Is the r\u00e9sum\u00e9 clear?")


def test_a_control_or_bidi_character_in_a_manifest_is_a_row_problem(tmp_path: Path) -> None:
    """An ESC in an answer or an RLO in a view is reported at its line naming the code point."""
    items = [json_row(answer="ok\x1b[2J"), json_row(study_id="s2", view="P\u202eA")]
    rows, problems = read_manifest(write_jsonl(tmp_path / "m.jsonl", items))
    assert rows == []
    assert by_line(problems) == {
        1: "answer must not contain a control character (found U+001B)",
        2: "view must not contain a bidirectional override or isolate (found U+202E)",
    }

"""Tests of msm_mem.datasets.manifest against hostile input: files refused as a whole, rows past
the bounds on size, nesting, numbers, ids and image paths, and fuzzed files that must give rows,
row problems or a ManifestError, never another exception."""

from __future__ import annotations

import csv
import io
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from msm_mem import ManifestError, ManifestRow, RowProblem, read_manifest
from msm_mem.datasets.manifest import COLUMNS
from tests.manifest_support import GOOD, HEADER, by_line, json_row, write_file, write_jsonl
from tests.strategies import jsonl_lines

# file-level errors ----------------------------------------------------------------------------


def test_wrong_suffix_raises_manifest_error(tmp_path: Path) -> None:
    """A manifest that is neither .csv nor .jsonl raises ManifestError naming the suffix."""
    path = write_file(tmp_path / "m.txt", f"{HEADER}\n{GOOD}\n")
    with pytest.raises(ManifestError, match=r"\.txt"):
        read_manifest(path)


def test_missing_file_raises_manifest_error(tmp_path: Path) -> None:
    """A path that does not exist raises ManifestError, not FileNotFoundError."""
    with pytest.raises(ManifestError, match="no such manifest"):
        read_manifest(tmp_path / "absent.csv")


def test_directory_raises_manifest_error(tmp_path: Path) -> None:
    """A directory named like a manifest raises ManifestError."""
    (tmp_path / "d.csv").mkdir()
    with pytest.raises(ManifestError):
        read_manifest(tmp_path / "d.csv")


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_non_utf8_file_raises_manifest_error(tmp_path: Path, suffix: str) -> None:
    """A file that is not UTF-8 raises ManifestError saying so."""
    path = tmp_path / f"m{suffix}"
    path.write_bytes(f"{HEADER}\n".encode() + "p\xe9,s1\n".encode("latin-1"))
    with pytest.raises(ManifestError, match="UTF-8"):
        read_manifest(path)


def test_empty_files_give_no_rows_and_no_problems(tmp_path: Path) -> None:
    """An empty CSV or JSONL holds nothing and is not an error."""
    assert read_manifest(write_file(tmp_path / "m.csv", "")) == ([], [])
    assert read_manifest(write_file(tmp_path / "m.jsonl", "")) == ([], [])


def test_manifest_error_carries_the_line() -> None:
    """ManifestError keeps the line and the bare reason, and prefixes the message."""
    err = ManifestError("bad", 7)
    assert (err.line, err.reason, str(err)) == (7, "bad", "line 7: bad")
    assert ManifestError("file-level").line is None


# bounded input --------------------------------------------------------------------------------


def test_deeply_nested_json_line_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    """A line nested 100,000 levels deep is refused before parsing; the next row still loads."""
    deep = '{"patient_id": ' + "[" * 100_000 + "]" * 100_000 + "}"
    rows, problems = read_manifest(write_jsonl(tmp_path / "m.jsonl", [deep, json_row()]))
    assert [r.line for r in rows] == [2]
    assert by_line(problems) == {1: "JSON nested deeper than 16 levels"}


def test_twenty_megabyte_field_is_skipped_and_reading_goes_on(tmp_path: Path) -> None:
    """A 20 MB question in JSONL or CSV is a problem naming its line; later rows keep their numbers."""
    big = "q" * 20_000_000
    rows, problems = read_manifest(write_jsonl(tmp_path / "m.jsonl", [json_row(question=big), json_row(study_id="s2")]))
    assert [(r.line, r.study_id) for r in rows] == [(2, "s2")]
    assert by_line(problems) == {1: "row longer than 1,048,576 characters"}
    csv_text = f'{HEADER}\np1,s1,2020-01-02,a.png,"{big}",x,,\n{GOOD.replace("s1", "s2")}\n'
    rows, problems = read_manifest(write_file(tmp_path / "m.csv", csv_text))
    assert [(r.line, r.study_id) for r in rows] == [(3, "s2")]
    assert by_line(problems) == {2: "row longer than 1,048,576 characters"}


def test_field_limits_inside_a_row_name_the_field(tmp_path: Path) -> None:
    """A question over 16,384 characters in a row under the row limit is refused by name."""
    rows, problems = read_manifest(write_jsonl(tmp_path / "m.jsonl", [json_row(question="q" * 20_000)]))
    assert rows == [] and problems[0].line == 1 and "question is longer than 16,384" in problems[0].reason


@pytest.mark.parametrize(
    ("patient", "reason"),
    [
        ("*", "wildcard"),
        ("\u0000retired", "control"),
        ("p\nnext", "control"),
        ("x" * 300, "longer than 256"),
    ],
)
def test_bad_ids_are_row_problems(tmp_path: Path, patient: str, reason: str) -> None:
    """Wildcard, control-character, newline and overlong ids are refused naming the row."""
    rows, problems = read_manifest(
        write_jsonl(tmp_path / "m.jsonl", [json_row(), json_row(study_id="s2", patient_id=patient)])
    )
    assert [r.line for r in rows] == [1]
    assert list(by_line(problems)) == [2] and reason in problems[0].reason and "patient_id" in problems[0].reason


def test_csv_id_with_a_quoted_newline_is_refused(tmp_path: Path) -> None:
    """A CSV id holding a newline (quoted) is a problem on the line the row starts on."""
    text = f'{HEADER}\n"p\n1",s1,2020-01-02,a.png,q?,x,,\n'
    rows, problems = read_manifest(write_file(tmp_path / "m.csv", text))
    assert rows == [] and problems[0].line == 2 and "control" in problems[0].reason


def test_images_outside_the_manifest_folder_are_refused(tmp_path: Path) -> None:
    """'..', an absolute path elsewhere and a symlink out of the folder are each a problem."""
    folder = tmp_path / "data"
    folder.mkdir()
    secret = tmp_path / "secret.png"
    secret.write_bytes(b"x")
    (folder / "link.png").symlink_to(secret)
    (folder / "ok.png").write_bytes(b"x")
    (folder / "inner.png").symlink_to(folder / "ok.png")
    items: list[object] = [
        json_row(image="../secret.png"),
        json_row(study_id="s2", image=str(secret)),
        json_row(study_id="s3", image="link.png"),
        json_row(study_id="s4", image="inner.png"),
        json_row(study_id="s5", image="sub/../ok.png"),
    ]
    rows, problems = read_manifest(write_jsonl(folder / "m.jsonl", items))
    assert [r.study_id for r in rows] == ["s4", "s5"]
    assert sorted(by_line(problems)) == [1, 2, 3]
    assert all("outside the folder" in p.reason for p in problems)
    rows, problems = read_manifest(folder / "m.jsonl", root=tmp_path)  # the caller allows a wider root
    assert len(rows) == 5 and problems == []


def test_fifo_image_and_fifo_manifest_do_not_hang(tmp_path: Path) -> None:
    """An image that is a FIFO is a problem; a manifest that is a FIFO is refused at once."""
    os.mkfifo(tmp_path / "pipe.png")
    rows, problems = read_manifest(write_jsonl(tmp_path / "m.jsonl", [json_row(image="pipe.png")]))
    assert rows == [] and "not a regular file" in problems[0].reason
    os.mkfifo(tmp_path / "pipe.jsonl")
    with pytest.raises(ManifestError, match="pipe.jsonl: not a regular file"):
        read_manifest(tmp_path / "pipe.jsonl")


def test_huge_numbers_and_digit_strings_are_problems(tmp_path: Path) -> None:
    """An integer past the float range, or past the digit limit, is a problem, not a crash."""
    lines: list[object] = [
        json_row(timestamp=10**400),
        '{"patient_id": "p1", "timestamp": ' + "9" * 5000 + "}",
        json_row(timestamp="1e999"),
        json_row(timestamp="0001-01-01T00:00:00+01:00"),
    ]
    rows, problems = read_manifest(write_jsonl(tmp_path / "m.jsonl", lines))
    assert rows == [] and sorted(by_line(problems)) == [1, 2, 3, 4]


def _fuzz_read(path: Path) -> None:
    try:
        rows, problems = read_manifest(path)
    except ManifestError:  # the file as a whole (encoding, header)
        return
    for row in rows:
        assert isinstance(row, ManifestRow) and "*" not in row.patient_id and row.question.strip()
    assert all(isinstance(p, RowProblem) and p.line >= 1 for p in problems)


@settings(max_examples=150, deadline=None)
@given(st.lists(jsonl_lines, max_size=6))
def test_fuzzed_jsonl_gives_rows_or_problems_only(lines: list[str]) -> None:
    """Any JSON values, nesting and text lines: rows and problems, never another exception."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "m.jsonl"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogatepass")
        _fuzz_read(path)


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=400), st.sampled_from([".csv", ".jsonl"]))
def test_fuzzed_bytes_give_rows_problems_or_a_manifest_error(data: bytes, suffix: str) -> None:
    """Arbitrary bytes as CSV or JSONL: rows, problems or ManifestError, nothing else."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"m{suffix}"
        path.write_bytes(data)
        _fuzz_read(path)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.text(max_size=12), max_size=10), min_size=1, max_size=5))
def test_fuzzed_csv_records_give_rows_or_problems_only(records: list[list[str]]) -> None:
    """Any CSV fields (quotes, newlines, NULs) under the real header: rows and problems only."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(COLUMNS)
    writer.writerows(records)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "m.csv"
        path.write_text(buf.getvalue(), encoding="utf-8", errors="surrogatepass")
        _fuzz_read(path)

"""The manifest: one row per study, the common input of every data set loader and of ingest.

Columns: ``patient_id, study_id, timestamp, image, question, answer, report, decision`` and the
optional ``view`` (stored as the visual tag). ``timestamp`` is ISO 8601 (a date or a date-time;
naive values are UTC) or a number of UTC seconds. ``image`` is a path, relative to the
manifest's folder unless absolute. ``question`` must be non-empty; ``answer`` is the reference
impression (it may be empty for unlabelled studies); ``report`` and ``decision`` may be empty.

Files are CSV (with a header) or JSONL (one object a line). Reading never stops at a bad row:
each bad row becomes a :class:`RowProblem` with its 1-based line number and reason.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .._errors import ManifestError
from .._records import ManifestRow, RowProblem

__all__ = ["COLUMNS", "ManifestRow", "RowProblem", "parse_timestamp", "read_manifest", "write_manifest"]

COLUMNS = ("patient_id", "study_id", "timestamp", "image", "question", "answer", "report", "decision")
OPTIONAL = ("view",)
REQUIRED = ("patient_id", "study_id", "timestamp", "image", "question")


def parse_timestamp(value: object) -> float:
    """UTC seconds from an ISO 8601 string (naive = UTC) or a number; raises ``ValueError``."""
    if isinstance(value, bool):
        raise ValueError(f"not a timestamp: {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and value.strip():
        text = value.strip()
        try:
            seconds = float(text)
        except ValueError:
            try:
                parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
            except ValueError as exc:
                raise ValueError(f"not an ISO 8601 time or UTC seconds: {text!r}") from exc
            if parsed.tzinfo is None:
                parsed = parsed.replace(tzinfo=UTC)
            seconds = parsed.timestamp()
    else:
        raise ValueError(f"missing or empty timestamp: {value!r}")
    if not math.isfinite(seconds):
        raise ValueError(f"timestamp is not finite: {value!r}")
    try:  # ManifestRow.to_dict must be able to write it back as ISO 8601
        datetime.fromtimestamp(seconds, UTC)
    except (OverflowError, OSError, ValueError) as exc:
        raise ValueError(f"timestamp out of range: {value!r}") from exc
    return seconds


def _validate(raw: dict[str, Any], line: int, base: Path) -> ManifestRow:
    # absent (or null) and empty are told apart; a number such as epoch 0 is a value
    missing = [c for c in REQUIRED if raw.get(c) is None]
    if missing:
        raise ManifestError(f"missing required column(s): {', '.join(missing)}", line)
    empty = [c for c in REQUIRED if isinstance(raw[c], str) and not raw[c].strip()]
    if empty:
        raise ManifestError(f"empty required column(s): {', '.join(empty)}", line)
    unknown = sorted(set(raw) - set(COLUMNS) - set(OPTIONAL))
    if unknown:
        raise ManifestError(f"unknown column(s): {', '.join(unknown)}", line)
    values: dict[str, str] = {}
    for name in COLUMNS + OPTIONAL:
        value = raw.get(name, "")
        if value is None:
            value = ""
        if name == "timestamp":
            continue
        if not isinstance(value, (str, int)) or isinstance(value, bool):
            raise ManifestError(f"column {name} must be text, got {type(value).__name__}", line)
        values[name] = str(value).strip() if name in ("patient_id", "study_id", "image", "view") else str(value)
    if not values["question"].strip():
        raise ManifestError("question must not be empty", line)
    try:
        ts = parse_timestamp(raw["timestamp"])
    except ValueError as exc:
        raise ManifestError(str(exc), line) from exc
    image = Path(values["image"])
    if not image.is_absolute():
        image = base / image
    return ManifestRow(
        patient_id=values["patient_id"],
        study_id=values["study_id"],
        timestamp=ts,
        image=str(image),
        question=values["question"],
        answer=values["answer"],
        report=values["report"],
        decision=values["decision"],
        view=values["view"],
        line=line,
    )


def _raw_rows(path: Path) -> Iterator[tuple[int, dict[str, Any] | ManifestError]]:
    suffix = path.suffix.lower()
    with path.open(encoding="utf-8-sig", newline="") as fh:  # -sig: drop a leading BOM
        if suffix == ".jsonl":
            for number, text in enumerate(fh, start=1):
                if not text.strip():
                    continue
                try:
                    obj = json.loads(text)
                except json.JSONDecodeError as exc:
                    yield number, ManifestError(f"invalid JSON: {exc.msg}", number)
                    continue
                if not isinstance(obj, dict):
                    yield number, ManifestError("a JSONL row must be an object", number)
                    continue
                yield number, obj
        elif suffix == ".csv":
            yield from _csv_rows(fh, path)
        else:
            raise ManifestError(f"{path}: manifest must be .csv or .jsonl, got {suffix or 'no suffix'!r}")


def _csv_rows(fh: Iterator[str], path: Path) -> Iterator[tuple[int, dict[str, Any] | ManifestError]]:
    # A row is numbered by the line it starts on (a quoted field may span lines), and a
    # malformed row is reported without ending the file: the reader resumes at the next line.
    reader = csv.reader(fh, strict=True)
    header: list[str] | None = None
    end = 0  # the last physical line the reader has consumed
    while True:
        start = end + 1
        try:
            record = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            end = reader.line_num
            if header is None:
                raise ManifestError(f"{path}: malformed CSV header: {exc}", start) from exc
            yield start, ManifestError(f"malformed CSV: {exc}", start)
            continue
        end = reader.line_num
        if not record:  # a blank line
            continue
        if header is None:
            header = record
        elif len(record) > len(header):
            yield start, ManifestError("more fields than the header has", start)
        else:
            values: list[str | None] = [*record, *([None] * (len(header) - len(record)))]
            yield start, dict(zip(header, values, strict=True))


def read_manifest(path: str | Path) -> tuple[list[ManifestRow], list[RowProblem]]:
    """Read and validate a manifest; return the good rows and the problems of the bad ones.

    Raises :class:`ManifestError` only when the file itself cannot be read (missing, wrong
    suffix, not UTF-8). Duplicate ``(patient_id, study_id)`` pairs are reported as problems.
    """
    path = Path(path)
    if not path.is_file():
        raise ManifestError(f"{path}: no such manifest file")
    rows: list[ManifestRow] = []
    problems: list[RowProblem] = []
    seen: dict[tuple[str, str], int] = {}
    try:
        for number, raw in _raw_rows(path):
            if isinstance(raw, ManifestError):
                problems.append(RowProblem(number, raw.reason))
                continue
            try:
                row = _validate(raw, number, path.parent)
            except ManifestError as exc:
                problems.append(RowProblem(number, exc.reason))
                continue
            key = (row.patient_id, row.study_id)
            if key in seen:
                problems.append(
                    RowProblem(
                        number,
                        f"duplicate study {row.study_id!r} of patient {row.patient_id!r} (first on line {seen[key]})",
                    )
                )
                continue
            seen[key] = number
            rows.append(row)
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{path}: not UTF-8 text ({exc.reason})") from exc
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read the manifest ({exc.strerror or exc})") from exc
    return rows, problems


def write_manifest(rows: list[ManifestRow], path: str | Path) -> None:
    """Write rows as JSONL (``.jsonl``) or CSV (``.csv``) with absolute image paths."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".jsonl"):  # checked first: a refused name leaves no empty file
        raise ManifestError(f"{path}: manifest must be .csv or .jsonl")
    dicts = [r.to_dict() for r in rows]
    with path.open("w", encoding="utf-8", newline="") as fh:
        if suffix == ".jsonl":
            for d in dicts:
                fh.write(json.dumps(d, ensure_ascii=False) + "\n")
        else:
            writer = csv.DictWriter(fh, fieldnames=list(COLUMNS + OPTIONAL))
            writer.writeheader()
            writer.writerows(dicts)

"""The manifest: one row per question about a study, the common input of every data set
loader, of ingest and of ``msm-mem eval --dataset manifest FILE``.

Columns: ``patient_id, study_id, timestamp, image, question, answer, report, decision`` and the
optional ``view`` (stored as the visual tag) and ``question_type`` (``label``, ``yes_no`` or
``text``; absent or empty means ``text``). ``timestamp`` is ISO 8601 (a date or a date-time;
naive values are UTC) or a number of UTC seconds. ``image`` is a path, relative to the
manifest's folder unless absolute; the rows read carry it absolute, so a store that ingests
them finds the image from any working directory. ``question`` must be non-empty; ``answer`` is the reference
(it may be empty for unlabelled studies); ``report`` and ``decision`` may be empty.

A study may carry several questions: rows sharing ``patient_id`` and ``study_id`` with
different questions. ``(patient_id, study_id, question)`` is unique, and the rows of one study
must name the same image and time (a later row that differs is a problem).

Files are CSV (with a header) or JSONL (one object a line). Reading never stops at a bad row:
each bad row becomes a :class:`RowProblem` with its 1-based line number and reason. A JSONL row
that repeats a key is such a problem; a CSV header that repeats a column is a
:class:`ManifestError` for the file (every row would be filed under the last of the two).
Text is read as Unicode NFC.

Rows are bounded before they are parsed (:mod:`msm_mem._limits`): a row (a JSONL line or a CSV
record) of more than ``MAX_ROW_CHARS`` characters is skipped without being held whole, a JSONL
row nested deeper than ``MAX_JSON_DEPTH`` is refused before it is parsed, and every field is
checked like any :class:`ManifestRow` (ids without ``*`` or control characters, bounded text).
An image must resolve (symlinks and ``..`` followed) inside the manifest's folder, or inside
one of the ``root`` folders the caller allows instead (a hospital export whose images lie
elsewhere: ``msm-mem ingest --image-root DIR``); an existing image that is not a regular file
is refused.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import stat
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from .._errors import InvalidInput, ManifestError
from .._files import inside
from .._limits import MAX_JSON_DEPTH, MAX_ROW_CHARS, nfc
from .._records import QUESTION_TYPES, ManifestRow, RowProblem

__all__ = [
    "COLUMNS",
    "QUESTION_TYPES",
    "ManifestRow",
    "RowProblem",
    "parse_timestamp",
    "read_manifest",
    "untyped_lines",
    "write_manifest",
]

COLUMNS = ("patient_id", "study_id", "timestamp", "image", "question", "answer", "report", "decision")
OPTIONAL = ("view", "question_type")
REQUIRED = ("patient_id", "study_id", "timestamp", "image", "question")


def _show(value: object, limit: int = 80) -> str:
    """A value for an error message, cut to ``limit`` characters (rows can be large)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_timestamp(value: object) -> float:
    """UTC seconds from an ISO 8601 string (naive = UTC) or a number; raises ``ValueError``."""
    if isinstance(value, bool):
        raise ValueError(f"not a timestamp: {_show(value)}")
    if isinstance(value, (int, float)):
        try:
            seconds = float(value)
        except OverflowError:  # an integer past the float range
            raise ValueError(f"timestamp out of range: {_show(value)}") from None
    elif isinstance(value, str) and value.strip():
        text = value.strip()
        try:
            seconds = float(text)
        except ValueError:
            try:
                parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
            except ValueError as exc:
                raise ValueError(f"not an ISO 8601 time or UTC seconds: {_show(text)}") from exc
            if parsed.tzinfo is None:
                parsed = parsed.replace(tzinfo=UTC)
            try:
                seconds = parsed.timestamp()
            except (OverflowError, OSError, ValueError) as exc:
                raise ValueError(f"timestamp out of range: {_show(text)}") from exc
    else:
        raise ValueError(f"missing or empty timestamp: {_show(value)}")
    if not math.isfinite(seconds):
        raise ValueError(f"timestamp is not finite: {_show(value)}")
    try:  # ManifestRow.to_dict must be able to write it back as ISO 8601
        datetime.fromtimestamp(seconds, UTC)
    except (OverflowError, OSError, ValueError) as exc:
        raise ValueError(f"timestamp out of range: {_show(value)}") from exc
    return seconds


def _validate(raw: dict[str, Any], line: int, base: Path, roots: Sequence[Path]) -> ManifestRow:
    # absent (or null) and empty are told apart; a number such as epoch 0 is a value
    missing = [c for c in REQUIRED if raw.get(c) is None]
    if missing:
        raise ManifestError(f"missing required column(s): {', '.join(missing)}", line)
    empty = [c for c in REQUIRED if isinstance(raw[c], str) and not raw[c].strip()]
    if empty:
        raise ManifestError(f"empty required column(s): {', '.join(empty)}", line)
    unknown = sorted(set(raw) - set(COLUMNS) - set(OPTIONAL))
    if unknown:
        raise ManifestError(f"unknown column(s): {', '.join(repr(u)[1:-1][:40] for u in unknown[:5])}", line)
    values: dict[str, str] = {}
    for name in COLUMNS + OPTIONAL:
        value = raw.get(name, "")
        if value is None:
            value = ""
        if name == "timestamp":
            continue
        if not isinstance(value, (str, int)) or isinstance(value, bool):
            raise ManifestError(f"column {name} must be text, got {type(value).__name__}", line)
        stripped = name in ("patient_id", "study_id", "image", "view", "question_type")
        text = str(value).strip() if stripped else str(value)
        # text from the file in NFC (ids too: the library refuses an id in another form); the
        # image path names a file by its bytes and is kept as written
        values[name] = text if name == "image" else nfc(text)
    if not values["question"].strip():
        raise ManifestError("question must not be empty", line)
    kind = values["question_type"] or "text"
    if kind not in QUESTION_TYPES:
        raise ManifestError(f"question_type must be one of {', '.join(QUESTION_TYPES)}, got {_show(kind, 40)}", line)
    try:
        ts = parse_timestamp(raw["timestamp"])
    except ValueError as exc:
        raise ManifestError(str(exc), line) from exc
    image = Path(values["image"])
    if not image.is_absolute():
        image = base / image
    try:
        row = ManifestRow(
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
            question_type=kind,
        )
    except InvalidInput as exc:  # the row's own checks: ids, sizes, the image path as text
        raise ManifestError(str(exc), line) from None
    _check_image(image, roots, line)
    return row


def _check_image(image: Path, roots: Sequence[Path], line: int) -> None:
    """The image must resolve inside one of ``roots``; if it exists it must be a regular file
    (a missing one is reported when it is read)."""
    if not any(inside(image, root) for root in roots):
        where = f"the folder {roots[0]}" if len(roots) == 1 else f"the folders {', '.join(map(str, roots))}"
        raise ManifestError(
            f"image {str(image)[:200]!r} is outside {where} (after resolving links and '..'); allow the folder "
            "that holds the images with --image-root DIR (read_manifest(..., root=...))",
            line,
        )
    try:
        mode = image.stat().st_mode
    except (OSError, ValueError):
        return
    if not stat.S_ISREG(mode):
        raise ManifestError(f"image {str(image)[:200]!r} is not a regular file", line)


class _RowTooLong(Exception):
    """A row past MAX_ROW_CHARS: its rest of line was skipped."""


class _Lines:
    """Physical lines of a text file, each read with a bound, counting what one row consumed.

    Iterating yields lines (ends kept) and raises :class:`_RowTooLong` once the current row
    (since :meth:`new_row`) passes ``limit`` characters, after skipping the rest of that line;
    iteration can go on afterwards. ``number`` is the last physical line consumed.
    """

    def __init__(self, fh: IO[str], limit: int = MAX_ROW_CHARS) -> None:
        self.fh, self.limit, self.number, self.used = fh, limit, 0, 0

    def new_row(self) -> None:
        self.used = 0

    def __iter__(self) -> _Lines:
        return self

    def __next__(self) -> str:
        text = self.fh.readline(self.limit - self.used + 1)
        if not text:
            raise StopIteration
        self.number += 1
        self.used += len(text)
        if self.used > self.limit:
            while text and not text.endswith(("\n", "\r")):  # skip the rest of this line, in bounded pieces
                text = self.fh.readline(1 << 16)
            raise _RowTooLong
        return text


_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_JSON_BRACKET = re.compile(r"[\[\]{}]")


def _json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in ``text`` (strings skipped)."""
    depth = deepest = 0
    for match in _JSON_BRACKET.finditer(_JSON_STRING.sub("", text)):
        depth += 1 if match.group() in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's members as a dict; :class:`_DuplicateKey` when a key repeats (``json``
    would keep the last value and drop the first without a word)."""
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _DuplicateKey(key)
        obj[key] = value
    return obj


def _jsonl_rows(fh: IO[str]) -> Iterator[tuple[int, dict[str, Any] | ManifestError]]:
    lines = _Lines(fh)
    while True:
        lines.new_row()
        try:
            text = next(lines)
        except StopIteration:
            return
        except _RowTooLong:
            yield lines.number, ManifestError(f"row longer than {MAX_ROW_CHARS:,} characters", lines.number)
            continue
        number = lines.number
        if not text.strip():
            continue
        if _json_depth(text) > MAX_JSON_DEPTH:
            yield number, ManifestError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels", number)
            continue
        try:
            obj = json.loads(text, object_pairs_hook=_unique_keys)
        except _DuplicateKey as exc:
            yield number, ManifestError(f"duplicate JSON key {_show(exc.key, 40)} in the row", number)
            continue
        except json.JSONDecodeError as exc:
            yield number, ManifestError(f"invalid JSON: {exc.msg}", number)
            continue
        except ValueError as exc:  # a number past the integer digit limit
            yield number, ManifestError(f"invalid JSON: {exc}", number)
            continue
        if not isinstance(obj, dict):
            yield number, ManifestError("a JSONL row must be an object", number)
            continue
        yield number, obj


def untyped_lines(path: str | Path) -> list[int]:
    """The line numbers of the rows of the manifest at ``path`` that name no ``question_type``
    (they are read as free text): every row when the column is absent. Rows that cannot be
    read are left to :func:`read_manifest` to report."""
    out = []
    for number, raw in _raw_rows(Path(path)):
        if isinstance(raw, dict) and not str(raw.get("question_type") or "").strip():
            out.append(number)
    return out


def _raw_rows(path: Path) -> Iterator[tuple[int, dict[str, Any] | ManifestError]]:
    suffix = path.suffix.lower()
    if suffix not in (".jsonl", ".csv"):
        raise ManifestError(f"{path}: manifest must be .csv or .jsonl, got {suffix or 'no suffix'!r}")
    with _open_manifest(path) as fh:
        if suffix == ".jsonl":
            yield from _jsonl_rows(fh)
        else:
            yield from _csv_rows(fh, path)


def _open_manifest(path: Path) -> IO[str]:
    # a FIFO or device named as the manifest must not block the open: only regular files
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ManifestError(f"{path}: not a regular file")
        return open(fd, encoding="utf-8-sig", newline="")  # -sig: drop a leading BOM
    except BaseException:
        os.close(fd)
        raise


def _csv_rows(fh: IO[str], path: Path) -> Iterator[tuple[int, dict[str, Any] | ManifestError]]:
    # A row is numbered by the line it starts on (a quoted field may span lines), and a
    # malformed or overlong row is reported without ending the file: the reader resumes at the
    # next line.
    lines = _Lines(fh)
    reader = csv.reader(lines, strict=True)
    header: list[str] | None = None
    while True:
        start = lines.number + 1
        lines.new_row()
        try:
            record = next(reader)
        except StopIteration:
            return
        except (csv.Error, _RowTooLong) as exc:
            problem = f"row longer than {MAX_ROW_CHARS:,} characters" if isinstance(exc, _RowTooLong) else str(exc)
            if header is None:
                raise ManifestError(f"{path}: malformed CSV header: {problem}", start) from None
            yield start, ManifestError(problem if isinstance(exc, _RowTooLong) else f"malformed CSV: {problem}", start)
            continue
        if not record:  # a blank line
            continue
        if header is None:
            twice = sorted({c for c in record if record.count(c) > 1})
            if twice:  # a row would be filed under the last of the two values, silently
                raise ManifestError(
                    f"{path}: duplicate CSV column(s) in the header: {', '.join(_show(c, 40) for c in twice[:5])}",
                    start,
                )
            header = record
        elif len(record) > len(header):
            yield start, ManifestError("more fields than the header has", start)
        else:
            values: list[str | None] = [*record, *([None] * (len(header) - len(record)))]
            yield start, dict(zip(header, values, strict=True))


def _clash(
    row: ManifestRow, seen: dict[tuple[str, str, str], int], studies: dict[tuple[str, str], ManifestRow]
) -> str | None:
    """Why ``row`` cannot join the rows read so far (a repeated question, or a study whose
    earlier row names another image or time), else ``None``."""
    key = (row.patient_id, row.study_id, row.question)
    if key in seen:
        return (
            f"duplicate question {_show(row.question, 60)} for study {row.study_id!r} of patient "
            f"{row.patient_id!r} (first on line {seen[key]})"
        )
    first = studies.get((row.patient_id, row.study_id))
    if first is not None and (first.image != row.image or first.timestamp != row.timestamp):
        what = "image" if first.image != row.image else "timestamp"
        return f"study {row.study_id!r} of patient {row.patient_id!r} has another {what} on line {first.line}"
    return None


def _roots(root: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None, path: Path) -> list[Path]:
    """The folders images may lie in, resolved: ``root`` (one folder or several), else the
    manifest's folder. A root that is not an existing folder is ManifestError naming it."""
    if root is None:
        return [Path(os.path.realpath(path.parent))]
    given = [root] if isinstance(root, (str, os.PathLike)) else list(root)
    if not given:
        raise ManifestError("root names no folder: give at least one, or None for the manifest's folder")
    roots = []
    for folder in given:
        if not isinstance(folder, (str, os.PathLike)) or not os.fspath(folder):
            raise ManifestError(f"image root must be a folder path, got {_show(folder)}")
        if not Path(folder).is_dir():
            what = "is not a folder" if Path(folder).exists() else "does not exist"
            raise ManifestError(f"image root {os.fspath(folder)} {what}")
        roots.append(Path(os.path.realpath(folder)))
    return roots


def read_manifest(
    path: str | Path, *, root: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None
) -> tuple[list[ManifestRow], list[RowProblem]]:
    """Read and validate a manifest; return the good rows and the problems of the bad ones.

    Images must lie inside ``root`` (one folder or a sequence of them; default: the manifest's
    folder) once links and ``..`` are resolved; a relative image path is relative to the
    manifest's folder, and every row's ``image`` is absolute. Raises :class:`ManifestError`
    only when the file itself cannot be read (missing, not a regular file, wrong suffix, not
    UTF-8) or a root is not an existing folder. Duplicate ``(patient_id, study_id)`` pairs are
    reported as problems.
    """
    path = Path(path)
    if not path.is_file():
        what = "not a regular file" if path.exists() else "no such manifest file"
        raise ManifestError(f"{path}: {what}")
    allowed = _roots(root, path)
    base = Path(os.path.abspath(path.parent))
    rows: list[ManifestRow] = []
    problems: list[RowProblem] = []
    seen: dict[tuple[str, str, str], int] = {}
    studies: dict[tuple[str, str], ManifestRow] = {}
    try:
        for number, raw in _raw_rows(path):
            if isinstance(raw, ManifestError):
                problems.append(RowProblem(number, raw.reason))
                continue
            try:
                row = _validate(raw, number, base, allowed)
            except ManifestError as exc:
                problems.append(RowProblem(number, exc.reason))
                continue
            if (reason := _clash(row, seen, studies)) is not None:
                problems.append(RowProblem(number, reason))
                continue
            seen[(row.patient_id, row.study_id, row.question)] = number
            studies.setdefault((row.patient_id, row.study_id), row)
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

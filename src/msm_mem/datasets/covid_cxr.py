"""Loader for the real longitudinal ``covid-cxr`` set (a snapshot of the COVID-19 image data
collection, Cohen et al.), read in place from its folder (``metadata.csv`` + ``images/``).

What one CSV row (one image, one study) becomes: up to six manifest rows, one per question the
row answers, sharing ``patient_id`` = ``"covid-" + patientid``, ``study_id`` = the image file
stem (``0001``), the image, the time, ``report``, ``decision`` and ``view``:

- the finding (``question_type`` ``label``): :data:`QUESTION`, answered by the ``finding``
  label with whitespace collapsed and comma-separated parts joined by ``", "``
  (``"COVID-19, ARDS"``). ``todo`` or an empty finding means unlabelled: no finding row, unless
  ``keep_unlabelled=True``, which keeps it with an empty ``answer``.
- yes/no questions (``yes_no``), one per outcome column recorded as ``Y`` (``yes``) or ``N``
  (``no``): :data:`YES_NO_QUESTIONS` (``intubated``, ``went_icu``,
  ``needed_supplemental_O2``, ``survival``). Anything else (empty, ``?``, ``Not visible``...)
  is unknown and gives no row: never guessed.
- a free-text question (``text``): :data:`NOTES_QUESTION`, answered by ``clinical_notes``
  (whitespace collapsed) when it is not empty.

A CSV row none of whose questions has an answer is a problem (``no question answered``).
- ``decision`` = the outcome columns joined by ``"; "`` in this order: ``went_icu`` (Y ``icu``,
  N ``no icu``), ``intubated`` (``intubated`` / ``not intubated``), ``needed_supplemental_O2``
  (``supplemental O2`` / ``no supplemental O2``), ``survival`` (``survived`` / ``died``). Other
  values (empty, ``?``, ``Not visible``...) are left out; all unknown gives ``""``.
- ``report`` = ``clinical_notes`` (a case narrative, not a radiology report); ``view`` = the
  ``view`` column (``PA``, ``AP``, ``AP Supine``, ``L``; ``?`` becomes empty).
- ``timestamp`` (UTC midnight): the ``date`` column is messy (``2020``, ``March 2020``,
  ``January 25, 2020``, empty, ``?``) and ``offset`` counts days since symptom onset or
  admission. Each patient gets one *anchor* (an estimated day 0): among the patient's rows with
  a parseable date (a year counts as 1 January, a month as its 1st), take the most precise
  one (day > month > year; ties: the first in the file) and subtract its offset. Without any
  parseable date the anchor is 2000-01-01. A study's time is ``anchor + offset`` days, so a
  patient's studies are ordered by offset (then by study id). An empty offset takes the offset
  of the patient's previous row in file order (the collection lists a patient's images in time
  order), or 0 on the patient's first row; the source does not say where such images belong,
  so this is a documented guess. Every row with a valid offset, skipped or not, takes part in
  carrying offsets forward and in choosing the anchor.

Skipped CSV rows become :class:`RowProblem` with their CSV line number (the line where the row
starts): empty ``patientid``, an offset that is not a whole number of days, an empty or
escaping image path (``..``, absolute, or a link out of the folder), a missing, non-regular,
oversized or undecodable image file, a duplicate image, an id or text that fails the
:class:`ManifestRow` checks, or no question answered. Unparseable dates are not problems;
they are ignored.

Attribution: the ``doi``, ``url`` and ``license`` columns are kept out of the manifest, but
anything derived from these images must keep them: :func:`attribution` returns them per study.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path, PurePosixPath
from stat import S_ISREG

from PIL import Image, UnidentifiedImageError

from .._errors import InvalidInput
from .._files import inside
from .._limits import MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS
from .manifest import ManifestRow, RowProblem

__all__ = ["NOTES_QUESTION", "QUESTION", "YES_NO_QUESTIONS", "attribution", "load", "parse_date"]

QUESTION = "What is the diagnosis for this chest X-ray?"
#: outcome column -> its yes/no question (answered ``yes`` for ``Y``, ``no`` for ``N``)
YES_NO_QUESTIONS: dict[str, str] = {
    "intubated": "Was the patient intubated?",
    "went_icu": "Did the patient go to the intensive care unit?",
    "needed_supplemental_O2": "Did the patient need supplemental oxygen?",
    "survival": "Did the patient survive?",
}
NOTES_QUESTION = "What do the clinical notes say about this case?"
_REQUIRED = ("patientid", "offset", "finding", "view", "date", "clinical_notes", "image")
_DEFAULT_ANCHOR = date(2000, 1, 1)
_MONTHS = {
    name: number
    for number, full in enumerate(
        (
            "january",
            "february",
            "march",
            "april",
            "may",
            "june",
            "july",
            "august",
            "september",
            "october",
            "november",
            "december",
        ),
        start=1,
    )
    for name in (full, full[:3], "sept" if full == "september" else full[:3])
}
_OUTCOMES = (
    ("went_icu", "icu", "no icu"),
    ("intubated", "intubated", "not intubated"),
    ("needed_supplemental_O2", "supplemental O2", "no supplemental O2"),
    ("survival", "survived", "died"),
)


@dataclass(frozen=True, slots=True)
class _Parsed:
    line: int
    raw: dict[str, str]
    offset: int | None  # None: empty offset
    reasons: tuple[str, ...]


def _metadata(path: str | Path) -> Path:
    path = Path(path)
    csv_path = path / "metadata.csv" if path.is_dir() else path
    if not csv_path.is_file():
        raise InvalidInput(f"{csv_path}: no covid-cxr metadata.csv here")
    return csv_path


def _read(csv_path: Path) -> list[tuple[int, dict[str, str]]]:
    """(start line, row) pairs; raises InvalidInput when the file or its header is unusable."""
    out: list[tuple[int, dict[str, str]]] = []
    try:
        with csv_path.open(encoding="utf-8", newline="") as fh:
            reader = csv.DictReader(fh)
            missing = [c for c in _REQUIRED if c not in (reader.fieldnames or [])]
            if missing:
                raise InvalidInput(f"{csv_path}: missing column(s): {', '.join(missing)}")
            start = reader.line_num + 1
            for row in reader:
                out.append((start, {k: (v or "") for k, v in row.items() if isinstance(k, str)}))
                start = reader.line_num + 1
    except (UnicodeDecodeError, csv.Error) as exc:
        raise InvalidInput(f"{csv_path}: unreadable CSV ({exc})") from exc
    return out


def parse_date(text: str) -> tuple[date, int] | None:
    """``(date, precision)`` with precision 3 = day, 2 = month, 1 = year; ``None`` if unknown.

    Accepted: ``2020``, ``March 2020``, ``January 25, 2020``, ``Jan 25 2020``, ``2020-01-25``.
    """
    text = " ".join(text.replace(",", " ").split()).lower()
    try:
        if m := re.fullmatch(r"(\d{4})", text):
            return date(int(m[1]), 1, 1), 1
        if m := re.fullmatch(r"([a-z]+)\.? (\d{4})", text):
            return date(int(m[2]), _MONTHS[m[1]], 1), 2
        if m := re.fullmatch(r"([a-z]+)\.? (\d{1,2}) (\d{4})", text):
            return date(int(m[3]), _MONTHS[m[1]], int(m[2])), 3
        if m := re.fullmatch(r"(\d{4})-(\d{2})-(\d{2})", text):
            return date(int(m[1]), int(m[2]), int(m[3])), 3
    except (KeyError, ValueError):
        return None
    return None


def _offset(text: str) -> int | None:
    """Days as an int, ``None`` for empty; raises ValueError for anything else."""
    text = text.strip()
    if not text:
        return None
    if not re.fullmatch(r"[+-]?\d{1,5}", text):
        raise ValueError(f"offset {text!r} is not a whole number of days")
    return int(text)


def _image_reasons(folder: Path, rel: str, check_images: bool) -> list[str]:
    if not rel:
        return ["empty image path"]
    pure = PurePosixPath(rel)
    if pure.is_absolute() or ".." in pure.parts or "\\" in rel:
        return [f"image path {rel!r} leaves the data set folder"]
    file = folder / pure
    if not inside(file, folder):  # a symlink out of the folder
        return [f"image path {rel!r} leaves the data set folder (through a link)"]
    if not file.exists():
        return [f"image file missing: {rel}"]
    try:
        st = file.stat()
    except OSError as exc:
        return [f"unreadable image {rel}: {exc.strerror or exc}"]
    if not S_ISREG(st.st_mode):
        return [f"image {rel} is not a regular file"]
    if st.st_size > MAX_IMAGE_BYTES:
        return [f"image {rel} is larger than {MAX_IMAGE_BYTES:,} bytes"]
    if check_images:
        try:
            with Image.open(file) as im:
                width, height = im.size  # the header's claim: checked before anything is decoded
                if width * height > MAX_IMAGE_PIXELS:
                    return [f"image {rel} too large: {width}x{height} exceeds {MAX_IMAGE_PIXELS:,} pixels"]
                im.verify()
        except (OSError, UnidentifiedImageError, SyntaxError, ValueError) as exc:
            return [f"unreadable image {rel}: {exc}"]
        except Exception as exc:  # a decompression bomb, or another decoder failure
            return [f"unreadable image {rel}: {exc}"]
    return []


def _label(finding: str) -> str:
    parts = [" ".join(p.split()) for p in finding.split(",")]
    return ", ".join(p for p in parts if p)


def _decision(raw: dict[str, str]) -> str:
    words: list[str] = []
    for column, yes, no in _OUTCOMES:
        value = raw.get(column, "").strip().upper()
        if value == "Y":
            words.append(yes)
        elif value == "N":
            words.append(no)
    return "; ".join(words)


def _parse(line: int, raw: dict[str, str], folder: Path, check_images: bool, keep_unlabelled: bool) -> _Parsed:
    reasons: list[str] = []
    if not raw.get("patientid", "").strip():
        reasons.append("empty patientid")
    offset: int | None = None
    try:
        offset = _offset(raw.get("offset", ""))
    except ValueError as exc:
        reasons.append(str(exc))
    reasons += _image_reasons(folder, raw.get("image", "").strip(), check_images)
    if not reasons and not _questions(raw, keep_unlabelled):
        finding = _label(raw.get("finding", ""))
        reasons.append(f"no question answered (unlabelled finding {finding!r}, no outcome, no clinical notes)")
    return _Parsed(line, raw, offset, tuple(reasons))


def _questions(raw: dict[str, str], keep_unlabelled: bool) -> list[tuple[str, str, str]]:
    """``(question_type, question, answer)`` of every question the CSV row answers."""
    out: list[tuple[str, str, str]] = []
    label = _label(raw.get("finding", ""))
    if label.lower() not in ("", "todo"):
        out.append(("label", QUESTION, label))
    elif keep_unlabelled:
        out.append(("label", QUESTION, ""))
    for column, question in YES_NO_QUESTIONS.items():
        value = raw.get(column, "").strip().upper()
        if value in ("Y", "N"):
            out.append(("yes_no", question, "yes" if value == "Y" else "no"))
    notes = " ".join(raw.get("clinical_notes", "").split())
    if notes:
        out.append(("text", NOTES_QUESTION, notes))
    return out


def _days(parsed: list[_Parsed]) -> dict[int, int]:
    """Line -> offset in days, empty offsets carried forward per patient (0 at first)."""
    last: dict[str, int] = {}
    days: dict[int, int] = {}
    for p in parsed:
        pid = p.raw.get("patientid", "").strip()
        if not pid or any(r.startswith("offset ") for r in p.reasons):
            continue
        days[p.line] = last[pid] = p.offset if p.offset is not None else last.get(pid, 0)
    return days


def _anchors(parsed: list[_Parsed], days: dict[int, int]) -> dict[str, date]:
    """Per patientid: the estimated day 0 (see the module docstring)."""
    best: dict[str, tuple[int, int, date]] = {}
    for p in parsed:
        pid = p.raw.get("patientid", "").strip()
        found = parse_date(p.raw.get("date", ""))
        if p.line not in days or found is None:
            continue
        day, precision = found
        try:
            onset = day - timedelta(days=days[p.line])
        except OverflowError:
            continue
        key = (-precision, p.line, onset)
        if pid not in best or key < best[pid]:
            best[pid] = key
    return {pid: key[2] for pid, key in best.items()}


def load(
    path: str | Path, *, keep_unlabelled: bool = False, check_images: bool = True
) -> tuple[list[ManifestRow], list[RowProblem]]:
    """Rows from the covid-cxr folder (or its ``metadata.csv``) at ``path``, read in place.

    Rows are sorted by patient, time, study, then question; image paths are absolute. Every CSV
    row ends up either as rows (one per question it answers) or as a problem (with its line),
    never both and never neither.
    ``check_images`` also decodes each image header (Pillow ``verify``), not just its presence.
    Raises :class:`InvalidInput` when the file is missing, not UTF-8 CSV, or lacks columns.
    """
    csv_path = _metadata(path)
    folder = csv_path.parent.resolve()
    parsed = [_parse(line, raw, folder, check_images, keep_unlabelled) for line, raw in _read(csv_path)]
    days = _days(parsed)
    anchors = _anchors(parsed, days)
    rows: list[ManifestRow] = []
    problems: list[RowProblem] = []
    seen: dict[str, int] = {}
    for p in parsed:
        if p.reasons:
            problems.append(RowProblem(p.line, "; ".join(p.reasons)))
            continue
        raw = p.raw
        rel = PurePosixPath(raw["image"].strip())
        study_id = rel.stem
        if study_id in seen:
            problems.append(RowProblem(p.line, f"duplicate image {study_id!r} (line {seen[study_id]})"))
            continue
        pid = raw["patientid"].strip()
        day = anchors.get(pid, _DEFAULT_ANCHOR)
        when = datetime(day.year, day.month, day.day, tzinfo=UTC) + timedelta(days=days[p.line])
        view = raw.get("view", "").strip()
        try:
            made = [
                ManifestRow(
                    patient_id=f"covid-{pid}",
                    study_id=study_id,
                    timestamp=when.timestamp(),
                    image=str(folder / rel),
                    question=question,
                    answer=answer,
                    report=raw.get("clinical_notes", "").strip(),
                    decision=_decision(raw),
                    view="" if view == "?" else view,
                    line=p.line,
                    question_type=kind,
                )
                for kind, question, answer in _questions(raw, keep_unlabelled)
            ]
        except InvalidInput as exc:  # an id with a wildcard or control character, oversized text
            problems.append(RowProblem(p.line, str(exc)))
            continue
        seen[study_id] = p.line
        rows += made
    rows.sort(key=lambda r: (r.patient_id, r.timestamp, r.study_id, r.question))
    problems.sort(key=lambda q: q.line)
    return rows, problems


def attribution(path: str | Path) -> list[dict[str, str]]:
    """Per CSV row (skipped or not): ``study_id``, ``patient_id``, ``doi``, ``url``,
    ``license`` and ``source_filename``, sorted by ``study_id``. Keep these with derived data.
    """
    out: list[dict[str, str]] = []
    for _, raw in _read(_metadata(path)):
        out.append(
            {
                "study_id": PurePosixPath(raw.get("image", "").strip()).stem,
                "patient_id": f"covid-{raw.get('patientid', '').strip()}",
                "doi": raw.get("doi", "").strip(),
                "url": raw.get("url", "").strip(),
                "license": raw.get("license", "").strip(),
                "source_filename": raw.get("source_filename", "").strip(),
            }
        )
    return sorted(out, key=lambda d: d["study_id"])

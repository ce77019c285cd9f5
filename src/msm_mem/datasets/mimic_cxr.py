"""Loader for MIMIC-CXR-JPG in its official layout (credentialed data; nothing is downloaded).

Expected under ``root``::

    mimic-cxr-2.0.0-metadata.csv[.gz]   dicom_id, subject_id, study_id, ViewPosition,
                                        StudyDate (YYYYMMDD), StudyTime (HHMMSS[.fff]), ...
    mimic-cxr-2.0.0-split.csv[.gz]      dicom_id, study_id, subject_id, split
    files/p10/p10000032/s50414267/<dicom_id>.jpg
    files/p10/p10000032/s50414267.txt   (the free-text reports, from the reports zip;
                                         ``reports_dir`` if they live elsewhere)

One row per study: ``patient_id`` = ``"mimic-" + subject_id``, ``study_id`` = the study number.
The image is chosen deterministically among the study's images whose JPEG exists: PA first,
then AP, then any other view, then no view; ties by ``dicom_id``. ``view`` = its
``ViewPosition``. ``timestamp`` = that image's StudyDate + StudyTime in UTC (the data set's
dates are shifted, often into the 22nd century); an empty StudyTime means midnight; StudyTime
is a number in the source, so ``80556.875`` is read as 08:05:56.875.

Report sections are found by upper-case headers at a line start (``FINDINGS:``,
``IMPRESSION:``; also ``IMPRESSIONS``, ``CONCLUSION``, ``FINDINGS AND IMPRESSION``...).
``answer`` = the impression; without one, the findings; without either, the report's last
paragraph. ``report`` = the whole report with lines stripped; ``decision`` is empty.
``question`` = :data:`QUESTION`.

``split`` (``train``, ``validate`` or ``test``) keeps only images of that split; studies
outside it are left out on purpose (neither rows nor problems), while an image that the
split file does not list is a problem. Every other skipped study is a :class:`RowProblem`
with the metadata line of its first image: bad ids, missing report, no report text, no image
file, unparseable date or time.
"""

from __future__ import annotations

import csv
import gzip
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO

from .._errors import InvalidInput
from .._files import inside, read_regular
from .._limits import MAX_TEXT_CHARS
from .manifest import ManifestRow, RowProblem

__all__ = ["QUESTION", "SPLITS", "load", "sections"]

QUESTION = "What is the impression of this chest radiograph?"
SPLITS = ("train", "validate", "test")
METADATA = "mimic-cxr-2.0.0-metadata.csv"
SPLIT = "mimic-cxr-2.0.0-split.csv"
_HEADER = re.compile(r"^[ \t]*([A-Z][A-Z /&,()\-]{1,60}?)[ \t]*:", re.MULTILINE)
_IMPRESSION = re.compile(r"IMPRESSIONS?|CONCLUSIONS?|(FINDINGS? ?(AND|/|&) ?)?IMPRESSIONS?")
_FINDINGS = re.compile(r"FINDINGS?")
_VIEW_RANK = {"PA": 0, "AP": 1}
_ID = re.compile(r"\d{1,12}")
_DICOM = re.compile(r"[A-Za-z0-9][A-Za-z0-9.\-]{0,127}")


def _open(root: Path, name: str) -> tuple[Path, IO[str]] | None:
    for candidate in (root / f"{name}.gz", root / name):
        if candidate.is_file():
            if candidate.suffix == ".gz":
                return candidate, gzip.open(candidate, "rt", encoding="utf-8", newline="")
            return candidate, candidate.open(encoding="utf-8", newline="")
    return None


def _csv(root: Path, name: str, columns: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    """(start line, row) of a required CSV; raises InvalidInput when absent or malformed."""
    opened = _open(root, name)
    if opened is None:
        raise InvalidInput(f"{root}: neither {name}.gz nor {name} found")
    path, fh = opened
    try:
        with fh:
            reader = csv.DictReader(fh)
            missing = [c for c in columns if c not in (reader.fieldnames or [])]
            if missing:
                raise InvalidInput(f"{path}: missing column(s): {', '.join(missing)}")
            start = reader.line_num + 1
            for row in reader:
                yield start, {k: (v or "").strip() for k, v in row.items() if isinstance(k, str)}
                start = reader.line_num + 1
    except (OSError, EOFError, UnicodeDecodeError, csv.Error) as exc:
        raise InvalidInput(f"{path}: unreadable CSV ({exc})") from exc


def sections(text: str) -> dict[str, str]:
    """Report sections by upper-case header (``"IMPRESSION"`` -> its text, whitespace collapsed).

    A later section with the same header is appended to the first. Text before the first
    header is under ``""``.
    """
    out: dict[str, str] = {}
    matches = list(_HEADER.finditer(text))
    bounds = [("", 0, matches[0].start() if matches else len(text))]
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        bounds.append((" ".join(m.group(1).split()), m.end(), end))
    for name, start, end in bounds:
        body = " ".join(text[start:end].split())
        if body:
            out[name] = f"{out[name]} {body}" if name in out else body
    return out


def _answer(text: str) -> str:
    found = sections(text)
    for pattern in (_IMPRESSION, _FINDINGS):
        for name, body in found.items():
            if pattern.fullmatch(name):
                return body
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n[ \t]*\n", text)]
    paragraphs = [p for p in paragraphs if p and p.upper() != "FINAL REPORT"]
    if not paragraphs:
        return ""
    last = paragraphs[-1]
    header = _HEADER.match(last)
    return last[header.end() :].strip() if header else last


def _when(date: str, time: str) -> float:
    """UTC seconds from YYYYMMDD and HHMMSS[.fff]; raises ValueError."""
    if not re.fullmatch(r"\d{8}", date):
        raise ValueError(f"StudyDate {date!r} is not YYYYMMDD")
    day = datetime.strptime(date, "%Y%m%d").replace(tzinfo=UTC)
    if not time:
        return day.timestamp()
    m = re.fullmatch(r"(\d{1,6})(\.\d+)?", time)
    if not m:
        raise ValueError(f"StudyTime {time!r} is not HHMMSS")
    whole = m.group(1).zfill(6)
    hh, mm, ss = int(whole[:2]), int(whole[2:4]), int(whole[4:])
    if hh > 23 or mm > 59 or ss > 59:
        raise ValueError(f"StudyTime {time!r} is not a time of day")
    return (day + timedelta(hours=hh, minutes=mm, seconds=ss + float(m.group(2) or 0))).timestamp()


def load(
    root: str | Path,
    *,
    split: str | None = None,
    reports_dir: str | Path | None = None,
) -> tuple[list[ManifestRow], list[RowProblem]]:
    """One row per study of the MIMIC-CXR-JPG tree at ``root``, sorted by patient then time.

    Image paths are absolute. Raises :class:`InvalidInput` for an unknown ``split``, a missing
    or malformed metadata (or, with ``split``, split) CSV.
    """
    root = Path(root).resolve()
    reports = Path(reports_dir).resolve() if reports_dir is not None else root
    if split is not None and split not in SPLITS:
        raise InvalidInput(f"unknown split {split!r}; known: {', '.join(SPLITS)}")
    splits: dict[str, str] = {}
    if split is not None:
        for _, r in _csv(root, SPLIT, ("dicom_id", "split")):
            splits[r["dicom_id"]] = r["split"]
    columns = ("dicom_id", "subject_id", "study_id", "ViewPosition", "StudyDate", "StudyTime")
    studies: dict[tuple[str, str], list[tuple[int, dict[str, str]]]] = {}
    problems: list[RowProblem] = []
    for line, r in _csv(root, METADATA, columns):
        if split is not None:
            if r["dicom_id"] not in splits:
                problems.append(RowProblem(line, f"dicom_id {r['dicom_id']!r} not in the split file"))
                continue
            if splits[r["dicom_id"]] != split:
                continue
        studies.setdefault((r["subject_id"], r["study_id"]), []).append((line, r))
    rows: list[ManifestRow] = []
    for (subject, study), images in studies.items():
        line = images[0][0]
        try:
            rows.append(_study(root, reports, subject, study, images))
        except ValueError as exc:
            problems.append(RowProblem(line, f"study {study or '?'} of subject {subject or '?'}: {exc}"))
    rows.sort(key=lambda r: (r.patient_id, r.timestamp, r.study_id))
    problems.sort(key=lambda p: p.line)
    return rows, problems


def _present(root: Path, image: Path) -> bool:
    """A regular file that stays inside ``root`` once links are resolved."""
    return image.is_file() and inside(image, root)


def _study(
    root: Path, reports: Path, subject: str, study: str, images: list[tuple[int, dict[str, str]]]
) -> ManifestRow:
    """The row of one study; raises ValueError with the reason it is skipped."""
    if not _ID.fullmatch(subject) or not _ID.fullmatch(study):
        raise ValueError("subject_id and study_id must be numbers")
    bad = [r["dicom_id"] for _, r in images if not _DICOM.fullmatch(r["dicom_id"])]
    if bad:
        raise ValueError(f"invalid dicom_id {bad[0]!r}")
    folder = Path("files") / f"p{subject[:2]}" / f"p{subject}"
    report_path = reports / folder / f"s{study}.txt"
    if not report_path.is_file():
        raise ValueError(f"report missing: {folder / f's{study}.txt'}")
    try:  # a bounded regular file inside the reports folder
        text = read_regular(report_path, max_bytes=4 * MAX_TEXT_CHARS, root=reports).decode("utf-8")
    except (InvalidInput, UnicodeDecodeError) as exc:
        raise ValueError(f"unreadable report ({exc})") from exc
    answer = _answer(text)
    if not answer:
        raise ValueError("report has no text")
    ranked = sorted(
        (r for _, r in images),
        key=lambda r: (
            _VIEW_RANK.get(r["ViewPosition"], 2 if r["ViewPosition"] else 3),
            r["dicom_id"],
        ),
    )
    chosen = next(
        (r for r in ranked if _present(root, root / folder / f"s{study}" / f"{r['dicom_id']}.jpg")),
        None,
    )
    if chosen is None:
        raise ValueError(f"no image file in {folder / f's{study}'}")
    lines = [line.strip() for line in text.strip().splitlines()]
    return ManifestRow(
        patient_id=f"mimic-{subject}",
        study_id=study,
        timestamp=_when(chosen["StudyDate"], chosen["StudyTime"]),
        image=str(root / folder / f"s{study}" / f"{chosen['dicom_id']}.jpg"),
        question=QUESTION,
        answer=answer,
        report=re.sub(r"\n{3,}", "\n\n", "\n".join(lines)),
        decision="",
        view=chosen["ViewPosition"],
        line=images[0][0],
    )

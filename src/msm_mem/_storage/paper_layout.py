"""Import and export of the paper's on-disk layout (appendix A.1(c)-(e)).

::

    OUT/layout.json                       {"format": "msm-mem-paper", "encoder", "dim", counts}
    OUT/episodic.jsonl + episodic.faiss   the i-th FAISS vector is the i-th JSONL line
    OUT/visual.jsonl   + visual.faiss     (IndexFlatIP over unit vectors)
    OUT/semantic/<patient_id>.json        per category: the active ``patient_summary`` and
                                          every version (patient ids are percent-encoded)

Export writes every record in insertion order with its governance fields (the empty rows an
erasure leaves are not records and are left out), so importing into an empty store with the
same encoder gives identical retrieval results. Import validates the whole layout first and then
writes it in one transaction: a bad file stores nothing.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import faiss
import numpy as np

from .._errors import EncoderMismatch, InvalidInput, StoreError
from .._records import EpisodicRecord, Impression, SemanticState, State, VisualRecord
from .base import Store, WriteBatch
from .erase import is_erased

__all__ = ["export_paper", "import_paper", "read_paper"]

FORMAT = "msm-mem-paper"
_EPI_FIELDS = (
    "episode_id",
    "patient_id",
    "timestamp",
    "question",
    "answer",
    "decision",
    "media_path",
    "media_description",
    "study_id",
)
_VIS_FIELDS = ("visual_id", "patient_id", "timestamp", "media_path", "visual_tag", "source_episode_id")
_GOV_FIELDS = ("state", "confidence", "evidence_tier", "source", "created_at", "decay_at", "supersedes")


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat()


def _line(record: Any, names: tuple[str, ...]) -> str:
    data = {n: getattr(record, n) for n in names + _GOV_FIELDS}
    data["state"] = record.state.value
    data["time"] = _iso(record.timestamp)  # human-readable twin of the UTC seconds
    return json.dumps(data, ensure_ascii=False, allow_nan=False)


def _write_vectors(path: Path, vectors: list[np.ndarray], dim: int) -> None:
    index = faiss.IndexFlatIP(dim)
    if vectors:
        index.add(np.stack(vectors).astype(np.float32))
    faiss.write_index(index, str(path))


def export_paper(store: Store, out: str | Path, *, include: Callable[[str], bool] | None = None) -> dict[str, int]:
    """Write the store in the paper's layout into ``out`` (created; must be empty if it exists).

    ``include(patient_id)`` decides which patients' records are written (default: all); an
    anonymised record has the patient id ``""``."""
    keep = include or (lambda _patient: True)
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InvalidInput(f"{out} must be a new or empty directory")
    (out / "semantic").mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    for kind, records, names in (
        ("episodic", store.iter_episodes(), _EPI_FIELDS),
        ("visual", store.iter_visuals(), _VIS_FIELDS),
    ):
        vectors: list[np.ndarray] = []
        with (out / f"{kind}.jsonl").open("w", encoding="utf-8") as fh:
            for record in records:
                if not keep(record.patient_id) or is_erased(record):  # an erased patient's empty row
                    continue
                fh.write(_line(record, names) + "\n")
                vectors.append(record.z)
        _write_vectors(out / f"{kind}.faiss", vectors, store.dim)
        counts[kind] = len(vectors)
    by_patient: dict[str, dict[str, list[SemanticState]]] = defaultdict(lambda: defaultdict(list))
    for state in store.iter_semantic():
        if not keep(state.patient_id):
            continue
        by_patient[state.patient_id][state.category].append(state)
    for patient_id, categories in by_patient.items():
        doc: dict[str, Any] = {"patient_id": patient_id, "categories": {}}
        for category, versions in categories.items():
            active = [v for v in versions if v.state == State.ACTIVE]
            doc["categories"][category] = {
                "patient_summary": [_imp(i) for i in active[-1].impressions] if active else [],
                "summary": active[-1].summary() if active else "",
                "versions": [_version(v) for v in versions],
            }
        (out / "semantic" / f"{quote(patient_id, safe='') or '%00anon'}.json").write_text(
            json.dumps(doc, ensure_ascii=False, indent=1, allow_nan=False), encoding="utf-8"
        )
    counts["semantic"] = sum(len(v) for c in by_patient.values() for v in c.values())
    layout = {"format": FORMAT, "encoder": store.encoder_name, "dim": store.dim, **counts}
    (out / "layout.json").write_text(json.dumps(layout, indent=1))
    return counts


def _imp(i: Impression) -> dict[str, Any]:
    return {"timestamp": i.timestamp, "time": _iso(i.timestamp), "impression": i.text, "decision": i.decision}


def _version(s: SemanticState) -> dict[str, Any]:
    return {
        "state_id": s.state_id,
        "version": s.version,
        "state": s.state.value,
        "created_at": s.created_at,
        "supersedes": s.supersedes,
        "evidence_tier": s.evidence_tier,
        "impressions": [_imp(i) for i in s.impressions],
    }


def _read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with path.open(encoding="utf-8") as fh:
        for number, text in enumerate(fh, start=1):
            try:
                obj = json.loads(text, parse_constant=_reject_constant)
            except ValueError as exc:
                raise InvalidInput(f"{path.name} line {number}: invalid JSON ({exc})") from exc
            if not isinstance(obj, dict):
                raise InvalidInput(f"{path.name} line {number}: expected an object")
            yield number, obj


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not allowed")


def _read_vectors(path: Path, dim: int) -> np.ndarray:
    try:
        index = faiss.read_index(str(path))
    except RuntimeError as exc:
        raise InvalidInput(f"{path.name}: not a readable FAISS index") from exc
    if index.d != dim:
        raise EncoderMismatch(f"{path.name} has dimension {index.d}, the store has {dim}")
    if index.ntotal == 0:
        return np.zeros((0, dim), dtype=np.float32)
    xb = index.get_xb()  # type: ignore[attr-defined]  # an IndexFlat (checked by read_index's type)
    return faiss.rev_swig_ptr(xb, index.ntotal * dim).reshape(index.ntotal, dim).copy()


def _record(cls: type, obj: dict[str, Any], names: tuple[str, ...], z: np.ndarray, where: str) -> Any:
    unknown = set(obj) - set(names) - set(_GOV_FIELDS) - {"time"}
    if unknown:
        raise InvalidInput(f"{where}: unknown field(s) {sorted(unknown)}")
    norm = float(np.linalg.norm(z))
    if not math.isfinite(norm) or abs(norm - 1.0) > 1e-3:
        raise InvalidInput(f"{where}: its vector is not L2-normalised")
    try:
        kwargs = {n: obj[n] for n in names if n in obj}
        kwargs.update({n: obj[n] for n in _GOV_FIELDS if n in obj})
        kwargs["state"] = State(kwargs.get("state", "active"))
        return cls(z=z.astype(np.float32), **kwargs)
    except (TypeError, ValueError, KeyError) as exc:
        raise InvalidInput(f"{where}: {exc}") from exc


def import_paper(store: Store, src: str | Path) -> dict[str, int]:
    """Read a paper layout written by :func:`export_paper` (or by hand) into ``store``."""
    batch = read_paper(store, src)
    store.write(batch)
    return {"episodic": len(batch.episodes), "visual": len(batch.visuals), "semantic": len(batch.semantic)}


def read_paper(store: Store, src: str | Path) -> WriteBatch:
    """Validate a paper layout against ``store`` (empty, same encoder) and return the batch that
    imports it; nothing is written, so a caller can add its own rows to the same transaction."""
    src = Path(src)
    try:
        layout = json.loads((src / "layout.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InvalidInput(f"{src} is not a paper layout (layout.json: {exc})") from exc
    if layout.get("format") != FORMAT:
        raise InvalidInput(f"{src}/layout.json: format must be {FORMAT!r}")
    if layout.get("dim") != store.dim or layout.get("encoder") != store.encoder_name:
        raise EncoderMismatch(
            f"layout was made by {layout.get('encoder')!r} ({layout.get('dim')}-d); this store "
            f"uses {store.encoder_name!r} ({store.dim}-d)"
        )
    batch = WriteBatch(restore=True)
    for kind, cls, names, target in (
        ("episodic", EpisodicRecord, _EPI_FIELDS, batch.episodes),
        ("visual", VisualRecord, _VIS_FIELDS, batch.visuals),
    ):
        vectors = _read_vectors(src / f"{kind}.faiss", store.dim)
        lines = list(_read_jsonl(src / f"{kind}.jsonl"))
        if len(lines) != len(vectors):
            raise InvalidInput(f"{kind}.jsonl has {len(lines)} lines but {kind}.faiss has {len(vectors)} vectors")
        for (number, obj), z in zip(lines, vectors, strict=True):
            target.append(_record(cls, obj, names, z, f"{kind}.jsonl line {number}"))
    batch.semantic = _read_semantic(src / "semantic")
    if store.count("episodic") or store.count("visual") or store.count("semantic"):
        raise StoreError("import needs an empty store (ids and insertion order are preserved)")
    return batch


def _read_semantic(folder: Path) -> list[SemanticState]:
    states: list[SemanticState] = []
    if not folder.is_dir():
        return states
    for path in sorted(folder.glob("*.json")):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"), parse_constant=_reject_constant)
            pid = doc["patient_id"]
            if pid != unquote(path.stem) and not (pid == "" and path.stem == "%00anon"):
                raise ValueError(f"patient_id {pid!r} does not match the file name")
            for category, body in sorted(doc["categories"].items()):
                # versions in order; supersession chains are re-applied in the same order
                for v in sorted(body["versions"], key=lambda v: v["version"]):
                    states.append(
                        SemanticState(
                            state_id=v["state_id"],
                            patient_id=pid,
                            category=category,
                            impressions=tuple(
                                Impression(float(i["timestamp"]), i["impression"], i["decision"])
                                for i in v["impressions"]
                            ),
                            version=v["version"],
                            state=State(v["state"]),
                            created_at=v["created_at"],
                            supersedes=v["supersedes"],
                            evidence_tier=v["evidence_tier"],
                        )
                    )
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InvalidInput(f"semantic/{path.name}: {exc}") from exc
    return states

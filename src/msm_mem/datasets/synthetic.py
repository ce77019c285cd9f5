"""A deterministic, synthetic, longitudinal chest X-ray-like data set for demos and fast tests.

Each patient follows a latent *course*: a sequence of finding states, one per study, where a
state maps a finding to a severity level 1..3 (absent findings are left out). Findings appear,
progress, stay or resolve across studies taken days apart. Every study gets a grayscale PNG
that shows its state, a templated report (``COMPARISON / FINDINGS / IMPRESSION``), the
impression as ``answer`` and a ``decision`` derived from the state by fixed rules.

Image conventions (radiological): the patient's right is on the image's left. Lungs are dark,
the mediastinum and heart bright. Consolidation is a bright blob in a lower lung zone, effusion
a bright fluid level with a meniscus at a costophrenic angle, cardiomegaly a wider heart
shadow, pneumothorax a dark apical region without lung markings bounded by a pleural line,
edema a bilateral perihilar haze, a nodule a small round bright spot. Anatomy (lung and heart
size and position, lung markings) is drawn once per patient, so a patient's images resemble
each other; each study adds a small shift, an exposure change and noise.

Determinism: everything comes from ``numpy.random.default_rng([seed, patient_index])`` and
integer arithmetic on times, so the same arguments give byte-identical images and manifest on
the same platform (the manifest stores image paths relative to its folder).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import numpy.typing as npt
from PIL import Image

from .._errors import InvalidInput
from .manifest import ManifestRow, RowProblem

__all__ = ["DECISIONS", "FINDINGS", "QUESTION", "generate"]

QUESTION = "What is the impression of this chest radiograph?"
#: Finding keys and their report names.
FINDINGS: dict[str, str] = {
    "rll_consolidation": "right lower lobe consolidation",
    "lll_consolidation": "left lower lobe consolidation",
    "right_effusion": "right pleural effusion",
    "left_effusion": "left pleural effusion",
    "cardiomegaly": "cardiomegaly",
    "right_pneumothorax": "right pneumothorax",
    "left_pneumothorax": "left pneumothorax",
    "edema": "pulmonary edema",
    "right_nodule": "right upper lobe nodule",
    "left_nodule": "left upper lobe nodule",
}
#: Decisions, most urgent first; a study's decision is the most urgent one its findings call for.
DECISIONS = ("drain", "admit", "treat", "follow-up", "no action")
_ADJ: dict[str, tuple[str, str, str]] = {
    "consolidation": ("mild", "moderate", "extensive"),
    "effusion": ("small", "moderate", "large"),
    "pneumothorax": ("small", "moderate", "large"),
    "edema": ("mild", "moderate", "severe"),
    "cardiomegaly": ("mild", "moderate", "marked"),
    "nodule": ("6 mm", "9 mm", "14 mm"),
}
_EPOCH = int(datetime(2020, 1, 1, tzinfo=UTC).timestamp())
_DAY = 86_400

State = dict[str, int]
Float = npt.NDArray[np.float32]


def _kind(key: str) -> str:
    return key.rsplit("_", 1)[-1]


def _side(rng: np.random.Generator) -> str:
    return "right" if rng.random() < 0.5 else "left"


# --- courses: (rng, number of studies) -> one state per study -----------------------------


def _acute(rng: np.random.Generator, n: int, sudden: bool = False) -> list[int]:
    """Levels that rise to a peak and fall back to 0 (absent), padded with 0."""
    pre = int(rng.integers(0, 2)) if n >= 3 else 0
    peak = int(rng.integers(1, 4))
    up = [peak] if sudden else list(range(1, peak + 1))
    seq = [0] * pre + up + list(range(peak - 1, -1, -1))
    return (seq + [0] * n)[:n]


def _progressive(rng: np.random.Generator, n: int) -> list[int]:
    start, rate = int(rng.integers(1, 3)), (0.5, 1.0)[int(rng.integers(0, 2))]
    return [min(3, start + int(i * rate)) for i in range(n)]


def _pneumonia(rng: np.random.Generator, n: int) -> list[State]:
    key = "rll_consolidation" if rng.random() < 0.5 else "lll_consolidation"
    side = "right" if key.startswith("r") else "left"
    levels = _acute(rng, n) if rng.random() < 0.75 else _progressive(rng, n)
    # A parapneumonic effusion accompanies extensive consolidation.
    return [{key: v, f"{side}_effusion": 1 if v == 3 else 0} for v in levels]


def _effusion(rng: np.random.Generator, n: int) -> list[State]:
    key = f"{_side(rng)}_effusion"
    levels = _acute(rng, n) if rng.random() < 0.6 else _progressive(rng, n)
    return [{key: v} for v in levels]


def _pneumothorax(rng: np.random.Generator, n: int) -> list[State]:
    key = f"{_side(rng)}_pneumothorax"
    return [{key: v} for v in _acute(rng, n, sudden=True)]


def _heart_failure(rng: np.random.Generator, n: int) -> list[State]:
    heart = int(rng.integers(1, 4))
    return [{"cardiomegaly": heart, "edema": v, "right_effusion": 1 if v >= 2 else 0} for v in _acute(rng, n)]


def _nodule(rng: np.random.Generator, n: int) -> list[State]:
    key = f"{_side(rng)}_nodule"
    levels = [1] * n if rng.random() < 0.6 else [min(3, 1 + i // 2) for i in range(n)]
    return [{key: v} for v in levels]


def _normal(rng: np.random.Generator, n: int) -> list[State]:
    return [{} for _ in range(n)]


_COURSES: tuple[tuple[float, Callable[[np.random.Generator, int], list[State]]], ...] = (
    (0.15, _normal),
    (0.25, _pneumonia),
    (0.15, _effusion),
    (0.10, _pneumothorax),
    (0.20, _heart_failure),
    (0.15, _nodule),
)


def _course(rng: np.random.Generator, n: int) -> list[State]:
    weights = np.array([w for w, _ in _COURSES])
    build = _COURSES[int(rng.choice(len(_COURSES), p=weights / weights.sum()))][1]
    return [{k: v for k, v in s.items() if v > 0} for s in build(rng, n)]


# --- text ------------------------------------------------------------------------------------


def _phrase(key: str, level: int) -> str:
    return f"{_ADJ[_kind(key)][level - 1]} {FINDINGS[key]}"


def _impression(prev: State | None, cur: State) -> str:
    sentences: list[str] = []
    for key in FINDINGS:
        before, now = (prev or {}).get(key, 0), cur.get(key, 0)
        if now and prev is None:
            sentences.append(f"{_phrase(key, now)}.")
        elif now and not before:
            sentences.append(f"New {_phrase(key, now)}.")
        elif now:
            change = "increased" if now > before else "decreased" if now < before else "unchanged"
            sentences.append(f"{_phrase(key, now)}, {change} since prior.")
        elif before:
            sentences.append(f"Interval resolution of {FINDINGS[key]}.")
    if not cur:
        sentences.append("No acute cardiopulmonary abnormality.")
    return " ".join(s[0].upper() + s[1:] for s in sentences)


def _findings_text(cur: State) -> str:
    parts: list[str] = []
    heart = cur.get("cardiomegaly", 0)
    parts.append(
        f"The heart is {_ADJ['cardiomegaly'][heart - 1]}ly enlarged." if heart else "The heart size is normal."
    )
    lungs: list[str] = []
    for side, key in (("right", "rll_consolidation"), ("left", "lll_consolidation")):
        if level := cur.get(key, 0):
            adj = _ADJ["consolidation"][level - 1]
            lungs.append(f"There is {adj} airspace consolidation in the {side} lower lobe.")
    if level := cur.get("edema", 0):
        adj = _ADJ["edema"][level - 1]
        lungs.append(f"There is {adj} bilateral perihilar haziness consistent with edema.")
    for side in ("right", "left"):
        if level := cur.get(f"{side}_nodule", 0):
            size = _ADJ["nodule"][level - 1]
            lungs.append(f"A {size} rounded nodule projects over the {side} upper zone.")
    parts.extend(lungs or ["The lungs are clear."])
    pleura: list[str] = []
    for side in ("right", "left"):
        if level := cur.get(f"{side}_effusion", 0):
            adj = _ADJ["effusion"][level - 1]
            pleura.append(f"A {adj} {side} pleural effusion blunts the costophrenic angle.")
        if level := cur.get(f"{side}_pneumothorax", 0):
            adj = _ADJ["pneumothorax"][level - 1]
            pleura.append(f"A {adj} {side} apical pneumothorax is seen beyond the pleural line.")
    parts.extend(pleura or ["No pleural effusion or pneumothorax."])
    return " ".join(parts)


def _decision(prev: State | None, cur: State) -> str:
    wanted = {"no action"}
    for key, now in cur.items():
        kind, before = _kind(key), (prev or {}).get(key, 0)
        if kind == "pneumothorax":
            wanted.add("drain" if now >= 2 else "follow-up")
        elif kind == "effusion":
            wanted.add("drain" if now == 3 else "follow-up")
        elif kind == "edema":
            wanted.add("admit" if now >= 2 else "treat")
        elif kind == "consolidation":
            wanted.add("treat" if prev is None or now >= before else "follow-up")
        else:
            wanted.add("follow-up")
    return next(d for d in DECISIONS if d in wanted)


# --- images ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Anatomy:
    """One patient's fixed anatomy, in image fractions (0..1), and lung-marking texture."""

    cx: float  # midline
    gap: float  # lung centre distance from the midline
    rx: float  # lung half-width at the base
    ry: float  # lung half-height
    ly: float  # lung centre height
    hrx: float  # heart half-width
    hry: float  # heart half-height
    body: float  # soft-tissue brightness
    lung: float  # aerated lung brightness
    nod_dx: float  # nodule offset, in lung half-widths (lateral)
    nod_dy: float  # nodule offset, in lung half-heights (up is negative)
    texture: Float


def _anatomy(rng: np.random.Generator, size: int) -> _Anatomy:
    low = rng.standard_normal((size // 8 + 1, size // 8 + 1)).astype(np.float32)
    fine = rng.standard_normal((size // 3 + 1, size // 3 + 1)).astype(np.float32)
    texture = np.zeros((size, size), dtype=np.float32)
    for a, w in ((low, 0.6), (fine, 0.4)):
        texture += w * np.asarray(Image.fromarray(a).resize((size, size), Image.Resampling.BICUBIC))
    u = rng.uniform
    return _Anatomy(
        cx=0.5 + float(rng.normal(0, 0.015)),
        gap=u(0.19, 0.23),
        rx=u(0.15, 0.18),
        ry=u(0.28, 0.33),
        ly=u(0.42, 0.47),
        hrx=u(0.12, 0.14),
        hry=u(0.10, 0.12),
        body=u(0.50, 0.60),
        lung=u(0.16, 0.24),
        nod_dx=u(0.1, 0.5),
        nod_dy=u(-0.55, -0.3),
        texture=texture,
    )


def _soft(e: Float, width: float = 0.15) -> Float:
    """1 inside the ellipse level set ``e < 1``, 0 outside, with a soft edge."""
    out: Float = np.clip((1.0 - e) / width, 0.0, 1.0).astype(np.float32)
    return out


def _render(a: _Anatomy, cur: State, rng: np.random.Generator, size: int) -> Float:
    grid = np.linspace(0.0, 1.0, size, dtype=np.float32)
    y, x = np.meshgrid(grid, grid, indexing="ij")
    x = x - np.float32(rng.uniform(-0.01, 0.01))
    y = y - np.float32(rng.uniform(-0.01, 0.01))
    cx, ly, ry = a.cx, a.ly, a.ry
    torso = _soft(((x - cx) / 0.47) ** 2 + ((y - 0.58) / 0.62) ** 2, 0.3)
    img = 0.08 + (a.body - 0.08) * torso
    lungs: dict[str, Float] = {}
    centres = {"right": cx - a.gap, "left": cx + a.gap}
    markings = np.zeros_like(img)
    # Lungs are narrow at the apex and wide at the base.
    rx = a.rx * (0.7 + 0.45 * np.clip((y - ly + ry) / (2 * ry), 0.0, 1.0))
    for side, lx in centres.items():
        lungs[side] = _soft(((x - lx) / rx) ** 2 + ((y - ly) / ry) ** 2)
        img -= (a.body - a.lung) * lungs[side]
        hilum = np.exp(-((x - (lx + cx) / 2) ** 2 + (y - ly) ** 2) / 0.02)
        markings += lungs[side] * (0.035 * a.texture + 0.08 * hilum)
    # Pneumothorax: the lung collapses away from the apex; no markings beyond the pleural line.
    for side, lx in centres.items():
        if level := cur.get(f"{side}_pneumothorax", 0):
            shrink = 1.0 - 0.13 * level
            e = ((x - lx) / (rx * shrink)) ** 2 + ((y - ly - ry * (1 - shrink)) / (ry * shrink)) ** 2
            gap = lungs[side] * (1.0 - _soft(e, 0.05))
            markings *= 1.0 - gap
            img -= 0.07 * gap
            img += 0.12 * lungs[side] * np.exp(-(((e - 1.0) / 0.05) ** 2))
    img += markings
    spine = _soft(((x - cx) / (0.05 + 0.03 * y)) ** 2 + ((y - 0.6) / 0.7) ** 4, 0.5)
    heart_w = 1.0 + 0.14 * cur.get("cardiomegaly", 0)
    hx, hy = cx + 0.05 * heart_w, ly + 0.58 * ry
    heart = _soft(((x - hx) / (a.hrx * heart_w)) ** 2 + ((y - hy) / a.hry) ** 2, 0.3)
    img = np.maximum(img, 0.68 * spine)
    img = np.maximum(img, 0.74 * heart)
    for side, lx in centres.items():
        sign = -1.0 if side == "right" else 1.0
        lobe = "rll" if side == "right" else "lll"
        if level := cur.get(f"{lobe}_consolidation", 0):
            r = 0.04 + 0.025 * level
            d2 = (x - lx - sign * 0.02) ** 2 + (y - ly - 0.5 * ry) ** 2
            img += (0.2 + 0.08 * level) * np.exp(-d2 / (2 * r * r)) * lungs[side]
        if level := cur.get(f"{side}_nodule", 0):
            nx, ny = lx + sign * a.nod_dx * rx, ly + a.nod_dy * ry
            r = 0.012 + 0.008 * level
            img += 0.36 * _soft(((x - nx) ** 2 + (y - ny) ** 2) / (r * r), 0.4)
        if level := cur.get(f"{side}_effusion", 0):
            lateral = np.maximum(sign * (x - lx) / rx, 0.0)
            top = ly + 0.85 * ry - 0.07 * level - 0.06 * lateral
            fluid = np.clip((y - top) / 0.012, 0.0, 1.0) * np.clip(lungs[side] * 3.0, 0.0, 1.0)
            img = img * (1.0 - fluid) + 0.7 * fluid
        if level := cur.get("edema", 0):
            hx2 = (lx + cx) / 2
            s2 = (0.09 + 0.03 * level) ** 2
            haze = np.exp(-((x - hx2) ** 2 + (y - ly) ** 2) / (2 * s2))
            img += 0.09 * level * haze * lungs[side]
    img = img * np.float32(rng.uniform(0.97, 1.03)) + np.float32(rng.uniform(-0.02, 0.02))
    img += rng.normal(0.0, 0.015, img.shape).astype(np.float32)
    out: Float = np.clip(img, 0.0, 1.0).astype(np.float32)
    return out


def _to_png(img: Float, path: Path) -> None:
    pixels = np.floor(img * 255.0 + 0.5).astype(np.uint8)
    Image.fromarray(pixels).save(path, format="PNG")


# --- the generator ---------------------------------------------------------------------------


def generate(
    out_dir: Path,
    *,
    patients: int = 40,
    studies_per_patient: tuple[int, int] = (2, 5),
    seed: int = 0,
    size: int = 128,
) -> tuple[list[ManifestRow], list[RowProblem]]:
    """Write ``out_dir/images/*.png`` and ``out_dir/manifest.jsonl``; return the rows.

    ``patients`` patients ``SYN-0001``... each get between ``studies_per_patient[0]`` and
    ``studies_per_patient[1]`` studies (inclusive) ``SYN-0001-01``... at strictly increasing
    times (UTC seconds, whole minutes between 07:00 and 19:00): the first on a day of 2020,
    each next one 1 to 30 calendar days after the previous one. Images are
    ``size`` x ``size`` 8-bit grayscale PNG. Returned rows are sorted by patient then time, carry
    absolute image paths and their 1-based line in the manifest, and equal what
    :func:`~msm_mem.datasets.manifest.read_manifest` reads back; problems are always empty.
    The same arguments give byte-identical files. Raises :class:`InvalidInput` on bad arguments.
    """
    low, high = studies_per_patient
    if patients < 1 or not 1 <= low <= high or high > 99 or not 64 <= size <= 2048:
        raise InvalidInput(
            "need patients >= 1, 1 <= studies_per_patient[0] <= studies_per_patient[1] <= 99 "
            f"and 64 <= size <= 2048; got {patients}, {studies_per_patient}, {size}"
        )
    out_dir = Path(out_dir).resolve()
    (out_dir / "images").mkdir(parents=True, exist_ok=True)
    rows: list[ManifestRow] = []
    lines: list[str] = []
    for p in range(1, patients + 1):
        rng = np.random.default_rng([seed, p])
        patient_id = f"SYN-{p:04d}"
        n = int(rng.integers(low, high + 1))
        states = _course(rng, n)
        anatomy = _anatomy(rng, size)
        t = _EPOCH + int(rng.integers(0, 365)) * _DAY
        prev: State | None = None
        prev_day = ""
        for i, cur in enumerate(states, start=1):
            if i > 1:
                t += int(rng.integers(1, 31)) * _DAY
            when = t + int(rng.integers(7 * 60, 19 * 60)) * 60  # a daytime minute
            study_id = f"{patient_id}-{i:02d}"
            rel = f"images/{study_id}.png"
            _to_png(_render(anatomy, cur, rng, size), out_dir / rel)
            impression = _impression(prev, cur)
            report = f"COMPARISON: {prev_day or 'None'}.\nFINDINGS: {_findings_text(cur)}\nIMPRESSION: {impression}"
            row = ManifestRow(
                patient_id=patient_id,
                study_id=study_id,
                timestamp=float(when),
                image=str(out_dir / rel),
                question=QUESTION,
                answer=impression,
                report=report,
                decision=_decision(prev, cur),
                view="PA",
                line=len(rows) + 1,
            )
            rows.append(row)
            lines.append(json.dumps(replace(row, image=rel).to_dict(), ensure_ascii=False))
            prev, prev_day = cur, datetime.fromtimestamp(when, UTC).date().isoformat()
    (out_dir / "manifest.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return rows, []

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
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from .._errors import InvalidInput
from .manifest import ManifestRow, RowProblem
from .synthetic_images import State, _anatomy, _render, _to_png

__all__ = ["DECISIONS", "FINDINGS", "QUESTION", "QUESTIONS", "generate"]

QUESTION = "What is the impression of this chest radiograph?"
#: the questions a study can be asked: name -> (question_type, question); see :func:`generate`
QUESTIONS: dict[str, tuple[str, str]] = {
    "impression": ("text", QUESTION),
    "decision": ("label", "What should be done next for this patient?"),
    "effusion": ("yes_no", "Is there a pleural effusion?"),
}
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


# --- the generator ---------------------------------------------------------------------------


def generate(
    out_dir: Path,
    *,
    patients: int = 40,
    studies_per_patient: tuple[int, int] = (2, 5),
    seed: int = 0,
    size: int = 128,
    questions: tuple[str, ...] = ("impression",),
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

    ``questions`` names what each study is asked (:data:`QUESTIONS`), one row each, in that
    order: ``impression`` (text, answered by the impression), ``decision`` (label: one of
    :data:`DECISIONS`) and ``effusion`` (yes/no: whether either pleural effusion is present).
    """
    if not questions or len(set(questions)) != len(questions) or not set(questions) <= set(QUESTIONS):
        raise InvalidInput(f"questions must be distinct names among {', '.join(QUESTIONS)}; got {questions!r}")
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
            decision = _decision(prev, cur)
            answers = {
                "impression": impression,
                "decision": decision,
                "effusion": "yes" if any(_kind(k) == "effusion" for k in cur) else "no",
            }
            for name in questions:
                kind, question = QUESTIONS[name]
                row = ManifestRow(
                    patient_id=patient_id,
                    study_id=study_id,
                    timestamp=float(when),
                    image=str(out_dir / rel),
                    question=question,
                    answer=answers[name],
                    report=report,
                    decision=decision,
                    view="PA",
                    line=len(rows) + 1,
                    question_type=kind,
                )
                rows.append(row)
                lines.append(json.dumps(replace(row, image=rel).to_dict(), ensure_ascii=False))
            prev, prev_day = cur, datetime.fromtimestamp(when, UTC).date().isoformat()
    (out_dir / "manifest.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return rows, []

"""The records of an evaluation run: memory configurations, protocol settings, scored answers.

:mod:`msm_mem.eval.protocol` runs the protocol over them; :mod:`msm_mem.eval.report` and
:mod:`msm_mem.eval.plots` read them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from .._errors import InvalidInput
from .._records import QUESTION_TYPES, ManifestRow
from .._settings import Settings
from ..plugins.backbones.fitted_format import FittedModels
from .baselines import BASELINES
from .split import Split

__all__ = [
    "CONFIGS",
    "FITTED_ARMS",
    "MAX_FOLDS",
    "MODES",
    "Answered",
    "Feedback",
    "ProtocolRun",
    "ProtocolSettings",
    "arm_config",
    "config_flags",
    "fingerprint",
    "memory_free",
    "parse_configs",
    "question_groups",
]

#: The 8 memory configurations (subsets of S, E, V), in the paper's Table 1 order.
CONFIGS: tuple[str, ...] = ("none", "S", "E", "V", "SE", "SV", "EV", "SEV")
MODES: tuple[str, ...] = ("online", "frozen")
#: The arms fitted on the fine-tune split (:mod:`msm_mem.eval.fit`) and the memory configuration
#: each runs: ``ft`` the memory-free image model (the paper's FT row), ``SEV-ft`` all three
#: memories with the fitted backbone and router (the MoE-FT analogue).
FITTED_ARMS: dict[str, str] = {"ft": "none", "SEV-ft": "SEV"}
Feedback = Literal["truth", "none"]
#: the most cross-validation folds a run takes (each fold runs the whole protocol)
MAX_FOLDS = 20


def parse_configs(text: str) -> tuple[str, ...]:
    """``"all"`` or a comma list of ``none`` and subsets of S, E, V (letters in any order, any
    case) -> canonical names in :data:`CONFIGS` order; raises :class:`InvalidInput`."""
    if text.strip().lower() == "all":
        return CONFIGS
    chosen: set[str] = set()
    for token in (t.strip() for t in text.split(",")):
        letters = token.upper()
        if token.lower() == "none":
            chosen.add("none")
        elif letters and set(letters) <= set("SEV") and len(set(letters)) == len(letters):
            chosen.add("".join(c for c in "SEV" if c in letters))
        else:
            raise InvalidInput(f"unknown memory configuration {token!r}; use all, none or a subset of S, E, V")
    return tuple(c for c in CONFIGS if c in chosen)


def config_flags(name: str) -> dict[str, bool]:
    """``use_sem``/``use_epi``/``use_vis`` for a configuration name from :data:`CONFIGS`."""
    if name not in CONFIGS:
        raise InvalidInput(f"unknown memory configuration {name!r}")
    return {"use_sem": "S" in name, "use_epi": "E" in name, "use_vis": "V" in name}


def arm_config(name: str) -> str | None:
    """The memory configuration an agent arm runs (itself, or a fitted arm's); None for a baseline."""
    return name if name in CONFIGS else FITTED_ARMS.get(name)


def fingerprint(rows: Sequence[ManifestRow]) -> str:
    """SHA-256 (hex) of the rows' content and image bytes, independent of folder and row order."""
    digest = hashlib.sha256()
    for r in sorted(rows, key=lambda r: (r.patient_id, r.study_id, r.question)):
        image = hashlib.sha256(Path(r.image).read_bytes()).hexdigest()
        fields = [
            r.patient_id,
            r.study_id,
            repr(r.timestamp),
            r.question,
            r.answer,
            r.report,
            r.decision,
            r.view,
            r.question_type,
            image,
        ]
        digest.update(json.dumps(fields, ensure_ascii=False).encode() + b"\n")
    return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class ProtocolSettings:
    """What one evaluation runs: configurations, baselines, plugins, feedback, seed, whether
    to fit the fine-tune split (``fit``: adds the :data:`FITTED_ARMS`; needs scikit-learn, the
    ``fit`` extra) and the number of patient-level cross-validation ``folds`` (1: the paper's
    single 30/60/10 split; see :func:`~msm_mem.eval.split.fold_patients`)."""

    configs: tuple[str, ...] = CONFIGS
    baselines: tuple[str, ...] = BASELINES
    backbone: str = "nonparametric"
    encoder: str = "pixels"
    feedback: Feedback = "truth"
    seed: int = 0
    fit: bool = False
    folds: int = 1

    def __post_init__(self) -> None:
        if self.feedback not in ("truth", "none"):
            raise InvalidInput(f"feedback must be truth or none, got {self.feedback!r}")
        for c in self.configs:
            config_flags(c)
        if unknown := [b for b in self.baselines if b not in BASELINES]:
            raise InvalidInput(f"unknown baseline(s) {unknown}; known: {', '.join(BASELINES)}")
        if not isinstance(self.fit, bool):
            raise InvalidInput(f"fit must be true or false, got {self.fit!r}")
        if isinstance(self.folds, bool) or not isinstance(self.folds, int) or not 1 <= self.folds <= MAX_FOLDS:
            raise InvalidInput(f"folds must be a whole number from 1 to {MAX_FOLDS}, got {self.folds!r}")
        if not self.configs and not self.baselines and not self.fit:
            raise InvalidInput("nothing to evaluate: no configuration and no baseline")


@dataclass(frozen=True, slots=True)
class Answered:
    """One scored answer. ``gate`` is ``written``, ``discarded:<failed codes joined by +>``
    (the agent's own answer at the write-back gate) or ``""`` for baselines;
    ``question_type`` and ``question`` name the question group it belongs to. ``prior`` is the
    patient's study answered just before in the same probe ("" for a first study), ``retrieved``
    the distinct studies of the answer's study-linked evidence in rank order (:mod:`msm_mem.eval.recall`);
    ``fold`` the cross-validation fold it was answered in."""

    mode: str
    phase: str
    arm: str
    patient_id: str
    study_id: str
    prediction: str
    reference: str
    gate: str = ""
    question_type: str = "text"
    question: str = ""
    prior: str = ""
    retrieved: tuple[str, ...] = ()
    fold: int = 0


def memory_free(settings: ProtocolSettings) -> bool:
    """Whether ``settings`` run ``none`` as the memory-free majority model: the nonparametric
    backbone answers from memory only, so without memory it has no model of its own."""
    return "none" in settings.configs and settings.backbone == "nonparametric"


def question_groups(rows: Sequence[ManifestRow]) -> list[tuple[str, str]]:
    """The ``(question_type, question)`` groups of ``rows``: types in :data:`QUESTION_TYPES`
    order, questions sorted within a type."""
    order = {t: i for i, t in enumerate(QUESTION_TYPES)}
    return sorted({(r.question_type, r.question) for r in rows}, key=lambda g: (order[g[0]], g[1]))


@dataclass(slots=True)
class ProtocolRun:
    """Everything one run produced: settings, the split of each fold, study counts, every
    answer and each fold's models fitted on the fine-tune split (None without ``fit``)."""

    settings: ProtocolSettings
    memory_settings: Settings
    splits: tuple[Split, ...]
    data: dict[str, object]
    answers: list[Answered] = field(default_factory=list)
    fitted_folds: tuple[FittedModels | None, ...] = ()

    @property
    def split(self) -> Split:
        """The split of a one-fold run; raises :class:`InvalidInput` for a cross-validated one."""
        if len(self.splits) != 1:
            raise InvalidInput(f"this run has {len(self.splits)} folds: read splits, not split")
        return self.splits[0]

    @property
    def fitted(self) -> FittedModels | None:
        """The fitted models of a one-fold run (None without ``fit``); raises
        :class:`InvalidInput` for a cross-validated one (read ``fitted_folds``)."""
        if len(self.splits) != 1:
            raise InvalidInput(f"this run has {len(self.splits)} folds: read fitted_folds, not fitted")
        return self.fitted_folds[0] if self.fitted_folds else None

    @property
    def memory_free(self) -> bool:
        """Whether the ``none`` row is the memory-free majority model (the nonparametric
        backbone's: see :mod:`msm_mem.eval.protocol`) rather than the backbone alone."""
        return memory_free(self.settings)

    @property
    def fitted_arms(self) -> tuple[str, ...]:
        return tuple(FITTED_ARMS) if self.settings.fit else ()

    @property
    def arms(self) -> tuple[str, ...]:
        return (*self.settings.configs, *self.fitted_arms, *self.settings.baselines)

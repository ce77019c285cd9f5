"""What one query is and what the agent answers: the query, the answer and its evidence trail."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .._errors import InvalidInput
from .._memory.gate import GateDecision
from ..plugins.backbones.base import Candidate
from .policy import RetrievalStep
from .router import ExpertWeights, RouterFeatures
from .stored import StoredStudy

__all__ = ["MODEL_PART", "AgentAnswer", "Evidence", "ModelRef", "Query"]

MODEL_PART = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._:+/-]{0,127}\Z")
"""What a backbone name, a model id or a model version may hold: a letter or digit, then up
to 127 letters, digits and ``. _ : + / -`` (the ids model servers use, never free text)."""

_OUTSIDE_PART = re.compile(r"[^A-Za-z0-9._:+/-]+")


@dataclass(frozen=True, slots=True)
class Evidence:
    """One line of the evidence trail.

    ``score`` is the ranking score ``cosine x composite_k`` (1.0 x composite for semantic
    state; for a claim the cosine of its study's image), lowered for an unverified record to the
    lowest score of a verified record about the same study (a verified record never ranks below
    an unverified one); the factors are kept: ``cosine`` in [-1, 1], ``confidence``,
    ``freshness`` (in the evidence's clinical time relative to the query's) and ``tier_weight``
    in [0, 1]; ``evidence_tier`` names the tier the weight is for (``agent``, ``ground_truth``,
    ...; empty when unknown). ``kind`` is semantic, episodic, visual, claim, or
    population-episodic / population-visual for other patients' de-identified experience.
    """

    id: str
    kind: str
    score: float
    cosine: float = 1.0
    confidence: float = 1.0
    freshness: float = 1.0
    tier_weight: float = 1.0
    evidence_tier: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "kind": self.kind,
            "score": round(self.score, 6),
            "cosine": round(self.cosine, 6),
            "confidence": round(self.confidence, 6),
            "freshness": round(self.freshness, 6),
            "tier_weight": round(self.tier_weight, 6),
        }


@dataclass(frozen=True, slots=True)
class Query:
    """One clinical query: patient, image (path, grayscale array, or one of the patient's
    stored studies), question, UTC time."""

    patient_id: str
    image: str | os.PathLike[str] | npt.NDArray[np.float32] | StoredStudy
    question: str
    timestamp: float | None = None
    study_id: str = ""
    visual_tag: str = ""


@dataclass(frozen=True, slots=True)
class ModelRef:
    """The model that produced an answer: the ``backbone`` (a plugin name, or what an agent
    calls its own model's family, e.g. ``openai``), the ``model`` id (e.g.
    ``llava-hf/llava-1.5-7b-hf``; "" for a backbone with no separate model) and its ``version``
    where the server reports one ("" otherwise). Each part matches :data:`MODEL_PART`
    (:class:`InvalidInput` otherwise), so it can go into the audit trail as an id."""

    backbone: str
    model: str = ""
    version: str = ""

    def __post_init__(self) -> None:
        for name in ("backbone", "model", "version"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise InvalidInput(f"model {name} must be a string, got {type(value).__name__}")
            if (value or name == "backbone") and not MODEL_PART.match(value):
                raise InvalidInput(
                    f"model {name} {value[:40]!r} must be 1-128 characters: a letter or digit, then letters, "
                    "digits and . _ : + / -"
                )

    @classmethod
    def reported(cls, backbone: str, model: str = "", version: str = "") -> ModelRef:
        """A reference from what a model server reported: characters outside
        :data:`MODEL_PART` become ``_`` and each part is cut to 128 characters (a server's
        text is never refused, only made safe to audit)."""

        def safe(text: str) -> str:
            cleaned = _OUTSIDE_PART.sub("_", text.strip()).lstrip("._:+/-")[:128]
            return cleaned

        return cls(safe(backbone) or "unknown", safe(model), safe(version))

    @property
    def audit_id(self) -> str:
        """``model:<backbone>[/<model>][@<version>]``: how the audit trail names the model."""
        return (
            "model:"
            + self.backbone
            + (f"/{self.model}" if self.model else "")
            + (f"@{self.version}" if self.version else "")
        )

    def to_json(self) -> dict[str, str]:
        return {"backbone": self.backbone, "model": self.model, "version": self.version}


@dataclass(frozen=True, slots=True)
class AgentAnswer:
    """The answer, its evidence trail, the gate decision (None when write-back is off).

    Not part of the JSON: ``steps`` (the policy's steps and what each returned), ``weights``
    (the expert weights applied), ``features`` (what the router saw), ``candidates`` (the
    patient's candidates before the router, to label router training examples) and ``studies``
    (aligned with ``evidence``: the patient's own study each line is about, "" for the semantic
    state and population experience; for evidence recall). ``cited`` are the ids of the
    evidence the backbone says the answer rests on (a subset of the evidence trail's ids; empty
    when it names none). ``model`` is the model that answered, as the audit trail names it.
    """

    answer: str
    evidence: tuple[Evidence, ...]
    gate: GateDecision | None
    prompt: str
    backbone: str
    source: str
    decision: str = ""
    steps: tuple[RetrievalStep, ...] = ()
    weights: ExpertWeights | None = None
    features: RouterFeatures | None = None
    candidates: tuple[Candidate, ...] = ()
    cited: tuple[str, ...] = ()
    studies: tuple[str, ...] = ()
    model: ModelRef | None = None

    def to_json(self) -> dict[str, object]:
        """The documented JSON shape: ``answer``, ``evidence`` [{id, kind, score, factors...}],
        ``gate`` {written, reasons}, plus ``backbone``, ``source``, ``decision`` and ``model``
        {backbone, model, version}."""
        gate = {"written": self.gate.written, "reasons": list(self.gate.reasons)} if self.gate else None
        return {
            "answer": self.answer,
            "evidence": [e.to_json() for e in self.evidence],
            "gate": gate,
            "backbone": self.backbone,
            "source": self.source,
            "decision": self.decision,
            "model": self.model.to_json() if self.model is not None else None,
        }

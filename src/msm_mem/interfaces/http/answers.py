"""The response bodies of an answer: its evidence trail, the write-back gate's decision and the
policy's retrieval steps (re-exported by :mod:`.models`). Times are UTC seconds."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

__all__ = [
    "AnswerOut",
    "ContextOut",
    "EvidenceOut",
    "FromRecord",
    "GateOut",
    "ModelOut",
    "RecordedAnswerOut",
    "StepOut",
]


class FromRecord(BaseModel):
    """A response body read from a library record's attributes by the validation library
    (``XOut.model_validate(record)``), never copied field by field."""

    model_config = ConfigDict(from_attributes=True)


class EvidenceOut(FromRecord):
    """One line of the evidence trail: ``score = cosine x confidence x freshness x tier_weight``."""

    id: str
    kind: str
    score: float
    cosine: float
    confidence: float
    freshness: float
    tier_weight: float
    evidence_tier: str = ""


class GateOut(FromRecord):
    written: bool
    reasons: list[str]
    max_cosine: float | None
    keywords: list[str]


class StepOut(FromRecord):
    """One retrieval step of the answer's policy: the memory and scope read, the ids it returned
    (``new_ids``: those not returned by an earlier step), or ``refused`` by an ablation flag."""

    memory: str
    scope: str
    ids: list[str]
    new_ids: list[str]
    refused: bool

    @model_validator(mode="before")
    @classmethod
    def _flatten(cls, step: Any) -> Any:
        """A policy step (the library's ``RetrievalStep``) nests its memory and scope in
        ``step`` and pairs each hit with its score."""
        if isinstance(step, dict) or not hasattr(step, "hits"):
            return step
        return {
            "memory": step.step.memory,
            "scope": step.step.scope,
            "ids": [hit.id for hit, _ in step.hits],
            "new_ids": list(step.new_ids),
            "refused": step.refused,
        }


class ModelOut(FromRecord):
    """The model that produced an answer: backbone, model id and version ("" when unknown)."""

    backbone: str
    model: str
    version: str


class AnswerOut(FromRecord):
    """An answer with its evidence trail, the ids the answer rests on (``cited``), the policy's
    retrieval steps and the gate's decision (None without write-back)."""

    answer: str
    evidence: list[EvidenceOut]
    gate: GateOut | None
    prompt: str
    backbone: str
    source: str
    decision: str
    cited: list[str] = []
    steps: list[StepOut] = []
    model: ModelOut | None = None


class ContextOut(FromRecord):
    """The fused context of a question for the caller's own model: the prompt (each evidence
    line starts with its id in brackets), the ids it includes and drops for the character
    budget, the evidence trail, the study, and ``context_id``, the short-term item to answer by
    ``expires_at``. ``image`` is the query image as a ``data:image/png;base64,...`` URL when the
    request asked for it (``include_image``), else null."""

    context_id: str
    patient_id: str
    question: str
    prompt: str
    included: list[str]
    dropped: list[str]
    budget_chars: int
    evidence: list[EvidenceOut]
    study_id: str
    image_study: str
    expires_at: float
    image: str | None = None


class RecordedAnswerOut(FromRecord):
    """A recorded answer: the gate's decision (``episode_id`` when written to long-term memory),
    the answer as stored, its ``source``, the evidence ids it rests on and the model."""

    context_id: str
    gate: GateOut
    episode_id: str | None
    answer: str
    source: str
    evidence: list[str]
    model: ModelOut

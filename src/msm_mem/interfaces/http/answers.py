"""The response bodies of an answer: its evidence trail, the write-back gate's decision and the
policy's retrieval steps (re-exported by :mod:`.models`). Times are UTC seconds."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

__all__ = ["AnswerOut", "EvidenceOut", "FromRecord", "GateOut", "StepOut"]


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

"""The response bodies of an answer: its evidence trail, the write-back gate's decision and the
policy's retrieval steps (re-exported by :mod:`.models`). Times are UTC seconds."""

from __future__ import annotations

from pydantic import BaseModel

from ... import AgentAnswer, Evidence, GateDecision

__all__ = ["AnswerOut", "EvidenceOut", "GateOut", "StepOut"]


class EvidenceOut(BaseModel):
    """One line of the evidence trail: ``score = cosine x confidence x freshness x tier_weight``."""

    id: str
    kind: str
    score: float
    cosine: float
    confidence: float
    freshness: float
    tier_weight: float
    evidence_tier: str = ""

    @classmethod
    def of(cls, e: Evidence) -> EvidenceOut:
        return cls(
            id=e.id,
            kind=e.kind,
            score=e.score,
            cosine=e.cosine,
            confidence=e.confidence,
            freshness=e.freshness,
            tier_weight=e.tier_weight,
            evidence_tier=e.evidence_tier,
        )


class GateOut(BaseModel):
    written: bool
    reasons: list[str]
    max_cosine: float | None
    keywords: list[str]

    @classmethod
    def of(cls, g: GateDecision) -> GateOut:
        return cls(written=g.written, reasons=list(g.reasons), max_cosine=g.max_cosine, keywords=list(g.keywords))


class StepOut(BaseModel):
    """One retrieval step of the answer's policy: the memory and scope read, the ids it returned
    (``new_ids``: those not returned by an earlier step), or ``refused`` by an ablation flag."""

    memory: str
    scope: str
    ids: list[str]
    new_ids: list[str]
    refused: bool


class AnswerOut(BaseModel):
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

    @classmethod
    def of(cls, a: AgentAnswer) -> AnswerOut:
        return cls(
            answer=a.answer,
            evidence=[EvidenceOut.of(e) for e in a.evidence],
            gate=None if a.gate is None else GateOut.of(a.gate),
            prompt=a.prompt,
            backbone=a.backbone,
            source=a.source,
            decision=a.decision,
            cited=list(a.cited),
            steps=[
                StepOut(
                    memory=s.step.memory,
                    scope=s.step.scope,
                    ids=[h.id for h, _ in s.hits],
                    new_ids=list(s.new_ids),
                    refused=s.refused,
                )
                for s in a.steps
            ],
        )

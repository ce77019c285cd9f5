"""The service's response bodies, validated (pydantic), converted from the library's frozen
records; an answer's are in :mod:`.answers`, the governance ones and the request bodies in
:mod:`.bodies` (both re-exported here).
Embeddings are never sent; times are UTC seconds."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Generic, Literal, TypeVar

from pydantic import BaseModel, Field

from ... import (
    Claim,
    EpisodicRecord,
    Retrieved,
    SemanticState,
    StmItem,
    VisualRecord,
    WriteResult,
)
from .answers import AnswerOut, EvidenceOut, GateOut, StepOut
from .bodies import (
    CheckpointOut,
    ConsentIn,
    ConsentOut,
    ConsolidateIn,
    CountOut,
    FeedbackIn,
    GrantIn,
    MaintenanceOut,
    ReasonIn,
    VerifyOut,
)

__all__ = [
    "AnswerOut",
    "CheckpointOut",
    "ClaimOut",
    "ConsentIn",
    "ConsentOut",
    "ConsolidateIn",
    "CountOut",
    "EpisodeOut",
    "EvidenceOut",
    "FeedbackIn",
    "GateOut",
    "GrantIn",
    "MaintenanceOut",
    "Page",
    "ProblemOut",
    "ReasonIn",
    "RetrievedOut",
    "SemanticOut",
    "StatusOut",
    "StepOut",
    "StmItemOut",
    "StmPayloadOut",
    "VerifyOut",
    "VisualOut",
    "WhoAmIOut",
    "WriteResultOut",
]

T = TypeVar("T")
Seconds = Annotated[float, Field(allow_inf_nan=False, ge=-62_135_596_800.0, le=253_402_300_799.0)]
Text = Annotated[str, Field(max_length=20_000)]
Id = Annotated[str, Field(min_length=1, max_length=200)]
Word = Annotated[str, Field(min_length=1, max_length=50)]


class ProblemOut(BaseModel):
    """An RFC 9457 problem document (``application/problem+json``)."""

    type: str
    title: str
    status: int
    detail: str = ""
    instance: str | None = None


class StatusOut(BaseModel):
    status: str


class WhoAmIOut(BaseModel):
    """The principal and patient scope of the caller's credential."""

    id: str
    role: str
    purpose: str
    patients: list[str]
    credential: str


class Page(BaseModel, Generic[T]):
    """One page of a list: ``items`` from ``offset``; ``next_offset`` is None on the last page."""

    items: list[T]
    total: int
    offset: int
    limit: int
    next_offset: int | None


# records ---------------------------------------------------------------------------------------


class EpisodeOut(BaseModel):
    kind: Literal["episodic"] = "episodic"
    episode_id: str
    patient_id: str
    timestamp: float
    question: str
    answer: str
    decision: str
    media_path: str
    media_description: str
    study_id: str
    state: str
    confidence: float
    evidence_tier: str
    source: str
    created_at: float
    decay_at: float | None
    supersedes: str | None

    @classmethod
    def of(cls, r: EpisodicRecord) -> EpisodeOut:
        return cls(
            episode_id=r.episode_id,
            patient_id=r.patient_id,
            timestamp=r.timestamp,
            question=r.question,
            answer=r.answer,
            decision=r.decision,
            media_path=r.media_path,
            media_description=r.media_description,
            study_id=r.study_id,
            state=r.state.value,
            confidence=r.confidence,
            evidence_tier=r.evidence_tier,
            source=r.source,
            created_at=r.created_at,
            decay_at=r.decay_at,
            supersedes=r.supersedes,
        )


class VisualOut(BaseModel):
    kind: Literal["visual"] = "visual"
    visual_id: str
    patient_id: str
    timestamp: float
    media_path: str
    visual_tag: str
    source_episode_id: str
    state: str
    confidence: float
    evidence_tier: str
    source: str
    created_at: float
    decay_at: float | None
    supersedes: str | None

    @classmethod
    def of(cls, r: VisualRecord) -> VisualOut:
        return cls(
            visual_id=r.visual_id,
            patient_id=r.patient_id,
            timestamp=r.timestamp,
            media_path=r.media_path,
            visual_tag=r.visual_tag,
            source_episode_id=r.source_episode_id,
            state=r.state.value,
            confidence=r.confidence,
            evidence_tier=r.evidence_tier,
            source=r.source,
            created_at=r.created_at,
            decay_at=r.decay_at,
            supersedes=r.supersedes,
        )


class ImpressionOut(BaseModel):
    timestamp: float
    text: str
    decision: str


class SemanticOut(BaseModel):
    kind: Literal["semantic"] = "semantic"
    state_id: str
    patient_id: str
    category: str
    impressions: list[ImpressionOut]
    version: int
    state: str
    created_at: float
    supersedes: str | None
    evidence_tier: str

    @classmethod
    def of(cls, s: SemanticState) -> SemanticOut:
        return cls(
            state_id=s.state_id,
            patient_id=s.patient_id,
            category=s.category,
            impressions=[ImpressionOut(timestamp=i.timestamp, text=i.text, decision=i.decision) for i in s.impressions],
            version=s.version,
            state=s.state.value,
            created_at=s.created_at,
            supersedes=s.supersedes,
            evidence_tier=s.evidence_tier,
        )


class ClaimOut(BaseModel):
    claim_id: str
    patient_id: str
    key: str
    content: str
    source: str
    confidence: float
    evidence_tier: str
    created_at: float
    decay_at: float | None
    state: str
    supersedes: str | None

    @classmethod
    def of(cls, c: Claim) -> ClaimOut:
        return cls(
            claim_id=c.claim_id,
            patient_id=c.patient_id,
            key=c.key,
            content=c.content,
            source=c.source,
            confidence=c.confidence,
            evidence_tier=c.evidence_tier,
            created_at=c.created_at,
            decay_at=c.decay_at,
            state=c.state.value,
            supersedes=c.supersedes,
        )


class StmPayloadOut(BaseModel):
    question: str
    timestamp: float
    media_path: str
    visual_tag: str
    study_id: str
    media_description: str
    answer: str | None
    decision: str


class StmItemOut(BaseModel):
    item_id: str
    patient_id: str
    kind: str
    payload: StmPayloadOut | None
    created_at: float
    expires_at: float
    state: str
    actor: str

    @classmethod
    def of(cls, i: StmItem) -> StmItemOut:
        return cls(
            item_id=i.item_id,
            patient_id=i.patient_id,
            kind=i.kind,
            payload=None if i.payload is None else StmPayloadOut(**dataclasses.asdict(i.payload)),
            created_at=i.created_at,
            expires_at=i.expires_at,
            state=i.state.value,
            actor=i.actor,
        )


# results of operations -------------------------------------------------------------------------


RecordOut = Annotated[EpisodeOut | VisualOut | SemanticOut, Field(discriminator="kind")]


class RetrievedItemOut(BaseModel):
    """One ranked item; ``record`` is None for another patient's record (content withheld)."""

    evidence: EvidenceOut
    record: RecordOut | None


class RetrievedOut(BaseModel):
    patient_id: str
    scope: str
    items: list[RetrievedItemOut]

    @classmethod
    def of(cls, r: Retrieved, k: int) -> RetrievedOut:
        items = []
        for item in r.items[:k]:
            rec = item.record
            out: EpisodeOut | VisualOut | SemanticOut | None
            if isinstance(rec, EpisodicRecord):
                out = EpisodeOut.of(rec)
            elif isinstance(rec, VisualRecord):
                out = VisualOut.of(rec)
            elif isinstance(rec, SemanticState):
                out = SemanticOut.of(rec)
            else:
                out = None
            items.append(RetrievedItemOut(evidence=EvidenceOut.of(item.evidence), record=out))
        return cls(patient_id=r.patient_id, scope=r.scope, items=items)


class WriteResultOut(BaseModel):
    gate: GateOut
    episode_id: str | None
    visual_id: str | None
    semantic: SemanticOut | None

    @classmethod
    def of(cls, w: WriteResult) -> WriteResultOut:
        return cls(
            gate=GateOut.of(w.gate),
            episode_id=w.episode_id,
            visual_id=w.visual_id,
            semantic=None if w.semantic is None else SemanticOut.of(w.semantic),
        )

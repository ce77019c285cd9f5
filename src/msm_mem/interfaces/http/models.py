"""The service's response bodies, validated (pydantic), converted from the library's frozen
records; an answer's are in :mod:`.answers`, the governance ones and the request bodies in
:mod:`.bodies` (both re-exported here).
Embeddings are never sent; times are UTC seconds."""

from __future__ import annotations

from typing import Annotated, Generic, Literal, TypeVar

from pydantic import BaseModel, Field, field_validator

from ... import (
    EpisodicRecord,
    SemanticState,
    VisualRecord,
)
from .answers import AnswerOut, ContextOut, EvidenceOut, FromRecord, GateOut, ModelOut, RecordedAnswerOut, StepOut
from .bodies import (
    CheckpointOut,
    ConsentIn,
    ConsentOut,
    ConsolidateIn,
    CountOut,
    ErasureOut,
    FeedbackIn,
    GrantIn,
    MaintenanceOut,
    ReasonIn,
    ReceiptBody,
    RecordAnswerIn,
    VerifyOut,
)

__all__ = [
    "AnswerOut",
    "CheckpointOut",
    "ClaimOut",
    "ConsentIn",
    "ConsentOut",
    "ConsolidateIn",
    "ContextOut",
    "CountOut",
    "ErasureOut",
    "EpisodeOut",
    "EvidenceOut",
    "FeedbackIn",
    "GateOut",
    "GrantIn",
    "MaintenanceOut",
    "ModelOut",
    "Page",
    "ProblemOut",
    "ReasonIn",
    "ReceiptBody",
    "RecordAnswerIn",
    "RecordedAnswerOut",
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


class EpisodeOut(FromRecord):
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


class VisualOut(FromRecord):
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


class ImpressionOut(FromRecord):
    timestamp: float
    text: str
    decision: str


class SemanticOut(FromRecord):
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


class ClaimOut(FromRecord):
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


class StmPayloadOut(FromRecord):
    question: str
    timestamp: float
    media_path: str
    visual_tag: str
    study_id: str
    media_description: str
    answer: str | None
    decision: str


class StmItemOut(FromRecord):
    item_id: str
    patient_id: str
    kind: str
    payload: StmPayloadOut | None
    created_at: float
    expires_at: float
    state: str
    actor: str


# results of operations -------------------------------------------------------------------------


RecordOut = Annotated[EpisodeOut | VisualOut | SemanticOut, Field(discriminator="kind")]


class RetrievedItemOut(FromRecord):
    """One ranked item; ``record`` is the patient's own, population experience's de-identified copy, or None."""

    evidence: EvidenceOut
    record: RecordOut | None

    @field_validator("record", mode="before")
    @classmethod
    def _record(cls, record: object) -> object:
        """A library record becomes the response model of its kind (the union's tag)."""
        for kind, out in _RECORD_OUTS:
            if isinstance(record, kind):
                return out.model_validate(record)
        return record


_RECORD_OUTS: tuple[tuple[type, type[FromRecord]], ...] = (
    (EpisodicRecord, EpisodeOut),
    (VisualRecord, VisualOut),
    (SemanticState, SemanticOut),
)


# the caller keeps the top k with dataclasses.replace on the library result before validating it
class RetrievedOut(FromRecord):
    patient_id: str
    scope: str
    items: list[RetrievedItemOut]


class WriteResultOut(FromRecord):
    gate: GateOut
    episode_id: str | None
    visual_id: str | None
    semantic: SemanticOut | None

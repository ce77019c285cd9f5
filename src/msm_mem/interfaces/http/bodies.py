"""The service's governance bodies: consent records, verification, checkpoints and maintenance
reports going out, and every request body coming in (unknown fields forbidden: a body cannot
name a principal, only the credential does)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .answers import FromRecord

__all__ = [
    "CheckpointOut",
    "ConsentIn",
    "ConsentOut",
    "ConsolidateIn",
    "CountOut",
    "FeedbackIn",
    "GrantIn",
    "MaintenanceOut",
    "ReasonIn",
    "RecordAnswerIn",
    "VerifyOut",
]

Seconds = Annotated[float, Field(allow_inf_nan=False, ge=-62_135_596_800.0, le=253_402_300_799.0)]
Text = Annotated[str, Field(max_length=20_000)]
Id = Annotated[str, Field(min_length=1, max_length=200)]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ConsentOut(FromRecord):
    consent_id: str
    patient_id: str
    grantee: str
    purpose: str
    decision: str
    data_classes: list[str]
    start: float
    end: float | None
    created_at: float
    revoked_at: float | None


class VerifyOut(FromRecord):
    ok: bool
    count: int
    head_hash: str
    first_bad_seq: int | None
    reason: str


class CheckpointOut(BaseModel):
    size: int
    head: str


class CountOut(BaseModel):
    count: int


class ReceiptBody(BaseModel):
    """An erasure receipt (``MsmMem.shred``): the rows destroyed per table, the audit event."""

    pseudonym: str
    seq: int
    event_hash: str
    time: float
    counts: dict[str, int]
    derived: int
    signature: str


class ErasureOut(BaseModel):
    """``count``: the rows destroyed; ``receipt``: the signed receipt, for ``/v1/audit/verify-erasure``."""

    count: int
    receipt: ReceiptBody


class MaintenanceOut(FromRecord):
    expired: int
    consolidated: int
    discarded: int
    anonymized: int
    retracted: int
    checkpoint: CheckpointOut | None
    notes: list[str]

    @field_validator("checkpoint", mode="before")
    @classmethod
    def _checkpoint(cls, value: object) -> object:
        """The report holds the checkpoint as a (size, head) pair."""
        if isinstance(value, tuple):
            size, head = value
            return {"size": size, "head": head}
        return value


class ConsolidateIn(_In):
    answer: Annotated[str, Field(min_length=1, max_length=20_000)]
    decision: Text = ""


class ModelIn(_In):
    """The model that produced an answer: its backbone (family or serving stack, e.g. openai),
    its id and its version; letters, digits and ``. _ : + / -`` only."""

    backbone: Annotated[str, Field(min_length=1, max_length=128)]
    model: Annotated[str, Field(max_length=128)] = ""
    version: Annotated[str, Field(max_length=128)] = ""


class RecordAnswerIn(_In):
    """An answer the caller's own model gave to a context: the evidence ids it rests on (at
    most 256), the model, and the outcome (the decision taken, stored with the answer)."""

    answer: Annotated[str, Field(min_length=1, max_length=20_000)]
    evidence: Annotated[list[Id], Field(max_length=256)] = []
    model: ModelIn
    outcome: Text = ""


class FeedbackIn(_In):
    """A verdict on the answer to ``question`` about the study (it may be left out when the
    study holds answers to one question only)."""

    accept: bool
    correction: Text = ""
    decision: Text = ""
    question: Annotated[str, Field(min_length=1, max_length=16_384)] | None = None


class ReasonIn(_In):
    reason: Annotated[str, Field(min_length=1, max_length=200)]


class ConsentIn(_In):
    """One consent to grant: who (``actor:<id>`` or ``role:<role>``) may do what (``purpose``)
    with which data classes of a patient (``*``: every patient) from ``start`` to ``end``."""

    patient_id: Id
    grantee: Annotated[str, Field(min_length=6, max_length=200)]
    purpose: Annotated[str, Field(min_length=1, max_length=50)]
    decision: Literal["permit", "deny"] = "permit"
    data_classes: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=50)]], Field(min_length=1, max_length=20)
    ]
    start: Seconds | None = None
    end: Seconds | None = None


class GrantIn(_In):
    consents: Annotated[list[ConsentIn], Field(min_length=1, max_length=100)]

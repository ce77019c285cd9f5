"""The service's governance bodies: consent records, verification, checkpoints and maintenance
reports going out, and every request body coming in (unknown fields forbidden: a body cannot
name a principal, only the credential does)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from ... import ConsentRecord, MaintenanceReport, VerifyResult

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
    "VerifyOut",
]

Seconds = Annotated[float, Field(allow_inf_nan=False, ge=-62_135_596_800.0, le=253_402_300_799.0)]
Text = Annotated[str, Field(max_length=20_000)]
Id = Annotated[str, Field(min_length=1, max_length=200)]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ConsentOut(BaseModel):
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

    @classmethod
    def of(cls, c: ConsentRecord) -> ConsentOut:
        return cls(
            consent_id=c.consent_id,
            patient_id=c.patient_id,
            grantee=c.grantee,
            purpose=c.purpose,
            decision=c.decision,
            data_classes=list(c.data_classes),
            start=c.start,
            end=c.end,
            created_at=c.created_at,
            revoked_at=c.revoked_at,
        )


class VerifyOut(BaseModel):
    ok: bool
    count: int
    head_hash: str
    first_bad_seq: int | None
    reason: str

    @classmethod
    def of(cls, v: VerifyResult) -> VerifyOut:
        return cls(ok=v.ok, count=v.count, head_hash=v.head_hash, first_bad_seq=v.first_bad_seq, reason=v.reason)


class CheckpointOut(BaseModel):
    size: int
    head: str


class CountOut(BaseModel):
    count: int


class MaintenanceOut(BaseModel):
    expired: int
    consolidated: int
    discarded: int
    anonymized: int
    retracted: int
    checkpoint: CheckpointOut | None
    notes: list[str]

    @classmethod
    def of(cls, r: MaintenanceReport) -> MaintenanceOut:
        cp = None if r.checkpoint is None else CheckpointOut(size=r.checkpoint[0], head=r.checkpoint[1])
        return cls(
            expired=r.expired,
            consolidated=r.consolidated,
            discarded=r.discarded,
            anonymized=r.anonymized,
            retracted=r.retracted,
            checkpoint=cp,
            notes=list(r.notes),
        )


class ConsolidateIn(_In):
    answer: Annotated[str, Field(min_length=1, max_length=20_000)]
    decision: Text = ""


class FeedbackIn(_In):
    accept: bool
    correction: Text = ""
    decision: Text = ""


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

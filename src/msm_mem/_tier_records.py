"""Typed records of the governed tiers: short-term items, claims, entities, relationships,
consent records and stored audit rows. Times are UTC seconds."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import NamedTuple

from ._errors import InvalidInput
from ._records import Claim, State, Vector, readonly

__all__ = [
    "AuditRow",
    "Claim",
    "ConsentRecord",
    "Entity",
    "Relationship",
    "StmChange",
    "StmItem",
    "StmPayload",
    "StmState",
    "WrappedKey",
]


class StmState(StrEnum):
    """Lifecycle of a short-term item."""

    ACTIVE = "active"
    CONSOLIDATED = "consolidated"
    EXPIRED = "expired"
    DISCARDED = "discarded"


_PAYLOAD_TEXT = ("question", "media_path", "visual_tag", "study_id", "media_description")


@dataclass(frozen=True, slots=True)
class StmPayload:
    """What a short-term item holds (PHI; stored encrypted as one JSON text).

    ``timestamp`` is the study's UTC time in seconds. ``answer`` is None until the turn answered
    and the gate held the item (a later critic or the age sweep consolidates it with it).
    """

    question: str
    timestamp: float
    media_path: str = ""
    visual_tag: str = ""
    study_id: str = ""
    media_description: str = ""
    answer: str | None = None
    decision: str = ""

    def __post_init__(self) -> None:
        for name in _PAYLOAD_TEXT + ("decision",):
            if not isinstance(getattr(self, name), str):
                raise InvalidInput(f"short-term payload field {name} must be text")
        if self.answer is not None and not isinstance(self.answer, str):
            raise InvalidInput("short-term payload field answer must be text or absent")
        if isinstance(self.timestamp, bool) or not isinstance(self.timestamp, (int, float)):
            raise InvalidInput("short-term payload timestamp must be a number of UTC seconds")
        if not math.isfinite(self.timestamp):
            raise InvalidInput("short-term payload timestamp must be finite")

    def answered(self, answer: str, decision: str = "") -> StmPayload:
        """The same payload holding the turn's answer and decision."""
        return replace(self, answer=answer, decision=decision)

    def to_json(self) -> str:
        """The stored form (the keys of the format before the typed record, in its order)."""
        data: dict[str, object] = {"question": self.question, "timestamp": self.timestamp}
        data.update({name: getattr(self, name) for name in _PAYLOAD_TEXT[1:]})
        if self.answer is not None:
            data.update(answer=self.answer, decision=self.decision)
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> StmPayload:
        """Parse the stored form; InvalidInput for anything that is not one."""
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise InvalidInput(f"short-term payload is not JSON: {exc}") from None
        if not isinstance(data, dict) or "question" not in data or "timestamp" not in data:
            raise InvalidInput("short-term payload needs a question and a timestamp")
        unknown = sorted(set(data) - {*_PAYLOAD_TEXT, "timestamp", "answer", "decision"})
        if unknown:
            raise InvalidInput(f"short-term payload has unknown fields {unknown}")
        return cls(**data)


@dataclass(frozen=True, slots=True)
class StmItem:
    """One working item of a turn, scoped to a patient, alive until ``expires_at``.

    ``payload`` is the typed content (PHI), None once forgotten (consolidated, expired or
    discarded); ``z`` the image embedding of the turn, when there is one.
    """

    item_id: str
    patient_id: str
    kind: str
    payload: StmPayload | None
    created_at: float
    expires_at: float
    z: Vector | None = None
    state: StmState = StmState.ACTIVE
    actor: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "z", readonly(self.z))
        if self.payload is not None and not isinstance(self.payload, StmPayload):
            raise InvalidInput(f"a short-term payload is a StmPayload, got {type(self.payload).__name__}")
        if not self.patient_id:
            raise InvalidInput("a short-term item needs a patient scope")
        if not self.expires_at > self.created_at:
            raise InvalidInput("expires_at must be later than created_at")


@dataclass(frozen=True, slots=True)
class StmChange:
    """Flip a short-term item's state (``expect`` must match) or refresh its TTL.

    ``purge`` blanks the payload and embedding (forgetting on expiry or discard); ``payload``
    replaces the content of an item that stays active (a held item recording its answer).
    """

    item_id: str
    expect: StmState
    to: StmState
    expires_at: float | None = None
    purge: bool = False
    payload: StmPayload | None = None


@dataclass(frozen=True, slots=True)
class Entity:
    """A named thing a patient's claims refer to (finding, device, anatomy, drug)."""

    entity_id: str
    patient_id: str
    type: str
    name: str
    created_at: float
    state: State = State.ACTIVE


@dataclass(frozen=True, slots=True)
class Relationship:
    """A typed edge between two entities or claims of one patient."""

    relationship_id: str
    patient_id: str
    source_id: str
    target_id: str
    type: str
    created_at: float
    state: State = State.ACTIVE


@dataclass(frozen=True, slots=True)
class ConsentRecord:
    """A FHIR-like consent: who (``grantee``: ``actor:<id>`` or ``role:<role>``) may do what
    (``purpose``) with which ``data_classes`` of a patient (``*`` = any patient) in a period.

    ``decision`` is ``permit`` or ``deny``; deny wins over permit; no match means denied.
    """

    consent_id: str
    patient_id: str
    grantee: str
    purpose: str
    decision: str
    data_classes: tuple[str, ...]
    start: float
    end: float | None = None
    created_at: float = 0.0
    revoked_at: float | None = None

    def __post_init__(self) -> None:
        if self.decision not in ("permit", "deny"):
            raise InvalidInput(f"consent decision must be permit or deny, got {self.decision!r}")
        if not (self.grantee.startswith("actor:") or self.grantee.startswith("role:")) or len(self.grantee) < 6:
            raise InvalidInput(f"consent grantee must be actor:<id> or role:<role>, got {self.grantee!r}")
        if not self.purpose or not self.patient_id:
            raise InvalidInput("consent needs a patient (or *) and a purpose")
        if not self.data_classes:
            raise InvalidInput("consent needs at least one data class (or *)")
        if self.end is not None and self.end <= self.start:
            raise InvalidInput("consent period must end after it starts")

    def active_at(self, when: float) -> bool:
        """Whether the consent is in force at ``when`` (inside its period and not revoked)."""
        if self.revoked_at is not None and self.revoked_at <= when:
            return False
        return self.start <= when and (self.end is None or when < self.end)


class AuditRow(NamedTuple):
    """One stored audit event: canonical payload bytes (without its hash) and its SHA-256.

    A named tuple, so rows stream into the verifiers without conversion."""

    seq: int
    payload: bytes
    event_hash: str


@dataclass(frozen=True, slots=True)
class WrappedKey:
    """One patient's data key as stored: wrapped under a KEK, or a shredded tombstone.

    ``key_id`` is random (never derived from patient data); ``patient_ref`` is the patient's
    identifier as the caller gave it; ``created_at`` is UTC seconds; a shredded key has
    ``shredded=True`` and empty ``wrapped`` bytes.
    """

    key_id: str
    patient_ref: str
    kek_id: str
    wrapped: bytes
    created_at: float
    shredded: bool = False

"""Row <-> record conversion of the governed tiers (short-term items, claims, graph, consent),
shared by the SQL stores."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._records import State
from .._tier_records import Claim, ConsentRecord, Entity, Relationship, StmItem, StmPayload, StmState, WrappedKey
from .codec import SHREDDED, FieldCodec

__all__ = [
    "claim_from_row",
    "claim_to_row",
    "consent_from_row",
    "consent_to_row",
    "entity_from_row",
    "entity_to_row",
    "relationship_from_row",
    "relationship_to_row",
    "stm_from_row",
    "stm_to_row",
    "wrapped_key_from_row",
]


def stm_to_row(s: StmItem, codec: FieldCodec) -> tuple[Any, ...]:
    return (
        s.item_id,
        s.patient_id,
        s.kind,
        "" if s.payload is None else codec.encode("stm", s.item_id, "payload", s.patient_id, s.payload.to_json()),
        None if s.z is None else s.z.tobytes(),
        s.created_at,
        s.expires_at,
        s.state.value,
        s.actor,
    )


def stm_from_row(r: Sequence[Any], codec: FieldCodec) -> StmItem:
    text = "" if r[3] == "" else codec.decode("stm", r[0], "payload", r[1], r[3])
    payload = None if text in ("", SHREDDED) else StmPayload.from_json(text)
    z = None if r[4] is None else np.frombuffer(bytes(r[4]), dtype=np.float32).copy()
    return StmItem(
        item_id=r[0],
        patient_id=r[1],
        kind=r[2],
        payload=payload,
        z=z,
        created_at=r[5],
        expires_at=r[6],
        state=StmState(r[7]),
        actor=r[8],
    )


def claim_to_row(c: Claim, codec: FieldCodec) -> tuple[Any, ...]:
    def enc(n: str, v: str) -> str:
        return codec.encode("claims", c.claim_id, n, c.patient_id, v)

    return (
        c.claim_id,
        c.patient_id,
        c.key,
        enc("content", c.content),
        enc("source", c.source),
        c.confidence,
        c.evidence_tier,
        c.state.value,
        c.supersedes,
        c.created_at,
        c.decay_at,
    )


def claim_from_row(r: Sequence[Any], codec: FieldCodec) -> Claim:
    def dec(n: str, v: str) -> str:
        return codec.decode("claims", r[0], n, r[1], v)

    return Claim(
        claim_id=r[0],
        patient_id=r[1],
        key=r[2],
        content=dec("content", r[3]),
        source=dec("source", r[4]),
        confidence=r[5],
        evidence_tier=r[6],
        state=State(r[7]),
        supersedes=r[8],
        created_at=r[9],
        decay_at=r[10],
    )


def entity_to_row(e: Entity, codec: FieldCodec) -> tuple[Any, ...]:
    name = codec.encode("entities", e.entity_id, "name", e.patient_id, e.name)
    return (e.entity_id, e.patient_id, e.type, name, e.created_at, e.state.value)


def entity_from_row(r: Sequence[Any], codec: FieldCodec) -> Entity:
    return Entity(r[0], r[1], r[2], codec.decode("entities", r[0], "name", r[1], r[3]), r[4], State(r[5]))


def relationship_from_row(r: Sequence[Any]) -> Relationship:
    return Relationship(r[0], r[1], r[2], r[3], r[4], r[5], State(r[6]))


def relationship_to_row(r: Relationship) -> tuple[Any, ...]:
    return (r.relationship_id, r.patient_id, r.source_id, r.target_id, r.type, r.created_at, r.state.value)


def consent_to_row(c: ConsentRecord) -> tuple[Any, ...]:
    return (
        c.consent_id,
        c.patient_id,
        c.grantee,
        c.purpose,
        c.decision,
        json.dumps(list(c.data_classes)),
        c.start,
        c.end,
        c.created_at,
        c.revoked_at,
    )


def consent_from_row(r: Sequence[Any]) -> ConsentRecord:
    return ConsentRecord(
        consent_id=r[0],
        patient_id=r[1],
        grantee=r[2],
        purpose=r[3],
        decision=r[4],
        data_classes=tuple(json.loads(r[5])),
        start=r[6],
        end=r[7],
        created_at=r[8],
        revoked_at=r[9],
    )


def wrapped_key_from_row(r: Sequence[Any]) -> WrappedKey:
    """A row of the ``keys`` table (both stores' key tables read it the same way)."""
    return WrappedKey(
        key_id=r[0], patient_ref=r[1], kek_id=r[2], wrapped=bytes(r[3]), created_at=r[4], shredded=bool(r[5])
    )

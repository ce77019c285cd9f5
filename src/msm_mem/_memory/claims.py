"""Claims and the knowledge graph derived from them: one claim per question about a study
(:func:`~msm_mem._memory.claim_evidence.claim_key`), superseded by each new answer the gate
lets into long-term memory or verdict on that question, and the finding entities and
relationships the labeler reads in it.

A superseded claim takes its derivations with it: its relationships are superseded, and a
finding entity that no active claim refers to any more is superseded too (a corrected finding
leaves no active trace in the graph)."""

from __future__ import annotations

import json

from .._records import State, new_id
from .._storage.base import StateChange, Store, WriteBatch
from .._tier_records import Claim, Entity, Relationship
from .claim_evidence import claim_key
from .labeler import label
from .msm import Interaction

__all__ = ["link_findings", "retire_findings", "stage_study_claim"]


_LINKS = {1: "asserts", -1: "suggests", 0: "negates"}


def link_findings(store: Store, batch: WriteBatch, claim: Claim) -> None:
    """Derive entities and relationships from a claim: every observation the rule-based
    labeler finds in its content (positive, uncertain or negated) becomes the patient's
    ``finding`` entity (created once), linked from the claim by ``asserts``, ``suggests`` or
    ``negates``."""
    labels = {name: v for name, v in label(claim.content).items() if v is not None and name != "No Finding"}
    if not labels:
        return
    known = {e.name: e.entity_id for e in store.entities(claim.patient_id) if e.type == "finding"}
    known.update({e.name: e.entity_id for e in batch.entities if e.patient_id == claim.patient_id})
    for name, value in sorted(labels.items()):
        if name not in known:
            entity = Entity(new_id("N"), claim.patient_id, "finding", name, claim.created_at)
            batch.entities.append(entity)
            known[name] = entity.entity_id
        batch.relationships.append(
            Relationship(new_id("R"), claim.patient_id, claim.claim_id, known[name], _LINKS[value], claim.created_at)
        )


def retire_findings(store: Store, batch: WriteBatch, patient_id: str, superseded: str) -> list[str]:
    """Stage the supersession of the relationships of the claim ``superseded`` and of the
    patient's finding entities no remaining relationship (stored and active, or new in
    ``batch``) points at; call it after the new claim's :func:`link_findings`. Returns the ids."""
    rels = store.relationships(patient_id)
    gone = [r for r in rels if r.source_id == superseded]
    ids = []
    for r in gone:
        batch.changes.append(StateChange("relationships", r.relationship_id, State.ACTIVE, State.SUPERSEDED))
        ids.append(r.relationship_id)
    retired = {r.relationship_id for r in gone} | {c.record_id for c in batch.changes if c.table == "relationships"}
    alive = {r.target_id for r in rels if r.relationship_id not in retired}
    alive |= {r.target_id for r in batch.relationships if r.patient_id == patient_id}
    for e in store.entities(patient_id):
        if e.entity_id not in alive and any(r.target_id == e.entity_id for r in gone):
            batch.changes.append(StateChange("entities", e.entity_id, State.ACTIVE, State.SUPERSEDED))
            ids.append(e.entity_id)
    return ids


def stage_study_claim(
    store: Store, batch: WriteBatch, it: Interaction, item_id: str, episode_id: str | None, now: float
) -> Claim:
    """Stage the claim of ``it``'s answer to its question about its study (the STM item's id
    stands for the study when it has none), superseding the claim of the same question active
    in ``batch`` or in the store, and link its findings."""
    key = claim_key(it.study_id or item_id, it.question)
    current = next(
        (
            c
            for c in batch.claims
            if c.patient_id == it.patient_id
            and c.key == key
            and not any(n.supersedes == c.claim_id for n in batch.claims)
        ),
        None,
    )
    if current is None:
        active = store.claims_active(it.patient_id, key)
        current = active[0] if active else None
    provenance = {"by": it.source, "stm": item_id, "episode": episode_id or "", "time": it.timestamp}
    claim = Claim(
        new_id("C"),
        it.patient_id,
        key,
        it.answer,
        json.dumps(provenance),
        it.confidence,
        it.evidence_tier,
        now,
        None,  # decided at sweep time from the patient's last activity (ranking.decay_at)
        supersedes=current.claim_id if current else None,
    )
    batch.claims.append(claim)
    link_findings(store, batch, claim)
    if current is not None:
        retire_findings(store, batch, it.patient_id, current.claim_id)
    return claim

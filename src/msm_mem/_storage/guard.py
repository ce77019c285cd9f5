"""The transition table, enforced at the storage layer: what a batch may not do.

The governance layer checks every move before it stages anything; this module checks the
staged batch again at the store, before anything is written, so a caller that reaches the
store directly still cannot make one of the seed's illegal moves:

- an in-place rewrite of long-term content: every :class:`StateChange` must be one of
  :data:`~msm_mem._transitions.LTM_STATE_CHANGES` (no ``active -> active``), and a
  supersession keeps the old version as it was (no fields, id or patient rewritten);
- a write that skips its originating tier: a new long-term row is stored ACTIVE (a later
  version of a semantic state or claim may be marked superseded by the store itself), and an
  episode or visual record that supersedes another comes with that record's flip to SUPERSEDED;
- an STM move the table does not list (:data:`~msm_mem._transitions.STM_STATE_CHANGES`); an
  :class:`~msm_mem._tier_records.StmChange` names no patient, so it cannot move an item to
  another patient's scope, and a new item cannot take an existing item's id;
- anything written from the audit tier: audit rows only continue the chain (see the store's
  write), no state change names the audit table, and only the retention purge deletes rows.

Restoring a backup or an export (``WriteBatch.restore``) stores rows exactly as given.
"""

from __future__ import annotations

from .._errors import IllegalTransition, InvalidInput
from .._records import State
from .._tier_records import StmState
from .._transitions import LTM_STATE_CHANGES, STM_STATE_CHANGES
from .batch import StateChange, WriteBatch

__all__ = ["CHANGEABLE", "check_batch"]

#: the tables whose records a StateChange may flip
CHANGEABLE = frozenset({"episodic", "visual", "semantic", "claims", "entities", "relationships"})


def _check_change(c: StateChange) -> None:
    table: str = c.table  # a caller outside the types may name any table
    if table not in CHANGEABLE:
        if table == "audit":
            raise IllegalTransition("the audit tier is append-only: no state change may name it")
        raise InvalidInput(f"unknown table {c.table!r}")
    if (c.expect, c.to) not in LTM_STATE_CHANGES:
        what = "an in-place rewrite of long-term content" if c.expect == c.to else "not a legal state change"
        raise IllegalTransition(
            f"{c.table} record {c.record_id!r}: {c.expect.value} -> {c.to.value} is {what} (supersede it instead)"
        )
    if c.to == State.SUPERSEDED and (c.fields or c.new_id is not None or c.new_patient_id is not None):
        raise IllegalTransition(f"{c.table} record {c.record_id!r}: a superseded version keeps its content")


def check_batch(batch: WriteBatch) -> None:
    """Raise :class:`IllegalTransition` (or InvalidInput for an unknown table) when the batch
    holds a move the transition table does not allow; the store then writes nothing."""
    for c in batch.changes:
        _check_change(c)
    for s in batch.stm_changes:
        if (s.expect, s.to) not in STM_STATE_CHANGES:
            raise IllegalTransition(f"short-term item {s.item_id!r}: {s.expect.value} -> {s.to.value} is not legal")
        if s.payload is not None and (s.purge or s.to != StmState.ACTIVE):
            raise IllegalTransition(f"short-term item {s.item_id!r}: new content only for an item that stays active")
    if batch.restore:
        return
    for item in batch.stm:
        if item.state != StmState.ACTIVE:
            raise IllegalTransition(f"short-term item {item.item_id!r} must arrive active, not {item.state.value}")
    new_rows = [
        *(("episodic", e.episode_id, e.state) for e in batch.episodes),
        *(("visual", v.visual_id, v.state) for v in batch.visuals),
        *(("semantic", s.state_id, s.state) for s in batch.semantic),
        *(("claims", c.claim_id, c.state) for c in batch.claims),
        *(("entities", e.entity_id, e.state) for e in batch.entities),
        *(("relationships", r.relationship_id, r.state) for r in batch.relationships),
    ]
    for table, rid, state in new_rows:
        if state != State.ACTIVE:
            raise IllegalTransition(f"a new {table} record ({rid!r}) is stored active, not {state.value}")
    flipped = {(c.table, c.record_id) for c in batch.changes if (c.expect, c.to) == (State.ACTIVE, State.SUPERSEDED)}
    for table, rid, old in (
        *(("episodic", e.episode_id, e.supersedes) for e in batch.episodes),
        *(("visual", v.visual_id, v.supersedes) for v in batch.visuals),
    ):
        if old is not None and (table, old) not in flipped:
            raise IllegalTransition(f"{table} record {rid!r} supersedes {old!r} without flipping it to superseded")

"""The storage layer refuses what the transition table refuses: the seed's four illegal moves
fail at Store.write on every backend, with nothing of the batch written."""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np
import pytest

from msm_mem import (
    EpisodicRecord,
    IllegalTransition,
    Impression,
    SemanticState,
    State,
    StmPayload,
    WriteConflict,
)
from msm_mem._storage.base import Audit, StateChange, Store, WriteBatch
from msm_mem._tier_records import AuditRow, Claim, StmChange, StmItem, StmState
from msm_mem._transitions import LTM_STATE_CHANGES, STM_STATE_CHANGES
from tests.conftest import random_unit


def episode(i: int, patient: str = "p", **kw: object) -> EpisodicRecord:
    z = random_unit(np.random.default_rng(i))
    return EpisodicRecord(f"E-{i}", patient, 1e9 + i, z, "q?", f"answer {i}", **kw)  # type: ignore[arg-type]


def claim(cid: str, supersedes: str | None = None) -> Claim:
    return Claim(cid, "p", "finding", f"content of {cid}", "agent", 0.5, "agent", 1.0, supersedes=supersedes)


def item(i: int, patient: str = "p") -> StmItem:
    return StmItem(f"M-{i}", patient, "interaction", StmPayload("q", 100.0), 100.0, 150.0)


def audit_row(seq: int, payload: bytes = b"event") -> AuditRow:
    return AuditRow(seq, payload, f"{seq:064x}")


def snapshot(store: Store) -> tuple[object, ...]:
    """Everything a refused batch could have touched."""
    return (
        [(e.episode_id, e.state, e.answer) for e in store.iter_episodes()],
        [(c.claim_id, c.state, c.content) for c in store.claim_history("p", "finding")],
        [(s.state_id, s.state) for s in store.iter_semantic()],
        [(m.item_id, m.patient_id, m.state) for m in store.stm_list()],
        list(store.iter_audit()),
        store.audit_head(),
    )


def seeded(store: Store) -> Store:
    store.write(
        WriteBatch(
            episodes=[episode(1)],
            claims=[claim("C-1")],
            semantic=[SemanticState("S-1", "p", "impression", (Impression(1e9, "first"),))],
            stm=[item(1)],
            audit=[audit_row(1), audit_row(2)],
        )
    )
    return store


def refused(
    store: Store, batch: WriteBatch, error: type[Exception] = IllegalTransition, match: str | None = None
) -> None:
    """The batch raises ``error`` and leaves the store exactly as it was."""
    before = snapshot(store)
    with pytest.raises(error, match=match):
        store.write(batch)
    assert snapshot(store) == before


# 1. an in-place rewrite of long-term content ----------------------------------------------


@pytest.mark.parametrize("table, rid", [("episodic", "E-1"), ("claims", "C-1"), ("semantic", "S-1")])
def test_an_active_to_active_change_is_refused(store: Store, table: str, rid: str) -> None:
    """ACTIVE -> ACTIVE (with or without new content) is an in-place rewrite: refused, batch and all."""
    seeded(store)
    content = {"episodic": ("answer", "rewritten"), "claims": ("content", "rewritten"), "semantic": ("impressions", "")}
    for given in ((), (content[table],)):
        change = StateChange(table, rid, State.ACTIVE, State.ACTIVE, fields=given)  # type: ignore[arg-type]
        refused(store, WriteBatch(changes=[change], episodes=[episode(2)], stm=[item(2)]), match="in-place rewrite")


def test_only_the_table_s_state_changes_are_applied(store: Store) -> None:
    """Every (expect, to) outside LTM_STATE_CHANGES is refused; resurrection above all."""
    seeded(store)
    illegal = [(a, b) for a in State for b in State if (a, b) not in LTM_STATE_CHANGES]
    assert (State.RETRACTED, State.ACTIVE) in illegal and (State.SUPERSEDED, State.ACTIVE) in illegal
    for expect, to in illegal:
        refused(store, WriteBatch(changes=[StateChange("episodic", "E-1", expect, to)]), match="E-1")


# 2. a write that skips its originating tier -----------------------------------------------


def test_a_supersession_keeps_the_old_version_as_it_was(store: Store) -> None:
    """Flipping a record to SUPERSEDED while changing its content (or ids) is refused."""
    seeded(store)
    for kw in ({"fields": (("answer", "rewritten"),)}, {"new_id": "E-9"}, {"new_patient_id": ""}):
        change = StateChange("episodic", "E-1", State.ACTIVE, State.SUPERSEDED, **kw)  # type: ignore[arg-type]
        refused(store, WriteBatch(changes=[change], episodes=[episode(2, supersedes="E-1")]), match="keeps its content")
    store.write(
        WriteBatch(
            changes=[StateChange("episodic", "E-1", State.ACTIVE, State.SUPERSEDED)],
            episodes=[episode(2, supersedes="E-1")],
        )
    )
    assert [(e.episode_id, e.state, e.answer) for e in store.iter_episodes()] == [
        ("E-1", State.SUPERSEDED, "answer 1"),
        ("E-2", State.ACTIVE, "answer 2"),
    ]


def test_a_correction_must_supersede_what_it_corrects(store: Store) -> None:
    """An episode naming a predecessor without flipping it, or a second active claim, is refused."""
    seeded(store)
    refused(store, WriteBatch(episodes=[episode(2, supersedes="E-1")]), match="without flipping")
    refused(store, WriteBatch(claims=[claim("C-2")]), match="must supersede")
    store.write(WriteBatch(claims=[claim("C-2", supersedes="C-1")]))
    assert [c.claim_id for c in store.claims_active("p")] == ["C-2"]


@pytest.mark.parametrize("state", [State.SUPERSEDED, State.ANONYMIZED, State.RETRACTED])
def test_new_long_term_rows_arrive_active(store: Store, state: State) -> None:
    """A new record stored in any other state than ACTIVE is refused; a restore stores it as given."""
    seeded(store)
    refused(store, WriteBatch(episodes=[episode(2, state=state)]), match="stored active")
    refused(store, WriteBatch(claims=[replace(claim("C-2", supersedes="C-1"), state=state)]), match="stored active")
    store.write(WriteBatch(episodes=[episode(2, state=state)], restore=True))
    assert store.get_episodes(["E-2"])[0].state == state


# 3. STM -> STM across patient scope ---------------------------------------------------------


def test_a_short_term_change_cannot_name_another_patient(store: Store) -> None:
    """StmChange has no patient field; a new item cannot take another patient's item id."""
    assert "patient_id" not in {f.name for f in fields(StmChange)}
    seeded(store)
    refused(store, WriteBatch(stm=[item(1, patient="q")]), error=WriteConflict, match="stored already")
    assert [m.patient_id for m in store.stm_get(["M-1"])] == ["p"]


def test_only_the_table_s_short_term_moves_are_applied(store: Store) -> None:
    """Every STM (expect, to) outside STM_STATE_CHANGES is refused, and new items arrive active."""
    seeded(store)
    illegal = [(a, b) for a in StmState for b in StmState if (a, b) not in STM_STATE_CHANGES]
    assert (StmState.EXPIRED, StmState.ACTIVE) in illegal and (StmState.CONSOLIDATED, StmState.ACTIVE) in illegal
    for expect, to in illegal:
        refused(store, WriteBatch(stm_changes=[StmChange("M-1", expect, to)]), match="not legal")
    refused(store, WriteBatch(stm=[replace(item(2), state=StmState.EXPIRED)]), match="arrive active")


# 4. anything that writes from the audit tier --------------------------------------------------


def test_audit_rows_are_never_rewritten(store: Store) -> None:
    """A batch carrying an already stored seq (new payload) is refused; the stored rows stay."""
    seeded(store)
    refused(store, WriteBatch(audit=[audit_row(2, b"forged"), audit_row(3)]), match="append-only")
    refused(store, WriteBatch(audit=[audit_row(1, b"forged")], episodes=[episode(2)]), match="append-only")


def test_no_state_change_may_name_the_audit_tier(store: Store) -> None:
    """A StateChange of the audit table is refused as a write from the audit tier."""
    seeded(store)
    change = StateChange("audit", "1", State.ACTIVE, State.RETRACTED)  # type: ignore[arg-type]
    refused(store, WriteBatch(changes=[change]), match="append-only")


def test_only_the_retention_purge_removes_audit_rows(store: Store) -> None:
    """The audit protocol has no way to change a row (its reads are the number of chains, the
    heads, the base and three ways to iterate); audit_purge is the only removal."""
    assert {n for n in dir(Audit) if "audit" in n and not n.startswith("_")} == {
        "audit_base",
        "audit_chains",
        "audit_head",
        "audit_heads",
        "audit_purge",
        "iter_audit",
        "iter_audit_batches",
        "iter_audit_naming",
    }
    seeded(store)
    assert store.audit_purge(1) == 1 and [r.seq for r in store.iter_audit()] == [2]

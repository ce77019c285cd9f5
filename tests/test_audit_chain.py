"""Tests for msm_mem._governance.audit.chain: ChainBuilder makes the stored rows of new events,
each linked to the head, and refuses bad fields or heads without moving."""

from __future__ import annotations

from typing import Any

import pytest

from msm_mem._errors import InvalidInput
from msm_mem._governance.audit.chain import ChainBuilder
from msm_mem._governance.audit.event import GENESIS
from msm_mem._governance.audit.verify import verify_chain
from tests.helpers import audit_fields, audit_rows


def test_next_row_is_the_row_of_next() -> None:
    """next_row (the write path) gives exactly the stored row of next, and both advance the head."""
    a, b = ChainBuilder(), ChainBuilder()
    for i in range(3):
        assert a.next_row(**audit_fields(i)) == b.next(**audit_fields(i)).row()
    assert (a.head_seq, a.head_hash) == (b.head_seq, b.head_hash) == (3, audit_rows(3)[-1][2])
    with pytest.raises(InvalidInput):
        a.next_row(**audit_fields(3, outcome="maybe"))
    assert a.head_seq == 3


def test_builder_links_and_continues_from_head() -> None:
    """Each event links to the previous hash; a builder resumed at the head continues it."""
    builder = ChainBuilder()
    first = builder.next(**audit_fields(0))
    resumed = ChainBuilder(builder.head_seq, builder.head_hash)
    second = resumed.next(**audit_fields(1))
    assert (second.seq, second.prev_hash) == (2, first.event_hash)
    assert (resumed.head_seq, resumed.head_hash) == (2, second.event_hash)
    assert verify_chain([first.row(), second.row()]).ok


@pytest.mark.parametrize(
    "override",
    [
        {"outcome": "ok"},
        {"outcome": ["success"]},
        {"time": float("nan")},
        {"time": "now"},
        {"actor": ""},
        {"action": ""},
        {"role": 3},
        {"record_ids": "E-1"},
        {"record_ids": [1]},
        {"patient": "\ud800"},
    ],
)
def test_builder_rejects_bad_fields_without_moving(override: dict[str, Any]) -> None:
    """Invalid fields raise InvalidInput and leave the head where it was."""
    builder = ChainBuilder()
    with pytest.raises(InvalidInput):
        builder.next(**audit_fields(0, **override))
    assert (builder.head_seq, builder.head_hash) == (0, GENESIS)


@pytest.mark.parametrize(("seq", "head"), [(-1, GENESIS), (0, "a" * 64), (3, "A" * 64), (3, "0" * 63), (True, GENESIS)])
def test_builder_rejects_bad_head(seq: int, head: str) -> None:
    """A head must be a non-negative seq with a lowercase hex hash, GENESIS when empty."""
    with pytest.raises(InvalidInput):
        ChainBuilder(seq, head)


def test_a_chain_of_several_steps_over_its_residue_and_past_other_chains() -> None:
    """With step 4 a builder continues its chain's residue: from chain 2's empty head the first
    event is 6, after stored seq 30 of any chain the first of the residue above it (34), then
    4 apart; a head of another residue than an empty chain's needs GENESIS only below the step."""
    first = ChainBuilder(2, GENESIS, 4)
    assert first.next_row(**audit_fields(0))[0] == 6
    later = ChainBuilder(6, first.head_hash, 4, 30)
    seqs = [later.next_row(**audit_fields(i))[0] for i in range(3)]
    assert seqs == [34, 38, 42]
    assert ChainBuilder(42, later.head_hash, 4, 10).next_row(**audit_fields(0))[0] == 46  # after below the head
    with pytest.raises(InvalidInput):
        ChainBuilder(3, "ab" * 32, 4)  # an empty chain's head is GENESIS
    for bad in ({"step": 0}, {"after": -1}):
        with pytest.raises(InvalidInput):
            ChainBuilder(0, GENESIS, **bad)

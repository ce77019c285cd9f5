"""Tests for msm_mem._governance.audit.verify: the hash-only and the full walk over stored rows,
the first bad seq they name, and pages that verify as one walk."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from msm_mem._errors import AuditChainBroken
from msm_mem._governance.audit.chain import ChainBuilder
from msm_mem._governance.audit.event import GENESIS, Row
from msm_mem._governance.audit.verify import (
    VerifyResult,
    verify_chain,
    verify_hashes_in_batches,
    verify_hashes_only,
)
from tests.helpers import audit_fields, rehashed
from tests.strategies import audit_event_fields

Verifier = Callable[..., VerifyResult]


def verify_in_pages_of_two(rows: Iterable[Row], **start: Any) -> VerifyResult:
    """verify_hashes_in_batches with a page boundary after every second row."""
    listed = list(rows)
    return verify_hashes_in_batches([listed[i : i + 2] for i in range(0, len(listed), 2)], **start)


#: every verifier: the full one, hash-only, and hash-only over rows handed over in pages
BOTH = pytest.mark.parametrize("verify", [verify_chain, verify_hashes_only, verify_in_pages_of_two])


def chain(n: int) -> list[Row]:
    """Rows of a fresh chain of ``n`` events."""
    builder = ChainBuilder()
    return [builder.next(**audit_fields(i)).row() for i in range(n)]


@BOTH
def test_empty_and_intact_chains_verify(verify: Verifier) -> None:
    """An empty chain and an intact chain verify with the right count and head."""
    assert verify([]) == VerifyResult(True, 0, GENESIS, None, "")
    rows = chain(5)
    assert verify(rows) == VerifyResult(True, 5, rows[-1][2], None, "")


@BOTH
def test_suffix_verifies_from_a_known_head(verify: Verifier) -> None:
    """Rows from seq k verify given start_seq=k and the hash of event k-1, and only then."""
    rows = chain(6)
    assert verify(rows[3:], start_seq=4, start_prev=rows[2][2]).ok
    assert verify(rows[3:], start_seq=4).first_bad_seq == 4
    assert verify(rows[3:], start_seq=5, start_prev=rows[2][2]).first_bad_seq == 5
    renumbered = [(s + 1, p, h) for s, p, h in rows[3:]]  # columns agree with start_seq=5
    assert verify(renumbered, start_seq=5, start_prev=rows[2][2]).first_bad_seq == 5


@BOTH
@pytest.mark.parametrize(
    ("tamper", "bad_seq"),
    [
        (lambda r: r[:2] + r[3:], 3),  # delete event 3: slot 3 holds seq 4
        (lambda r: r[:-1], None),  # delete the tail: invisible without checkpoints
        (lambda r: r[:2] + [(3, r[1][1], r[1][2])] + r[2:], 3),  # insert a copy into slot 3
        (lambda r: r[:2] + [r[3], r[2]] + r[4:], 3),  # swap rows 3 and 4
        (lambda r: r[:2] + [(3, r[3][1], r[3][2]), (4, r[2][1], r[2][2])] + r[4:], 3),  # payloads
        (lambda r: r[:3] + [r[2]] + r[3:], 4),  # duplicate event 3: the copy sits in slot 4
        (lambda r: r[:2] + [(s + 1, p, h) for s, p, h in r[2:]], 3),  # gap before 3
        (lambda r: r[:2] + [(4, r[2][1], r[2][2])] + r[3:], 3),  # seq column disagrees
        (lambda r: [(s - 1, p, h) for s, p, h in r[1:]], 1),  # event 1 dropped, renumbered
        (lambda r: r[:4] + [(5, None, r[4][2])], 5),  # missing payload
    ],
)
def test_structural_tampering_names_first_bad_seq(
    verify: Verifier, tamper: Callable[[list[Row]], list[Row]], bad_seq: int | None
) -> None:
    """Delete, insert, reorder, duplicate, gap and seq mismatch name the documented seq."""
    result = verify(tamper(chain(5)))
    assert result.first_bad_seq == bad_seq
    assert result.ok is (bad_seq is None)
    if bad_seq is not None:
        assert result.count == bad_seq - 1 and result.reason.startswith(f"seq {bad_seq}:")


@BOTH
def test_forged_insert_is_caught_at_the_next_slot(verify: Verifier) -> None:
    """An inserted event with valid hash and link (a fork) is caught where the chain resumes."""
    rows = chain(4)
    fork = ChainBuilder(2, rows[1][2]).next(**audit_fields(99)).row()
    result = verify(rows[:2] + [fork] + rows[2:])
    assert result.first_bad_seq == 4 and result.head_hash == fork[2]


@BOTH
def test_memoryview_payloads_are_accepted(verify: Verifier) -> None:
    """Database drivers that return memoryview payloads verify the same."""
    rows = chain(3)
    assert verify([(s, memoryview(p), h) for s, p, h in rows]).ok


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (lambda p: p.replace(b'"reason":""', b'"reason":"","reason":""'), "duplicate"),
        (lambda p: b"{ " + p[1:], "canonical"),
        (lambda p: p[:-1] + b',"x":1}', "unknown"),
        (lambda p: p.replace(b'"success"', b'"maybe"'), "outcome"),
        (lambda p: p.replace(b'"success"', b"[]"), "outcome"),
        (lambda p: p.replace(b'"E-0001"', b'["E-0001"]'), "record_ids"),
        (lambda p: p.replace(b'"reason":""', b'"reason":"\\ud800"'), "surrogate"),
        (lambda p: p.replace(b'"seq":2', b'"seq":3'), "seq 3"),
        (lambda p: b"\xff" + p, "UTF-8"),
    ],
)
def test_full_mode_checks_schema_and_canonical_form(edit: Callable[[bytes], bytes], reason: str) -> None:
    """Rewritten payloads with matching hashes pass hash-only but fail full verification."""
    rows = chain(3)
    rows[1] = rehashed(rows[1][0], edit(rows[1][1]))
    result = verify_chain(rows[:2])
    assert (result.ok, result.first_bad_seq) == (False, 2)
    assert reason in result.reason
    assert verify_hashes_only(rows[:2]).ok


def test_raise_if_broken_carries_the_seq() -> None:
    """VerifyResult.raise_if_broken raises AuditChainBroken with first_bad_seq."""
    rows = chain(3)
    verify_chain(rows).raise_if_broken()
    with pytest.raises(AuditChainBroken) as info:
        verify_chain(rows[1:]).raise_if_broken()
    assert info.value.seq == 1


@BOTH
def test_every_single_bit_flip_is_caught_at_its_row(verify: Verifier) -> None:
    """Flipping any bit of any stored payload byte or hash character names that row's seq."""
    rows = chain(3)
    for index, (seq, payload, digest) in enumerate(rows):
        for pos in range(len(payload)):
            for bit in range(8):
                flipped = bytearray(payload)
                flipped[pos] ^= 1 << bit
                tampered = list(rows)
                tampered[index] = (seq, bytes(flipped), digest)
                assert verify(tampered).first_bad_seq == seq
        for pos in range(64):
            for bit in range(7):
                char = chr(ord(digest[pos]) ^ (1 << bit))
                tampered = list(rows)
                tampered[index] = (seq, payload, digest[:pos] + char + digest[pos + 1 :])
                assert verify(tampered).first_bad_seq == seq


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(audit_event_fields, max_size=3), min_size=1, max_size=4))
def test_chain_verifies_after_any_appends(batches: list[list[dict[str, Any]]]) -> None:
    """Appending batches through builders resumed at the stored head always verifies."""
    rows: list[Row] = []
    for batch in batches:
        builder = ChainBuilder(len(rows), rows[-1][2] if rows else GENESIS)
        rows.extend(builder.next(**f).row() for f in batch)
        assert verify_chain(rows) == verify_hashes_only(rows)
        assert verify_chain(rows).ok and verify_chain(rows).count == len(rows)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(audit_event_fields, min_size=1, max_size=5),
    st.data(),
)
def test_any_one_byte_change_fails_at_or_before_its_row(many: list[dict[str, Any]], data: st.DataObject) -> None:
    """Any one-byte change to a payload, hash or seq column fails at or before that seq."""
    builder = ChainBuilder()
    rows = [builder.next(**f).row() for f in many]
    index = data.draw(st.integers(0, len(rows) - 1))
    seq, payload, digest = rows[index]
    part = data.draw(st.sampled_from(["payload", "hash", "seq"]))
    if part == "payload":
        pos = data.draw(st.integers(0, len(payload) - 1))
        value = data.draw(st.integers(0, 255).filter(lambda b: b != payload[pos]))
        rows[index] = (seq, payload[:pos] + bytes([value]) + payload[pos + 1 :], digest)
    elif part == "hash":
        pos = data.draw(st.integers(0, 63))
        char = data.draw(st.characters(codec="ascii").filter(lambda c: c != digest[pos]))
        rows[index] = (seq, payload, digest[:pos] + char + digest[pos + 1 :])
    else:
        new_seq = data.draw(st.integers(-3, len(rows) + 3).filter(lambda s: s != seq))
        rows[index] = (new_seq, payload, digest)
        rows.sort(key=lambda row: row[0])  # what ORDER BY seq would return
    for verify in (verify_chain, verify_hashes_only):
        result = verify(rows)
        assert not result.ok
        assert result.first_bad_seq is not None and 1 <= result.first_bad_seq <= seq
    cuts = sorted(data.draw(st.sets(st.integers(0, len(rows)))))
    pages = [rows[a:b] for a, b in zip([0, *cuts], [*cuts, len(rows)], strict=True)]
    assert verify_hashes_in_batches(pages) == verify_hashes_only(rows)


def test_pages_verify_as_one_walk() -> None:
    """Pages of any sizes (empty ones too) verify like their concatenation, head and count included."""
    rows = chain(7)
    for cut in range(8):
        pages = [[], rows[:cut], [], rows[cut:]]
        assert (
            verify_hashes_in_batches(pages) == verify_hashes_only(rows) == VerifyResult(True, 7, rows[-1][2], None, "")
        )
        assert verify_hashes_in_batches(pages[1:], start_seq=1, start_prev="1" * 64).first_bad_seq == 1


def chain_of_lane(n: int, lane: int = 2, lanes: int = 4, after: tuple[int, ...] = (9, 30, 31, 60)) -> list[Row]:
    """Rows of chain ``lane`` of a store of ``lanes``: each event a write whose first seq is the
    first of the residue above a seq ``after`` others' writes left (gaps between them)."""
    rows: list[Row] = []
    seq, head = lane, GENESIS
    for i in range(n):
        builder = ChainBuilder(seq, head, lanes, after[i % len(after)] + 10 * (i // len(after)) * lanes)
        rows.append(builder.next(**audit_fields(i)).row())
        seq, head = builder.head_seq, builder.head_hash
    return rows


@BOTH
def test_a_chain_with_gaps_verifies_with_its_step(verify: Verifier) -> None:
    """A chain of one residue with gaps verifies with step 4 from its base, counting its events,
    and fails with step 1 (the seqs are not consecutive)."""
    rows = chain_of_lane(6)
    assert [s % 4 for s, _, _ in rows] == [2] * 6 and any(b[0] - a[0] > 4 for a, b in zip(rows, rows[1:], strict=False))
    assert verify(rows, start_seq=6, step=4) == VerifyResult(True, 6, rows[-1][2], None, "")
    assert not verify(rows, start_seq=6).ok


@BOTH
def test_in_a_chain_with_gaps_a_deleted_or_renumbered_event_is_named(verify: Verifier) -> None:
    """Deleting an event from the middle names the event after it (its link breaks); a seq column
    moved off its residue or below the slot names the slot; a column renumbered within its residue
    (the payload's seq differs) names the row."""
    rows = chain_of_lane(6)
    gone = rows[:2] + rows[3:]
    assert verify(gone, start_seq=6, step=4).first_bad_seq == rows[3][0]
    off = rows[:2] + [(rows[2][0] + 1, rows[2][1], rows[2][2])] + rows[3:]
    assert verify(off, start_seq=6, step=4).first_bad_seq == rows[1][0] + 4
    moved = rows[:2] + [(rows[2][0] + 4, rows[2][1], rows[2][2])] + rows[3:]
    result = verify(moved, start_seq=6, step=4)
    assert not result.ok and result.first_bad_seq == rows[2][0] + 4 and result.count == 2

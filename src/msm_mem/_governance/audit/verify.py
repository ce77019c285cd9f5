"""Verification of the audit hash chain (:mod:`.chain`): the rows, walked in the order given.

Two verifiers:

* :func:`verify_hashes_only` checks the seq column, ``sha256(payload) == event_hash`` and the
  ``seq``/``prev_hash`` links found in the payload bytes, without parsing JSON. It proves that
  no stored byte changed and no event was dropped, added or moved since it was hashed.
* :func:`verify_chain` additionally parses every payload strictly, checks the schema (exact
  fields and types) and that the payload is byte for byte its canonical payload
  (:func:`.event.canonical_payload`). It first matches each row against the canonical form
  with one pattern (:mod:`.scan`) and parses only a row the pattern does not accept;
  :mod:`.parallel` runs that pattern in worker processes.

**First bad seq.** Position ``i`` (0-based) of the walk expects the event with seq
``start_seq + i`` linking to the hash accepted at position ``i - 1``. The first position
where any check fails names ``first_bad_seq = start_seq + i``: the first seq whose slot does
not hold the event the chain requires. So a flipped byte in event k names k; a deleted
event k names k (its slot holds k+1); a gap before k names k; a duplicate of event k names
k+1 (the copy sits in slot k+1); swapped events k and k+1 name k. An inserted event names the
seq of its slot, or, if it was forged with valid hashes and links (a fork of the chain), the
slot after it. Neither verifier can see a truncated tail or a consistently recomputed chain:
that is what the signed checkpoints of :mod:`.checkpoint` are for.

**Steps.** A store with several audit chains (one per patient lane,
:mod:`msm_mem._storage.lanes`) gives chain ``c`` of ``n`` seqs of the residue ``c`` modulo
``n``, increasing, with gaps (each event takes the first seq of its residue above every seq
stored when it was written, so seqs follow the order of writing across chains). A walk of such
a chain takes ``step`` ``n``: a slot accepts the first seq of its residue at or above the one
it expects, every payload's own seq is read, and the links alone say that nothing between two
events went missing. ``first_bad_seq`` is then the seq of the row that fails (the slot's
lowest seq where the row's seq itself is wrong). With ``step`` 1 (a store of one chain) the
seqs have no gaps and every slot expects exactly its seq.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from ..._errors import AuditChainBroken, CanonicalJSONError, InvalidInput
from .event import GENESIS, HEX64, Row, field_problem, payload_bytes, strict_reason
from .scan import scan

__all__ = [
    "VerifyResult",
    "check_start",
    "fits",
    "row_problem",
    "verify_chain",
    "verify_chain_in_batches",
    "verify_hashes_in_batches",
    "verify_hashes_only",
]

_PREV_NEEDLE = b',"prev_hash":"'
_PAGE = 1000  # rows a full verification of a plain iterable takes at a time


@dataclass(frozen=True, slots=True)
class VerifyResult:
    """Outcome of a verification.

    ``count`` events (or, for checkpoints, the largest verified checkpoint size) were accepted
    and ``head_hash`` is the hash of the last one accepted (the start hash if none).
    ``first_bad_seq`` is None when ``ok``; see the module docstring for its meaning.
    ``reason`` is empty when ``ok``.
    """

    ok: bool
    count: int
    head_hash: str
    first_bad_seq: int | None
    reason: str

    def raise_if_broken(self) -> None:
        """Raise :class:`AuditChainBroken` (``seq`` = ``first_bad_seq``) unless ``ok``."""
        if not self.ok:
            raise AuditChainBroken(self.reason, seq=self.first_bad_seq)


def check_start(start_seq: int, start_prev: str, step: int = 1) -> None:
    """Refuse a walk that does not start at a seq >= 1 after a 64-hex-digit hash, or whose
    step is not an integer >= 1."""
    if type(start_seq) is not int or start_seq < 1:
        raise InvalidInput(f"start_seq {start_seq!r} is not an integer >= 1")
    if type(step) is not int or step < 1:
        raise InvalidInput(f"step {step!r} is not an integer >= 1")
    if not isinstance(start_prev, str) or HEX64.fullmatch(start_prev) is None:
        raise InvalidInput("start_prev is not 64 lowercase hex digits")


def _bad(count: int, head: str, seq: int, reason: str) -> VerifyResult:
    return VerifyResult(False, count, head, seq, f"seq {seq}: {reason}")


def _bad_at(start_seq: int, seq: int, head: str, reason: str, count: int | None = None) -> VerifyResult:
    """:func:`_bad` for a walk from ``start_seq`` that accepted every event before ``seq``
    (``count`` of them; by default ``seq - start_seq``, a walk without gaps)."""
    return _bad(seq - start_seq if count is None else count, head, seq, reason)


def fits(seq: object, expected: int, step: int) -> bool:
    """Whether the seq column ``seq`` may fill the slot that expects ``expected``: exactly it
    with ``step`` 1, else any seq of its residue modulo ``step`` at or above it."""
    if type(seq) is not int:
        return False
    if step == 1:
        return seq == expected
    return seq >= expected and (seq - expected) % step == 0


def verify_hashes_only(
    rows: Iterable[Row], *, start_seq: int = 1, start_prev: str = GENESIS, step: int = 1
) -> VerifyResult:
    """Check seq column, payload hash and links of ``rows`` without parsing JSON.

    ``rows`` are ``(seq, payload, event_hash)`` in ``seq`` order, starting at ``start_seq``
    whose ``prev_hash`` must be ``start_prev``. The link is read after the first
    ``,"prev_hash":"`` in the payload: in canonical JSON every ``"`` inside a string is
    escaped, so that needle can only be an object key. Only the first payload's own ``seq``
    is read: by induction from it, each accepted link pins the next slot to the one event
    that was hashed after its predecessor, whose seq is the slot's. Use :func:`verify_chain`
    to also prove schema, every seq field and canonical form.
    """
    return verify_hashes_in_batches((rows,), start_seq=start_seq, start_prev=start_prev, step=step)


def verify_hashes_in_batches(
    batches: Iterable[Iterable[Row]], *, start_seq: int = 1, start_prev: str = GENESIS, step: int = 1
) -> VerifyResult:
    """:func:`verify_hashes_only` of the rows of ``batches`` taken one after the other.

    For rows read from a store a page at a time (``Store.iter_audit_batches``): the rows go
    straight from each page into the hash loop, with no generator or record per row between
    them. Same checks, same result and same ``first_bad_seq`` as :func:`verify_hashes_only`
    over the concatenated rows.
    """
    check_start(start_seq, start_prev, step)
    sha256 = hashlib.sha256
    needle = _PREV_NEEDLE
    expected = start_seq
    count = 0
    head = start_prev
    prev = (start_prev + '"').encode("ascii")
    for rows in batches:
        for seq, payload, stored in rows:
            at_seq = seq if step > 1 and fits(seq, expected, step) else expected
            if type(payload) is not bytes:
                if payload is None:
                    return _bad_at(start_seq, at_seq, head, "payload is missing", count)
                payload = bytes(payload)
            if not fits(seq, expected, step):
                return _bad_at(start_seq, expected, head, f"slot holds seq column {seq!r}", count)
            digest = sha256(payload).hexdigest()
            if digest != stored:
                return _bad_at(start_seq, seq, head, "payload does not match its event_hash", count)
            at = payload.find(needle)
            if at < 0 or not payload.startswith(prev, at + 14):
                return _bad_at(start_seq, seq, head, "prev_hash does not link to the previous event", count)
            if (step > 1 or expected == start_seq) and b',"seq":%d,' % seq not in payload:
                # The base of the induction in the docstring: the first payload's own seq
                # (every one in a chain with gaps, where the links do not fix the seqs).
                return _bad_at(start_seq, seq, head, "payload seq disagrees with the seq column", count)
            head = digest
            prev = (digest + '"').encode("ascii")
            expected = seq + step
            count += 1
    return VerifyResult(True, count, head, None, "")


def verify_chain(rows: Iterable[Row], *, start_seq: int = 1, start_prev: str = GENESIS, step: int = 1) -> VerifyResult:
    """Fully verify ``rows`` (``(seq, payload, event_hash)`` in ``seq`` order).

    Every check of :func:`verify_hashes_only`, plus: each payload parses as strict JSON, has
    exactly :data:`PAYLOAD_FIELDS` with valid types, its ``seq`` and ``prev_hash`` fields
    continue the chain, and it equals its own canonical form byte for byte.
    """
    return verify_chain_in_batches(_pages(rows), start_seq=start_seq, start_prev=start_prev, step=step)


def _pages(rows: Iterable[Row]) -> Iterator[list[Row]]:
    it = iter(rows)
    while page := list(itertools.islice(it, _PAGE)):
        yield page


def verify_chain_in_batches(
    batches: Iterable[Sequence[Row]], *, start_seq: int = 1, start_prev: str = GENESIS, step: int = 1
) -> VerifyResult:
    """:func:`verify_chain` of the rows of ``batches`` taken one after the other (pages of a store).

    Each row first takes the fast path (:func:`~.scan.scan`: one pattern match instead of
    parsing and serialising again); a row it does not accept gets the full check, which accepts
    it or names the reason, so the result is the full check's.
    """
    check_start(start_seq, start_prev, step)
    expected = start_seq
    count = 0
    head = start_prev
    for rows in batches:
        at, end = 0, len(rows)
        while at < end:
            accepted, _, head, after = scan(rows, at, expected, head, step)
            at += accepted
            count += accepted
            expected = after
            if at < end:
                problem, digest = row_problem(rows[at], expected, head, step)
                if problem is not None:
                    seq = rows[at][0]
                    where = seq if step > 1 and fits(seq, expected, step) else expected
                    return _bad_at(start_seq, where, head, problem, count)
                head = digest
                expected = rows[at][0] + step
                at += 1
                count += 1
    return VerifyResult(True, count, head, None, "")


def row_problem(row: Row, expected: int, head: str, step: int = 1) -> tuple[str | None, str]:
    """The full check of one row in slot ``expected`` (see :func:`fits`) after the hash ``head``:
    why it is not the event the chain requires (None if it is), and its hash."""
    seq, payload, stored = row
    if type(payload) is not bytes:
        if payload is None:
            return "payload is missing", ""
        payload = bytes(payload)
    if not fits(seq, expected, step):
        return f"slot holds seq column {seq!r}", ""
    digest = hashlib.sha256(payload).hexdigest()
    if digest != stored:
        return "payload does not match its event_hash", digest
    # Plain json.loads is enough: a payload equal to the canonical form of what it
    # parses to cannot hold duplicate keys, NaN, big integers or lone surrogates, since
    # canonicalisation never emits them; loads_strict only explains a failure.
    try:
        d = json.loads(payload.decode("utf-8"))
    except (ValueError, RecursionError):
        return strict_reason(payload), digest
    problem = field_problem(d)
    if problem is not None:
        return problem, digest
    if d["seq"] != seq:
        return f"payload seq {d['seq']} disagrees", digest
    if d["prev_hash"] != head:
        return "prev_hash does not link to the previous event", digest
    try:
        canonical = payload_bytes(d)
    except CanonicalJSONError as exc:
        return f"payload cannot be canonicalised: {exc}", digest
    if canonical != payload:
        return strict_reason(payload), digest
    return None, digest

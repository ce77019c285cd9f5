"""Whether the stored audit chain is the one its signed checkpoints describe.

After the hash walk of :mod:`.verify` has accepted the stored rows (each event links to
the one before it), the checkpoints say which chain that must be. One is signed at every
commit that appends audit rows, before the write is acknowledged (:class:`~.log.AuditLog`),
so every acknowledged event is covered:

* a checkpoint of more events than the store holds: the tail was truncated (first bad seq:
  the first missing one);
* a checkpoint whose head differs from the stored event at its size: events were edited and
  the chain recomputed, in the range since the previous matching checkpoint (first bad seq:
  the first of that range; with a checkpoint per commit, the range is one transaction);
* stored events past every checkpoint and past the signed head file: appended outside
  msm-mem (first bad seq: the first uncovered one), or written before per-commit checkpoints
  existed (a store made by an older version: the reason says so);
* a stored base (the chain's start after a retention purge) other than the signed one: the
  oldest events were deleted and the base forged (first bad seq: the first deleted one).

Checkpoints are read from the log, from a witness (a second copy elsewhere) and from the
signed head file; a disagreement between log and witness shows as one of them disagreeing
with the chain. Signatures are checked where a verdict rests on them: the checkpoint that
covers the head, and every checkpoint that disagrees with the chain (a forged line is named as
such rather than as a rewritten chain). Reads only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .checkpoint import Checkpoint, PublicKeyLike
from .event import GENESIS
from .verify import VerifyResult

__all__ = ["check_coverage"]


def _fail(seq: int | None, reason: str, count: int = 0, head: str = GENESIS) -> VerifyResult:
    return VerifyResult(False, count, head, seq, f"seq {seq}: {reason}" if seq is not None else reason)


def check_coverage(
    lines: Sequence[tuple[str, Checkpoint]],
    head_file: Checkpoint | None,
    public_key: PublicKeyLike,
    hashes: Mapping[int, str],
    chain: tuple[int, str],
    base: tuple[int, str],
    *,
    origin: str,
    step: int = 1,
) -> VerifyResult:
    """Check a chain of ``chain = (size, head hash)`` continuing from ``base = (seq, hash)``
    against the checkpoints ``lines`` (``(where, checkpoint)``: log and witness lines) and the
    signed ``head_file``; ``hashes[n]`` is the stored event_hash of event ``n`` for every size
    the checkpoints name that the chain holds. Call after the hash walk accepted the rows.
    ``step``: the store's number of chains; the lines and head file are then this chain's
    (its seqs ``step`` apart, its empty base ``(chain, GENESIS)``)."""
    size, head = chain
    base_seq = base[0]
    empty = (base_seq % step, GENESIS)
    ours = sorted(
        ((c.size, where, c) for where, c in lines if c.origin == origin and c.size > base_seq), key=lambda t: t[0]
    )
    matched = base_seq
    top: Checkpoint | None = None
    for at, where, c in ours:
        stored = hashes.get(at)
        if at <= size and stored == c.head_hash:
            matched, top = at, c
            continue
        if not c.verify(public_key):
            return _fail(None, f"{where}: the checkpoint of size {at} has a bad signature (forged or damaged)")
        if at > size:
            return _fail(size + step, f"{where} signed {at} events; the store holds {size} (tail truncated)")
        return _fail(
            matched + step,
            f"{where}: events {matched + step}..{at} differ from the signed checkpoint (edited and rehashed)",
        )
    covering = top
    if head_file is not None and head_file.origin == origin and (head_file.size, head_file.head_hash) == chain:
        if head_file.verify(public_key):
            covering = head_file
    if size > base_seq and (covering is None or covering.size < size):
        first = (covering.size if covering is not None else base_seq) + step
        if head_file is None and all(c.base is None for _, _, c in ours):
            why = (
                "written before per-commit checkpoints (an older store): a checkpoint by an admin or auditor signs them"
            )
        else:
            why = "appended outside msm-mem"
        return _fail(first, f"events {first}..{size} are covered by no signed checkpoint ({why})")
    if covering is not None and not covering.verify(public_key):
        return _fail(None, f"the checkpoint of size {covering.size} covering the head has a bad signature")
    signed = covering.base if covering is not None else None
    if base != empty or (signed is not None and signed != base):
        if signed is None:
            return _fail(
                empty[0] + step, f"the stored chain starts after event {base_seq} but no checkpoint signs that base"
            )
        if signed != base:
            first = min(signed[0], base_seq) + step
            return _fail(first, f"the stored base (event {base_seq}) is not the signed one (event {signed[0]})")
    return VerifyResult(True, size, head, None, "")

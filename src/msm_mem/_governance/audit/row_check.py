"""Whether the governed rows are the ones the signed checkpoint of the chain head describes.

Every commit signs, with its chain head, the row digests of that commit (a keyed multiset hash
per governed table: :mod:`msm_mem._storage.row_digest`). Full verification recomputes them
from the rows and compares table by table with the checkpoint that covers the stored head:

* a table whose recomputed digest differs was changed outside msm-mem: a row's state, tier,
  confidence, supersession, version, decay time, patient or ciphertext rewritten, a row rolled
  back to an older version, deleted or inserted. The count says which of these where it can
  (fewer rows: deleted; more: inserted; as many: changed or replaced). The digest is a sum, so
  it names the table and not the row; audit events hold ids only, no after-images, so there
  is nothing to find the row by;
* stored sums (``meta``) that differ from the recomputed ones while the rows match the signed
  digests: only the running sums were edited (the next write would carry the damage forward).

Reads only.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..._storage.base import Store
from .checkpoint import Checkpoint, PublicKeyLike, TableRows
from .verify import VerifyResult

__all__ = ["check_rows", "covering", "signed_rows", "what_differs"]


def signed_rows(store: Store) -> tuple[TableRows, ...]:
    """The store's row digests as a checkpoint signs them (inside a write: that write's)."""
    return tuple((t, d.count, d.digest) for t, d in sorted(store.row_digests().items()))


def covering(
    lines: Sequence[tuple[str, Checkpoint]],
    head_file: Checkpoint | None,
    public_key: PublicKeyLike,
    chain: tuple[int, str],
    origin: str,
) -> Checkpoint | None:
    """The signed checkpoint of exactly the stored head ``chain = (size, hash)``: the head file
    when it is that one, else the last such line of the log or the witness."""
    candidates = [c for _, c in lines]
    if head_file is not None:
        candidates.append(head_file)
    for c in reversed(candidates):
        if c.origin == origin and (c.size, c.head_hash) == chain and c.verify(public_key):
            return c
    return None


def what_differs(signed: int, stored: int) -> str:
    """What a table's count of ``signed`` rows against ``stored`` ones says happened."""
    if stored < signed:
        return f"{signed} rows signed, {stored} stored: rows deleted (or changed and deleted)"
    if stored > signed:
        return f"{signed} rows signed, {stored} stored: rows inserted (or changed and inserted)"
    return (
        f"{signed} rows signed and stored: a row changed (state, tier, confidence, supersession, content) or replaced"
    )


def check_rows(store: Store, checkpoint: Checkpoint | None, chain: VerifyResult) -> VerifyResult:
    """``chain`` (an accepted chain) when the rows match the signed digests of ``checkpoint``
    (the one covering the head); otherwise a failure naming each table that differs."""
    if chain.count == 0 and checkpoint is None:
        signed: dict[str, tuple[int, str]] = {t: (0, "0" * 64) for t in store.row_digests()}
    elif checkpoint is None or checkpoint.rows is None:
        reason = (
            f"the checkpoint of the head (event {chain.count}) carries no row digests, so the rows cannot be"
            " checked (a store not yet upgraded: msm-mem store upgrade)"
        )
        return VerifyResult(False, chain.count, chain.head_hash, None, reason)
    else:
        signed = {t: (count, digest) for t, count, digest in checkpoint.rows}
    computed = store.computed_row_digests()
    bad = []
    for table in sorted(set(signed) | set(computed)):
        want = signed.get(table)
        got = computed.get(table)
        if want is None or got is None:
            bad.append(f"{table}: not in the {'checkpoint' if want is None else 'store'}")
        elif (got.count, got.digest) != want:
            bad.append(f"{table}: {what_differs(want[0], got.count)}")
    if bad:
        reason = (
            f"governed rows differ from the digests signed at event {chain.count} (changed in the database,"
            f" not through msm-mem; the digest names the table, not the row): {'; '.join(bad)}"
        )
        return VerifyResult(False, chain.count, chain.head_hash, None, reason)
    stored = store.row_digests()
    edited = sorted(t for t, d in stored.items() if t in computed and d != computed[t])
    if edited:
        reason = f"the stored row sums of {edited} were edited (the rows match the signed digests)"
        return VerifyResult(False, chain.count, chain.head_hash, None, reason)
    return chain

"""Verification of a store of several audit chains (one per patient lane,
:mod:`msm_mem._storage.lanes`): each chain walked apart, the walks side by side, then every
signed root of chain heads and each lane's row digests checked against what they walked.

Chain ``c`` of ``n`` holds seqs of the residue ``c`` modulo ``n``; every commit signs a checkpoint
of its chain's new head that also carries every chain's head as the commit saw it (the root)
and the row digests of the lanes it wrote (:class:`~.checkpoint.Checkpoint` ``chain``,
``heads``, ``lanes``). Verification:

* each chain: the hash walk from its base (a thread per chain; their reads of the database
  overlap their hashing, and with ``processes`` > 1 each walk hands its chunks to worker
  processes), then :func:`~.coverage.check_coverage` against that chain's checkpoints and its
  own signed head file;
* every root: a checkpoint that signed chain ``h`` at more events than it holds means chain
  ``h`` was truncated, one whose hash differs from the stored event there means it was
  rewritten, whichever chain's commit signed it;
* each lane's rows (full verification): the commits that write a lane hold its lock, and each
  saw every chain's head at least where the commit before left it and its own chain further,
  so of the checkpoints carrying a lane's digests the newest is the one whose heads sum
  highest; the rows recomputed must match it, and the stored sums must match the rows.

Reads only.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..._storage.base import Store
from ..._storage.row_digest import TableDigest
from .checkpoint import Checkpoint, PublicKeyLike, heads_root
from .coverage import check_coverage
from .event import GENESIS, Row
from .links import LinkScan
from .parallel import default_processes, verify_full
from .row_check import what_differs
from .verify import VerifyResult, verify_hashes_in_batches

__all__ = ["ChainWalk", "check_lane_rows", "check_roots", "walk_chains"]


@dataclass(slots=True)
class ChainWalk:
    """One chain's walk: its verdict, the events it accepted, its stored base and head, the
    stored hashes at the sizes any checkpoint names, and the pseudonyms its events name."""

    chain: int
    result: VerifyResult
    events: int
    base: tuple[int, str]
    head: tuple[int, str]
    seen: dict[int, str]
    links: LinkScan


def _walk(
    store: Store,
    c: int,
    lines: Sequence[tuple[str, Checkpoint]],
    head_file: Checkpoint | None,
    others: Sequence[Checkpoint],
    key: PublicKeyLike,
    origin: str,
    full: bool,
    processes: int | None,
) -> ChainWalk:
    n = store.audit_chains()
    base = store.audit_base(c)
    stored = store.audit_head(c)
    named = {cp.size for _, cp in lines} | {cp.heads[c][0] for cp in others if cp.heads and len(cp.heads) == n}
    if head_file is not None:
        named.add(head_file.size)
    sizes = sorted(named)
    seen: dict[int, str] = {}
    links = LinkScan()
    last = [base[0]]

    def batches() -> Iterator[list[Row]]:
        for rows in store.iter_audit_batches(base[0] + n, chain=c):
            last[0] = rows[-1][0]
            if full:
                for row in rows:
                    links.add(bytes(row[1]))
            at = 0
            for size in sizes[bisect.bisect_left(sizes, rows[0][0]) : bisect.bisect_right(sizes, rows[-1][0])]:
                while at < len(rows) and rows[at][0] < size:  # seqs ascend, with gaps
                    at += 1
                if at < len(rows) and rows[at][0] == size:
                    seen[size] = rows[at][2]
            yield rows

    start = {"start_seq": base[0] + n, "start_prev": base[1], "step": n}
    if full:
        events = (stored[0] - base[0]) // n
        result = verify_full(batches(), events=events, processes=processes, **start)  # type: ignore[arg-type]
    else:
        result = verify_hashes_in_batches(batches(), **start)  # type: ignore[arg-type]
    events = result.count
    head = (last[0] if events else base[0], result.head_hash)
    if result.ok:
        chain_file = head_file if head_file is not None and head_file.chain == c else None
        result = check_coverage(lines, chain_file, key, seen, head, base, origin=origin, step=n)
        if not result.ok and result.first_bad_seq is not None and result.first_bad_seq <= head[0]:
            # a lower bound with gaps: the chain's first stored event from there on is the one
            first = next(iter(store.iter_audit_batches(result.first_bad_seq, chain=c)), [(result.first_bad_seq,)])[0][0]
            reason = result.reason.replace(f"seq {result.first_bad_seq}:", f"seq {first}:", 1)
            reason = reason.replace(f"events {result.first_bad_seq}..", f"events {first}..", 1)
            result = VerifyResult(False, result.count, result.head_hash, int(first), reason)
    if not result.ok:
        result = VerifyResult(
            False, result.count, result.head_hash, result.first_bad_seq, f"chain {c}: {result.reason}"
        )
    return ChainWalk(c, result, events, base, head, seen, links)


def walk_chains(
    store: Store,
    lines: Sequence[tuple[str, Checkpoint]],
    head_files: Mapping[int, Checkpoint | None],
    key: PublicKeyLike,
    origin: str,
    *,
    full: bool,
    processes: int | None,
) -> list[ChainWalk]:
    """Walk every chain (side by side) and check each against its own checkpoints: the log and
    witness ``lines`` of that chain and its signed head file."""
    n = store.audit_chains()
    every = [cp for _, cp in lines if cp.origin == origin] + [h for h in head_files.values() if h is not None]
    each = processes if processes is not None else 1

    def one(c: int) -> ChainWalk:
        mine = [(w, cp) for w, cp in lines if cp.chain == c]
        return _walk(store, c, mine, head_files.get(c), every, key, origin, full, each)

    with ThreadPoolExecutor(max_workers=max(1, min(n, default_processes()))) as pool:
        return list(pool.map(one, range(n)))


def check_roots(walks: Sequence[ChainWalk], checkpoints: Sequence[Checkpoint], key: PublicKeyLike) -> VerifyResult:
    """Every chain head every checkpoint signed (its root) against the chains as walked: none
    past a chain's stored head (truncated), none whose stored hash differs (rewritten)."""
    n = len(walks)
    for cp in checkpoints:
        if cp.heads is None or len(cp.heads) != n:
            continue
        for h, (size, digest) in enumerate(cp.heads):
            walk = walks[h]
            if size <= walk.base[0] or (size <= walk.head[0] and walk.seen.get(size) == digest):
                continue
            where = f"the checkpoint of chain {cp.chain} at event {cp.size}"
            if not cp.verify(key):
                return VerifyResult(False, 0, GENESIS, None, f"{where} has a bad signature (forged or damaged)")
            if size > walk.head[0]:
                first = walk.head[0] + n
                held = walk.head[0]
                reason = f"chain {h}: {where} signed it at event {size}; the store holds it to {held} (tail truncated)"
                return VerifyResult(False, 0, GENESIS, first, f"seq {first}: {reason}")
            reason = f"chain {h}: {where} signed another event {size} (edited and rehashed)"
            return VerifyResult(False, 0, GENESIS, size, f"seq {size}: {reason}")
    heads = tuple(walk.head for walk in walks)
    total = sum(walk.events for walk in walks)
    return VerifyResult(True, total, heads_root(heads), None, "")


def _differs(signed: Mapping[str, tuple[int, str]], got: Mapping[str, TableDigest]) -> list[str]:
    bad = []
    for table in sorted(set(signed) | set(got)):
        want, have = signed.get(table), got.get(table)
        if want is None or have is None:
            bad.append(f"{table}: not in the {'checkpoint' if want is None else 'store'}")
        elif (have.count, have.digest) != want:
            bad.append(f"{table}: {what_differs(want[0], have.count)}")
    return bad


def check_lane_rows(
    store: Store,
    checkpoints: Sequence[Checkpoint],
    key: PublicKeyLike,
    origin: str,
    result: VerifyResult,
    computed: Callable[[], dict[int, dict[str, TableDigest]]] | None = None,
) -> VerifyResult:
    """``result`` (the accepted chains) when each lane's rows match the digests of the newest
    checkpoint carrying that lane, and its stored sums match its rows; else a failure naming
    the lane and tables."""
    n = store.audit_chains()
    rows = (computed or store.computed_lane_digests)()
    stored = store.lane_digests()
    # one pass over the checkpoints: of those carrying each lane, the one whose heads sum highest
    newest_of: dict[int, tuple[int, Checkpoint]] = {}
    for cp in checkpoints:
        if cp.origin != origin or not cp.lanes or cp.heads is None or len(cp.heads) != n:
            continue
        total = sum(size for size, _ in cp.heads)
        for lane, _ in cp.lanes:
            if lane not in newest_of or total > newest_of[lane][0]:
                newest_of[lane] = (total, cp)
    for lane in range(n):
        newest = newest_of[lane][1] if lane in newest_of else None
        at = newest.size if newest is not None else 0
        if newest is None:
            signed = {t: (0, "0" * 64) for t in rows[lane]}
        elif not newest.verify(key):
            signing = f"the checkpoint signing its rows (chain {newest.chain}, event {newest.size})"
            reason = f"lane {lane}: {signing} has a bad signature"
            return VerifyResult(False, result.count, result.head_hash, None, reason)
        else:
            signed = {t: (count, digest) for t, count, digest in dict(newest.lanes or ())[lane]}
        bad = _differs(signed, rows[lane])
        if bad:
            reason = (
                f"lane {lane}: governed rows differ from the digests signed at event {at} (changed in the database,"
                f" not through msm-mem; the digest names the table, not the row): {'; '.join(bad)}"
            )
            return VerifyResult(False, result.count, result.head_hash, None, reason)
        edited = sorted(t for t, d in stored[lane].items() if t in rows[lane] and d != rows[lane][t])
        if edited:
            reason = f"lane {lane}: the stored row sums of {edited} were edited (the rows match the signed digests)"
            return VerifyResult(False, result.count, result.head_hash, None, reason)
    return result

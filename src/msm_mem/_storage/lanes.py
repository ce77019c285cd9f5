"""Patient lanes: one store's patients cut into a fixed number of groups, so that writers of
patients in different lanes do not queue on one another.

A store made with ``n`` lanes (``n`` audit chains; 1 by default, and always 1 for SQLite)
gives each lane its own write lock (a ``meta`` row), its own audit chain and its own row
digests. A patient's lane is :func:`lane_of` its id, fixed for the store's life; a write locks
the lanes of every patient it touches, in lane order, and appends its audit events to the
chain of the lowest of them. Chain ``c`` holds seqs of the residue ``c`` modulo ``n``: a
write's first event takes the first such seq above every seq stored, so writers of different
lanes never pick the same seq, seqs follow the order of writing across chains, a seq names one
event of the store and :func:`chain_of` its chain; with one lane the seqs are 1, 2, 3, ... as
ever. Vector positions follow the same rule. The audit layer signs at each commit the new head
of the commit's chain, every other chain's head as the commit saw it (a root over every
chain head) and the row digests of the lanes it wrote; verification walks the chains apart,
in parallel.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .._errors import InvalidInput, StoreError, WriteConflict
from .row_digest import COLUMNS, RowDigest, TableDigest

__all__ = ["MAX_LANES", "LaneDigest", "chain_of", "check_lanes", "lane_of"]

#: the most lanes a store may have (each is a lock row, a chain and a set of row digests)
MAX_LANES = 256


def check_lanes(lanes: object) -> int:
    """``lanes`` when it is an integer from 1 to :data:`MAX_LANES`, else InvalidInput."""
    if type(lanes) is not int or not 1 <= lanes <= MAX_LANES:
        raise InvalidInput(f"audit chains must be an integer from 1 to {MAX_LANES}, got {lanes!r}")
    return lanes


def lane_of(patient_id: str, lanes: int) -> int:
    """The lane of ``patient_id`` in a store of ``lanes`` lanes (0 when there is one): the
    first 8 bytes of ``sha256("msm-mem lane\\0" + id)``, big-endian, modulo ``lanes``."""
    if lanes == 1:
        return 0
    digest = hashlib.sha256(b"msm-mem lane\x00" + patient_id.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") % lanes


def chain_of(seq: int, lanes: int) -> int:
    """The chain of the audit event ``seq`` (or of the vector position ``seq``)."""
    return seq % lanes


#: where each governed table's ``patient_id`` sits in its digested columns
_PATIENT_AT = {
    table: [name for name, kind in columns if kind != "z"].index("patient_id") for table, columns in COLUMNS.items()
}


class LaneDigest(RowDigest):
    """The running sums of one write in a store of several lanes: a :class:`RowDigest` per lane
    the write locked, each row counted in its patient's lane. A row of a lane the write did not
    lock is :class:`WriteConflict` (its patient changed after the write chose its lanes)."""

    def __init__(self, key: bytes, lanes: int, start: Mapping[int, Mapping[str, TableDigest]]) -> None:
        super().__init__(key)
        self.lanes = lanes
        self.by_lane = {lane: RowDigest(key, digests) for lane, digests in start.items()}

    def _split(self, table: str, rows: Iterable[Sequence[Any]]) -> dict[int, list[Sequence[Any]]]:
        at = _PATIENT_AT[table]
        parts: dict[int, list[Sequence[Any]]] = {}
        for row in rows:
            parts.setdefault(lane_of(str(row[at]), self.lanes), []).append(row)
        unlocked = sorted(set(parts) - set(self.by_lane))
        if unlocked:
            raise WriteConflict(f"a {table} row of lane {unlocked[0]} changed meanwhile (its lane was not locked)")
        return parts

    def add(self, table: str, rows: Iterable[Sequence[Any]]) -> None:
        for lane, part in self._split(table, rows).items():
            self.by_lane[lane].add(table, part)
            self.changed.add(table)

    def remove(self, table: str, rows: Iterable[Sequence[Any]]) -> None:
        for lane, part in self._split(table, rows).items():
            self.by_lane[lane].remove(table, part)
            self.changed.add(table)

    def lane_results(self) -> dict[int, dict[str, TableDigest]]:
        """The sums of every lane a row was counted in or uncounted from."""
        return {lane: d.result() for lane, d in self.by_lane.items() if d.changed}

    def result(self) -> dict[str, TableDigest]:
        raise StoreError("a store of several lanes keeps its row digests by lane (lane_results)")

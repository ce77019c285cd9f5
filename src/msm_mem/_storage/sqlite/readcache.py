"""Decoded rows, kept beside one SQLite connection.

Every governed turn reads the patient's active semantic state and finding entities, and every
retrieve the episodic and visual records of its hits; decoding them (a SQL read and one AES-GCM
decryption per field) cost more than the rest of the turn. The cache keeps the active semantic
states and entities of a patient in the order the store returns them, and episodic and visual
records by id, and stays exact:

- this connection's own writes update it after they commit (new semantic versions replace
  the key's active one, new entities are appended; new records need nothing, as records are
  cached by id when read) and a batch it cannot follow (state changes, a restore) empties it;
- a change by any other connection empties it: each read first compares the store's change
  generation (:mod:`.changes`) with the one the cache was filled under;
- shredding a key or changing the codec empties it, so no plaintext outlives its key.

Nothing is cached or served from the cache inside a transaction (a rollback could take it
back, and the transaction may have changed the row). Bounded to ``limit`` patients per kind and
``record_limit`` records per table (emptied when full: the working set refills it).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ..._records import SemanticState, State
from ..._tier_records import Entity
from ..batch import WriteBatch

__all__ = ["ReadCache"]

T = TypeVar("T")


class ReadCache:
    """Active semantic states and entities per patient, episodic and visual records by id; the
    caller holds the store lock."""

    def __init__(
        self, conn: sqlite3.Connection, mark: Callable[[], int], limit: int = 10_000, record_limit: int = 4096
    ) -> None:
        self._conn = conn
        self._mark = mark
        self._limit = limit
        self._record_limit = record_limit
        self._version = -1
        self._semantic: dict[str, list[SemanticState]] = {}
        self._entities: dict[str, list[Entity]] = {}
        #: table -> record id -> decoded record (frozen, its vector read-only: safe to share)
        self._records: dict[str, dict[str, Any]] = {}

    def clear(self) -> None:
        self._semantic.clear()
        self._entities.clear()
        self._records.clear()

    def _fresh(self) -> None:
        version = self._mark()
        if version != self._version:
            self.clear()
            self._version = version

    def semantic(self, patient_id: str, load: Callable[[], list[SemanticState]]) -> list[SemanticState]:
        """The patient's active states ordered by category (``load`` reads them on a miss)."""
        return list(self._get(self._semantic, patient_id, load))

    def entities(self, patient_id: str, load: Callable[[], list[Entity]]) -> list[Entity]:
        """The patient's active entities by creation time (``load`` reads them on a miss)."""
        return list(self._get(self._entities, patient_id, load))

    def records(self, table: str, ids: Sequence[str], load: Callable[[Sequence[str]], dict[str, T]]) -> dict[str, T]:
        """``id -> record`` of those ``ids`` that exist in ``table`` (``load`` reads the ids
        not cached and returns the same mapping for them)."""
        if self._conn.in_transaction:
            return load(ids)
        self._fresh()
        cached: dict[str, T] = self._records.setdefault(table, {})
        found = {i: r for i in ids if (r := cached.get(i)) is not None}
        missing = [i for i in dict.fromkeys(ids) if i not in found]
        if missing:
            loaded = load(missing)
            if len(cached) + len(loaded) > self._record_limit:
                cached.clear()
            cached.update(loaded)
            found.update(loaded)
        return found

    def _get(self, table: dict[str, list[T]], patient_id: str, load: Callable[[], list[T]]) -> Sequence[T]:
        self._fresh()
        rows = table.get(patient_id)
        if rows is None:
            rows = load()
            if not self._conn.in_transaction:  # never cache what a rollback could take back
                if len(table) >= self._limit:
                    table.clear()
                table[patient_id] = rows
        return rows

    def committed(self, batch: WriteBatch) -> None:
        """Follow a batch this connection has just committed."""
        if batch.changes or batch.restore:
            self.clear()
            return
        replaced = {s.supersedes for s in batch.semantic}
        for s in batch.semantic:
            states = self._semantic.get(s.patient_id)
            if states is not None and s.state == State.ACTIVE and s.state_id not in replaced:
                kept = [x for x in states if x.category != s.category]
                self._semantic[s.patient_id] = sorted([*kept, s], key=lambda x: x.category)
        for e in batch.entities:
            entities = self._entities.get(e.patient_id)
            if entities is not None and e.state == State.ACTIVE:
                # stable: an entity created at the same time as a cached one comes after it,
                # as its later rowid puts it in the store's order
                self._entities[e.patient_id] = sorted([*entities, e], key=lambda x: x.created_at)

"""The embedded store's reads served from the read cache (:mod:`.readcache`): records by id, a
stored study's episodes, the active semantic states and entities of a patient, and its consent
records. Mixed into :class:`~.store.SqliteStore`, which keeps the caches exact (its commits
follow them, another connection's change empties them through the change mark)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ..._records import EpisodicRecord, SemanticState
from ..._tier_records import ConsentRecord, Entity
from ..codec import FieldCodec
from ..sql_store import SqlStore
from .connection import Writing
from .readcache import ReadCache

__all__ = ["CachedReads"]

T = TypeVar("T")

#: the tables whose records the read cache keeps by id
_RECORD_TABLES = frozenset({"episodic", "visual"})
#: past this many patients the consent cache is emptied (the working set refills it)
_CONSENT_LIMIT = 10_000


class CachedReads(SqlStore):
    """Reads of the shared SQL store, answered from the caches of one SQLite connection."""

    _cache: ReadCache
    _writing: Writing
    _consent_cache: dict[str, list[ConsentRecord]]

    def _find(self, table: str, ids: Sequence[str], conv: Callable[[Any, FieldCodec], T], at: int) -> dict[str, T]:
        """Episodic and visual records by id come from the read cache (the hits of every
        retrieve); other tables, and the side connection's thread, read the rows."""
        read = super()._find
        if table not in _RECORD_TABLES or self._writing.conn is not None:
            return read(table, ids, conv, at)
        with self._db():
            return self._cache.records(table, ids, lambda missing: read(table, missing, conv, at))

    def study_episodes(self, patient_id: str, study_id: str, limit: int | None = None) -> list[EpisodicRecord]:
        """The ids in the shared order, the records by id (from the read cache): a retrieve of a
        stored study decodes nothing it decoded before."""
        if not study_id or limit == 0:
            return []
        with self._db():
            ids = [row[0] for row in self._q(*self._study_query("id", patient_id, study_id, limit))]
            found = self.find_episodes(ids)
        return [found[i] for i in ids if i in found]  # one re-keyed meanwhile (anonymised) is gone

    def semantic_active(self, patient_id: str, category: str | None = None) -> list[SemanticState]:
        with self._db():
            states = self._cache.semantic(patient_id, lambda: self._load_semantic(patient_id))
        return states if category is None else [s for s in states if s.category == category]

    def entities(self, patient_id: str) -> list[Entity]:
        with self._db():
            return self._cache.entities(patient_id, lambda: self._load_entities(patient_id))

    def consents(self, patient_id: str | None = None) -> list[ConsentRecord]:
        with self._db():
            if patient_id is None:
                return self._load_consents(None)
            if patient_id not in self._consent_cache:
                if len(self._consent_cache) > _CONSENT_LIMIT:
                    self._consent_cache.clear()
                self._consent_cache[patient_id] = self._load_consents(patient_id)
            return list(self._consent_cache[patient_id])

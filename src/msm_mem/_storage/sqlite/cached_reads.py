"""The embedded store's read cache part: the reads every turn repeats (records by id, the
active semantic states and entities of a patient, its consent records) answered from the
decoded rows kept beside the store's connection (:mod:`.readcache`) and a consent cache. The
store keeps them exact: its commits follow them (:meth:`CachedReads.committed`), another
connection's change empties them through the change mark (:meth:`CachedReads.sync`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from ..._records import SemanticState
from ..._tier_records import Claim, ConsentRecord, Entity
from ..batch import WriteBatch
from .connection import SqliteDialect
from .readcache import ReadCache

__all__ = ["CachedReads"]

T = TypeVar("T")

#: the tables whose records the read cache keeps by id
_RECORD_TABLES = frozenset({"episodic", "visual"})
#: past this many patients the consent cache is emptied (the working set refills it)
_CONSENT_LIMIT = 10_000


class CachedReads:
    """The :class:`~msm_mem._storage.sql_core.PatientCache` of the SQLite store: the read cache
    of its connection and the consent records per patient, under the store's lock."""

    by_id = True

    def __init__(self, dialect: SqliteDialect, cache: ReadCache) -> None:
        self._sql = dialect
        self._cache = cache
        self._consents: dict[str, list[ConsentRecord]] = {}
        self._consent_version = -1

    def records(self, table: str, ids: Sequence[str], load: Callable[[Sequence[str]], dict[str, T]]) -> dict[str, T]:
        """Episodic and visual records by id come from the read cache (the hits of every
        retrieve); other tables, and the side connection's thread, read the rows."""
        if table not in _RECORD_TABLES or self._sql.on_side():
            return load(ids)
        with self._sql.db():
            return self._cache.records(table, ids, load)

    def semantic(self, patient_id: str, load: Callable[[], list[SemanticState]]) -> list[SemanticState]:
        with self._sql.db():
            return self._cache.semantic(patient_id, load)

    def entities(self, patient_id: str, load: Callable[[], list[Entity]]) -> list[Entity]:
        with self._sql.db():
            return self._cache.entities(patient_id, load)

    def consents(self, patient_id: str | None, load: Callable[[], list[ConsentRecord]]) -> list[ConsentRecord]:
        with self._sql.db():
            if patient_id is None:
                return load()
            if patient_id not in self._consents:
                if len(self._consents) > _CONSENT_LIMIT:
                    self._consents.clear()
                self._consents[patient_id] = load()
            return list(self._consents[patient_id])

    def claims(self, patient_id: str, key: str | None, load: Callable[[], list[Claim]]) -> list[Claim]:
        return load()

    def clear(self) -> None:
        """Empty the decoded rows (a shred, a codec change, an upgrade: no plaintext outlives its key)."""
        self._cache.clear()

    def committed(self, batch: WriteBatch) -> None:
        """Follow a batch the store's connection has just committed."""
        if batch.erase:  # rows deleted: nothing decoded or listed of them may be served again
            self._cache.clear()
        self._cache.committed(batch)
        if batch.consents or batch.revocations or batch.erase:
            self._consents.clear()

    def sync(self, version: int) -> None:
        """Empty the consent cache when the store's change generation moved to ``version``."""
        if version != self._consent_version:
            self._consents.clear()
            self._consent_version = version

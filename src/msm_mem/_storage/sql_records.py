"""The reads of the three memories' records, written once for both SQL stores: the part of a
SQL store behind the :class:`~msm_mem._storage.base.Records` protocol."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal, TypeVar

from .._errors import InvalidInput
from .._records import EpisodicRecord, SemanticState, State, VisualRecord
from . import rows as r
from .base import DecayDue, RecordTable
from .codec import FieldCodec
from .sql_core import PatientCache, SqlTables, in_order

__all__ = ["SqlRecords"]

T = TypeVar("T")

_RECORD_TABLES: tuple[RecordTable, ...] = ("episodic", "visual", "semantic", "claims")
_SEMANTIC_KEYS = ("patient_id", "category", "version", "id")


class SqlRecords:
    """Episodic, visual and semantic records: by id, by patient, in insertion order; the reads
    a turn repeats go through ``cache``."""

    def __init__(self, tables: SqlTables, cache: PatientCache) -> None:
        self._t = tables
        self._cache = cache

    def _by_id(self, table: str, ids: Sequence[str], conv: Callable[[Any, FieldCodec], T]) -> dict[str, T]:
        """Episodic or visual records by id, through the cache."""
        return self._cache.records(table, ids, lambda missing: self._t.find(table, missing, conv, 1))

    def get_episodes(self, ids: Sequence[str]) -> list[EpisodicRecord]:
        return in_order(ids, self._by_id("episodic", ids, r.episode_from_row), "episodic record") if ids else []

    def find_episodes(self, ids: Sequence[str]) -> dict[str, EpisodicRecord]:
        return self._by_id("episodic", ids, r.episode_from_row)

    def get_visuals(self, ids: Sequence[str]) -> list[VisualRecord]:
        return in_order(ids, self._by_id("visual", ids, r.visual_from_row), "visual record") if ids else []

    def _load_semantic(self, patient_id: str) -> list[SemanticState]:
        """A patient's ACTIVE semantic states by category (the statement the cache stands for)."""
        return self._t.select(
            "SELECT * FROM semantic WHERE tenant = ? AND patient_id = ? AND state = 'active' ORDER BY category",
            (self._t.tenant, patient_id),
            r.semantic_from_row,
        )

    def semantic_active(self, patient_id: str, category: str | None = None) -> list[SemanticState]:
        states = self._cache.semantic(patient_id, lambda: self._load_semantic(patient_id))
        return states if category is None else [s for s in states if s.category == category]

    def semantic_history(self, patient_id: str, category: str) -> list[SemanticState]:
        return self._t.select(
            "SELECT * FROM semantic WHERE tenant = ? AND patient_id = ? AND category = ? ORDER BY version",
            (self._t.tenant, patient_id, category),
            r.semantic_from_row,
        )

    def semantic_created_before(self, before: float) -> list[SemanticState]:
        return self._t.select(
            "SELECT * FROM semantic WHERE tenant = ? AND created_at <= ? AND state IN ('active', 'superseded')"
            " ORDER BY created_at, id",
            (self._t.tenant, before),
            r.semantic_from_row,
        )

    def iter_episodes(self) -> Iterator[EpisodicRecord]:
        return self._t.iter("episodic", r.EPISODIC_COLUMNS, r.episode_from_row, ("pos",))

    def iter_visuals(self) -> Iterator[VisualRecord]:
        return self._t.iter("visual", r.VISUAL_COLUMNS, r.visual_from_row, ("pos",))

    def iter_semantic(self) -> Iterator[SemanticState]:
        return self._t.iter("semantic", r.SEMANTIC_COLUMNS, r.semantic_from_row, _SEMANTIC_KEYS)

    def count(self, kind: Literal["episodic", "visual", "semantic"]) -> int:
        if kind not in ("episodic", "visual", "semantic"):
            raise InvalidInput(f"unknown table {kind!r}")
        d = self._t.dialect
        with d.db():
            return int(d.q(f"SELECT COUNT(*) FROM {kind} WHERE tenant = ?", (self._t.tenant,)).fetchone()[0])

    def patients(self) -> list[str]:
        d = self._t.dialect
        with d.db():
            rows = d.q(
                "SELECT patient_id FROM episodic WHERE tenant = ? UNION SELECT patient_id FROM visual WHERE tenant = ?"
                " UNION SELECT patient_id FROM semantic WHERE tenant = ?",
                (self._t.tenant,) * 3,
            ).fetchall()
        return sorted(row[0] for row in rows if row[0])

    def has_patient(self, patient_id: str) -> bool:
        d = self._t.dialect
        if not patient_id or (not d.holds_nul and "\x00" in patient_id):
            return False  # the anonymised pool is nobody; no stored id holds what the column cannot
        with d.db():
            row = d.q(
                "SELECT EXISTS (SELECT 1 FROM episodic WHERE tenant = ? AND patient_id = ?)"
                " OR EXISTS (SELECT 1 FROM semantic WHERE tenant = ? AND patient_id = ?)"
                " OR EXISTS (SELECT 1 FROM visual WHERE tenant = ? AND patient_id = ?)",
                (self._t.tenant, patient_id) * 3,
            ).fetchone()
        return bool(row and row[0])

    def record_ids(self, table: RecordTable, patient_id: str) -> list[str]:
        if table not in _RECORD_TABLES:
            raise InvalidInput(f"unknown table {table!r}")
        d = self._t.dialect
        with d.db():
            rows = d.q(
                f"SELECT id FROM {table} WHERE tenant = ? AND patient_id = ? AND state IN ('active', 'superseded')"
                f" ORDER BY {d.order[table]}",
                (self._t.tenant, patient_id),
            ).fetchall()
        return [row[0] for row in rows]

    def studies(self, patient_id: str) -> set[str]:
        d = self._t.dialect
        with d.db():
            rows = d.q(
                "SELECT study_id FROM episodic WHERE tenant = ? AND patient_id = ?", (self._t.tenant, patient_id)
            ).fetchall()
        return {row[0] for row in rows if row[0]}

    def study_episodes(self, patient_id: str, study_id: str, limit: int | None = None) -> list[EpisodicRecord]:
        if not study_id or limit == 0:
            return []  # an anonymised episode's study id is blank: it names no study
        if not self._cache.by_id:
            return self._t.select(*self._study_query("*", patient_id, study_id, limit), r.episode_from_row)
        # the ids in the same order, the records by id (from the cache): a retrieve of a stored
        # study decodes nothing it decoded before
        d = self._t.dialect
        with d.db():
            ids = [row[0] for row in d.q(*self._study_query("id", patient_id, study_id, limit))]
            found = self.find_episodes(ids)
        return [found[i] for i in ids if i in found]  # one re-keyed meanwhile (anonymised) is gone

    def _study_query(
        self, columns: str, patient_id: str, study_id: str, limit: int | None
    ) -> tuple[str, tuple[object, ...]]:
        """The statement and arguments of :meth:`study_episodes`, selecting ``columns``."""
        return (
            f"SELECT {columns} FROM episodic WHERE tenant = ? AND patient_id = ? AND study_id = ?"
            f" ORDER BY CASE WHEN state = 'active' THEN 0 ELSE 1 END, pos DESC{'' if limit is None else ' LIMIT ?'}",
            (self._t.tenant, patient_id, study_id, *(() if limit is None else (limit,))),
        )

    def last_activity(self, patient_id: str) -> float | None:
        live = "WHERE tenant = ? AND patient_id = ? AND state IN ('active', 'superseded')"
        union = " UNION ALL ".join(f"SELECT MAX(created_at) AS t FROM {t} {live}" for t in _RECORD_TABLES)
        d = self._t.dialect
        with d.db():
            row = d.q(f"SELECT MAX(t) FROM ({union}) u", (self._t.tenant, patient_id) * 4).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    def decay_due(
        self, now: float, retention_s: float, weights: Mapping[str, float], default_weight: float
    ) -> list[DecayDue]:
        live = "tenant = ? AND patient_id <> '' AND state IN ('active', 'superseded')"
        last = " UNION ALL ".join(
            f"SELECT patient_id, MAX(created_at) AS t FROM {t} WHERE {live} GROUP BY patient_id" for t in _RECORD_TABLES
        )
        tiers = sorted(weights)
        weight = f"CASE r.evidence_tier {' '.join('WHEN ? THEN ?' for _ in tiers)} ELSE ? END"
        pairs = [x for tier in tiers for x in (tier, float(weights[tier]))]
        out: list[DecayDue] = []
        d, tenant = self._t.dialect, self._t.tenant
        with d.db():
            for table in _RECORD_TABLES:
                semantic = table == "semantic"
                confidence = "1.0" if semantic else "r.confidence"
                # the same arithmetic as ranking.decay_at: last + retention x (confidence x weight)
                share, args = ("1.0", ()) if semantic else (f"(r.confidence * {weight})", (*pairs, default_weight))
                rows = d.q(
                    f"SELECT r.id, r.state, {confidence}, r.evidence_tier, a.t FROM {table} r JOIN"
                    f" (SELECT patient_id, MAX(t) AS t FROM ({last}) u GROUP BY patient_id) a"
                    f" ON a.patient_id = r.patient_id WHERE r.tenant = ? AND r.state IN ('active', 'superseded')"
                    f" AND a.t + ? * {share} <= ? ORDER BY r.id",
                    (tenant,) * 4 + (tenant, float(retention_s), *args, now),
                ).fetchall()
                out += [DecayDue(table, i, State(st), float(c), tier, float(t)) for i, st, c, tier, t in rows]
        return out

"""The SQL store, written once and built from parts: what SQLite and PostgreSQL share.

:class:`SqlStore` implements the :class:`~msm_mem._storage.base.Store` contract by delegating
to parts, each a plain class behind a narrow seam and built by its own constructor:

- the backend's :class:`~msm_mem._storage.sql_core.Dialect` (connection, statements,
  transactions), under one tenant's :class:`~msm_mem._storage.sql_core.SqlTables` (with the
  PHI codec);
- the records (:class:`~msm_mem._storage.sql_records.SqlRecords`), the governed tiers and
  consent (:class:`~msm_mem._storage.sql_tiers.SqlTiers`), the audit rows
  (:class:`~msm_mem._storage.sql_tiers.SqlAudit`), the row digests
  (:class:`~msm_mem._storage.sql_rows.SqlRowDigests`) and the write path
  (:class:`~msm_mem._storage.sql_write.SqlWriter`), written once;
- what the backend gives: its vector part (:class:`VectorPart`: FAISS caches beside SQLite,
  pgvector in PostgreSQL), its key table and its read cache
  (:class:`~msm_mem._storage.sql_core.PatientCache`).

A backend subclasses :class:`SqlStore` only to build those parts (its ``create``/``open``)
and to add what it alone does (a side connection, saving caches, dropping a schema).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Literal, Protocol

from .._records import EpisodicRecord, SemanticState, Vector, VisualRecord
from .._tier_records import Claim, ConsentRecord, Entity, Relationship, StmItem, StmState
from .base import AuditChainer, DecayDue, RecordTable, Store, VectorKind, WrappedKeyTable
from .batch import ERASED_TABLES, WriteBatch
from .codec import FieldCodec
from .row_digest import TableDigest
from .sql_core import PatientCache, SqlTables
from .sql_records import SqlRecords
from .sql_rows import SqlRowDigests
from .sql_tiers import SqlAudit, SqlTiers
from .sql_write import Committed, SqlWriter, VectorRows

__all__ = ["SqlStore", "VectorPart"]


class VectorPart(VectorRows, Protocol):
    """A backend's vector part: the searches, and where the write path puts new vectors."""

    def search(self, kind: VectorKind, z: Vector, k: int, scope: str | None) -> list[tuple[str, float]]: ...

    def search_many(
        self, z: Vector, requests: Sequence[tuple[VectorKind, int]], scope: str | None
    ) -> list[list[tuple[str, float]]]: ...

    def max_cosine(self, z: Vector, kinds: Sequence[VectorKind], scope: str) -> float | None: ...


class SqlStore(Store):
    """Records, governed tiers, audit rows and the write path of a SQL store of record, over the
    parts a backend builds (see the module)."""

    def __init__(
        self,
        tables: SqlTables,
        *,
        cache: PatientCache,
        vectors: VectorPart,
        keys: WrappedKeyTable,
        committed: Committed,
        dim: int,
        encoder_name: str,
        store_id: str,
        schema_version: str,
    ) -> None:
        """``committed`` follows each batch the store commits (``SqlWriter``); the rest as the
        :class:`~msm_mem._storage.base.Store` contract names them."""
        self.dim = dim
        self.encoder_name = encoder_name
        self.store_id = store_id
        self.tenant = tables.tenant
        self._sql = tables.dialect
        self._tables = tables
        self._vectors = vectors
        self._records = SqlRecords(tables, cache)
        self._tiers = SqlTiers(tables, cache)
        self._audit = SqlAudit(tables)
        self._digests = SqlRowDigests(tables)
        self._writer = SqlWriter(
            tables,
            self._digests,
            self._audit,
            keys,
            vectors,
            committed,
            dim=dim,
            store_id=store_id,
            schema_version=schema_version,
            current_schema=self.CURRENT_SCHEMA,
        )

    @property
    def schema_version(self) -> str:
        """The store's schema as opened (the writer's, which an upgrade brings to the current one)."""
        return self._writer.schema_version

    @schema_version.setter
    def schema_version(self, value: str) -> None:
        self._writer.schema_version = value

    def _db(self) -> AbstractContextManager[object]:
        """The connection under the store's lock (the dialect's)."""
        return self._sql.db()

    # the codec and the row digests ------------------------------------------------------------

    def use_codec(self, codec: FieldCodec) -> None:
        self._tables.use_codec(codec)

    def use_row_key(self, key: bytes) -> None:
        self._digests.use_row_key(key)

    def row_digests(self) -> dict[str, TableDigest]:
        return self._digests.row_digests()

    def computed_row_digests(self) -> dict[str, TableDigest]:
        return self._digests.computed_row_digests()

    def lane_digests(self) -> dict[int, dict[str, TableDigest]]:
        return self._digests.lane_digests()

    def computed_lane_digests(self) -> dict[int, dict[str, TableDigest]]:
        return self._digests.computed_lane_digests()

    # writes ---------------------------------------------------------------------------------

    def write(
        self,
        batch: WriteBatch,
        chain: AuditChainer | None = None,
        *,
        before_commit: Callable[[], None] | None = None,
    ) -> None:
        self._writer.write(batch, chain, before_commit=before_commit)

    def upgrade(
        self,
        chain: AuditChainer,
        reencode: Callable[[str, str, str], str | None],
        *,
        before_commit: Callable[[], None],
        check: Callable[[], None] | None = None,
    ) -> int:
        return self._writer.upgrade(chain, reencode, before_commit=before_commit, check=check)

    # records ----------------------------------------------------------------------------------

    def get_episodes(self, ids: Sequence[str]) -> list[EpisodicRecord]:
        return self._records.get_episodes(ids)

    def find_episodes(self, ids: Sequence[str]) -> dict[str, EpisodicRecord]:
        return self._records.find_episodes(ids)

    def get_visuals(self, ids: Sequence[str]) -> list[VisualRecord]:
        return self._records.get_visuals(ids)

    def semantic_active(self, patient_id: str, category: str | None = None) -> list[SemanticState]:
        return self._records.semantic_active(patient_id, category)

    def semantic_history(self, patient_id: str, category: str) -> list[SemanticState]:
        return self._records.semantic_history(patient_id, category)

    def semantic_created_before(self, before: float) -> list[SemanticState]:
        return self._records.semantic_created_before(before)

    def iter_episodes(self) -> Iterator[EpisodicRecord]:
        return self._records.iter_episodes()

    def iter_visuals(self) -> Iterator[VisualRecord]:
        return self._records.iter_visuals()

    def iter_semantic(self) -> Iterator[SemanticState]:
        return self._records.iter_semantic()

    def count(self, kind: Literal["episodic", "visual", "semantic"]) -> int:
        return self._records.count(kind)

    def patients(self) -> list[str]:
        return self._records.patients()

    def has_patient(self, patient_id: str) -> bool:
        return self._records.has_patient(patient_id)

    def record_ids(self, table: RecordTable, patient_id: str) -> list[str]:
        return self._records.record_ids(table, patient_id)

    def studies(self, patient_id: str) -> set[str]:
        return self._records.studies(patient_id)

    def study_episodes(self, patient_id: str, study_id: str, limit: int | None = None) -> list[EpisodicRecord]:
        return self._records.study_episodes(patient_id, study_id, limit)

    def last_activity(self, patient_id: str) -> float | None:
        return self._records.last_activity(patient_id)

    def decay_due(
        self, now: float, retention_s: float, weights: Mapping[str, float], default_weight: float
    ) -> list[DecayDue]:
        return self._records.decay_due(now, retention_s, weights, default_weight)

    def patient_rows(self, patient_id: str) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        with self._db():
            for table in ERASED_TABLES:
                rows = self._sql.q(
                    f"SELECT id FROM {table} WHERE tenant = ? AND patient_id = ? ORDER BY id", (self.tenant, patient_id)
                )
                out[table] = [str(r[0]) for r in rows.fetchall()]
        return out

    # vectors ----------------------------------------------------------------------------------

    def search(self, kind: VectorKind, z: Vector, k: int, scope: str | None) -> list[tuple[str, float]]:
        return self._vectors.search(kind, z, k, scope)

    def search_many(
        self, z: Vector, requests: Sequence[tuple[VectorKind, int]], scope: str | None
    ) -> list[list[tuple[str, float]]]:
        return self._vectors.search_many(z, requests, scope)

    def max_cosine(self, z: Vector, kinds: Sequence[VectorKind], scope: str) -> float | None:
        return self._vectors.max_cosine(z, kinds, scope)

    # tiers and consent ------------------------------------------------------------------------

    def stm_get(self, item_ids: Sequence[str]) -> list[StmItem]:
        return self._tiers.stm_get(item_ids)

    def stm_list(
        self,
        *,
        patient_id: str | None = None,
        state: StmState | None = None,
        expires_before: float | None = None,
        created_before: float | None = None,
    ) -> list[StmItem]:
        return self._tiers.stm_list(
            patient_id=patient_id, state=state, expires_before=expires_before, created_before=created_before
        )

    def claims_active(self, patient_id: str, key: str | None = None) -> list[Claim]:
        return self._tiers.claims_active(patient_id, key)

    def claim_history(self, patient_id: str, key: str) -> list[Claim]:
        return self._tiers.claim_history(patient_id, key)

    def get_claims(self, ids: Sequence[str]) -> list[Claim]:
        return self._tiers.get_claims(ids)

    def entities(self, patient_id: str) -> list[Entity]:
        return self._tiers.entities(patient_id)

    def relationships(self, patient_id: str) -> list[Relationship]:
        return self._tiers.relationships(patient_id)

    def consents(self, patient_id: str | None = None) -> list[ConsentRecord]:
        return self._tiers.consents(patient_id)

    # audit ------------------------------------------------------------------------------------

    def audit_chains(self) -> int:
        return self._audit.audit_chains()

    def audit_head(self, chain: int = 0) -> tuple[int, str]:
        return self._audit.audit_head(chain)

    def audit_base(self, chain: int = 0) -> tuple[int, str]:
        return self._audit.audit_base(chain)

    def audit_heads(self) -> tuple[tuple[int, str], ...]:
        return self._audit.audit_heads()

    def iter_audit_batches(
        self, start_seq: int = 1, chain: int | None = None
    ) -> Iterator[list[tuple[int, bytes, str]]]:
        return self._audit.iter_audit_batches(start_seq, chain)

    def audit_purge(self, through_seq: int) -> int:
        return self._audit.audit_purge(through_seq)

"""The storage contract: what every store (SQLite, PostgreSQL) must do, typed.

A store keeps the long-term records of the paper's three memories (episodic, visual,
semantic) plus the governance tables, and answers exact vector queries. Writes go through one
method, :meth:`Store.write`, which applies a :class:`WriteBatch` in a single transaction: either
every record, vector, state flip and audit row of the batch is stored, or none is.

PHI fields are passed through a :class:`FieldCodec` at this boundary, so the bytes at rest are
whatever the codec makes of them (envelope-encrypted tokens with the governance layer's codec,
plain text with :class:`PlainCodec`).

Vector scope: ``scope`` is a patient id for exact patient-scoped retrieval, ``None`` for the
whole population, and ``""`` for the pool of anonymised records (patient identifiers removed).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from .._records import EpisodicRecord, SemanticState, State, Vector, VisualRecord
from .._tier_records import (
    AuditRow,
    Claim,
    ConsentRecord,
    Entity,
    Relationship,
    StmChange,
    StmItem,
    StmState,
)

__all__ = [
    "AUDIT_PAGE_ROWS",
    "PII_FIELDS",
    "FieldCodec",
    "PlainCodec",
    "StateChange",
    "Store",
    "VectorKind",
    "WriteBatch",
]

VectorKind = Literal["episodic", "visual"]

#: audit rows per page of :meth:`Store.iter_audit_batches`: one query per page costs little,
#: and a page this small stays in the CPU caches and is freed before the cyclic GC scans it
AUDIT_PAGE_ROWS = 1000

#: Fields of each table that hold patient data and go through the codec.
PII_FIELDS: dict[str, tuple[str, ...]] = {
    "episodic": ("question", "answer", "decision", "media_path", "media_description"),
    "visual": ("media_path",),
    "semantic": ("impressions",),
    "stm": ("payload",),
    "claims": ("content", "source"),
    "entities": ("name",),
}


class FieldCodec(Protocol):
    """Turns a PHI field into its stored form and back (the repository boundary)."""

    def encode(self, table: str, record_id: str, field: str, patient_id: str, value: str) -> str: ...

    def decode(self, table: str, record_id: str, field: str, patient_id: str, value: str) -> str: ...


class PlainCodec:
    """Stores fields as given (no encryption); the default of an ungoverned store."""

    def encode(self, table: str, record_id: str, field: str, patient_id: str, value: str) -> str:
        return value

    def decode(self, table: str, record_id: str, field: str, patient_id: str, value: str) -> str:
        return value


@dataclass(frozen=True, slots=True)
class StateChange:
    """Flip one long-term record's state; optionally replace its patient id, id and fields.

    Used for supersession (``ACTIVE -> SUPERSEDED``), retraction and anonymisation in place
    (``new_patient_id=""``, ``new_id`` random, ``fields`` scrubbed content). ``expect`` is the
    state the record must be in, or the whole batch fails.
    """

    table: Literal["episodic", "visual", "semantic", "claims", "entities", "relationships"]
    record_id: str
    expect: State
    to: State
    new_id: str | None = None
    new_patient_id: str | None = None
    fields: tuple[tuple[str, str], ...] = ()


@dataclass(slots=True)
class WriteBatch:
    """Everything one atomic write stores. Empty lists are fine."""

    episodes: list[EpisodicRecord] = field(default_factory=list)
    visuals: list[VisualRecord] = field(default_factory=list)
    semantic: list[SemanticState] = field(default_factory=list)
    changes: list[StateChange] = field(default_factory=list)
    stm: list[StmItem] = field(default_factory=list)
    stm_changes: list[StmChange] = field(default_factory=list)
    claims: list[Claim] = field(default_factory=list)
    entities: list[Entity] = field(default_factory=list)
    relationships: list[Relationship] = field(default_factory=list)
    consents: list[ConsentRecord] = field(default_factory=list)
    #: (consent_id, revoked_at) pairs
    revocations: list[tuple[str, float]] = field(default_factory=list)
    #: audit rows appended in the same transaction; seqs must continue the stored chain
    audit: list[AuditRow] = field(default_factory=list)
    #: store semantic versions exactly as given (import/restore): no supersession flips
    restore: bool = False

    def __bool__(self) -> bool:
        return any(bool(getattr(self, name)) for name in self.__dataclass_fields__ if name != "restore")


class WrappedKeyTable(Protocol):
    """Storage of wrapped data keys and the encrypted pseudonym of each patient."""

    def get(self, patient_ref: str) -> Any: ...

    def get_by_id(self, key_id: str) -> Any: ...

    def put(self, key: Any) -> None: ...

    def shred(self, patient_ref: str) -> None: ...

    def all(self) -> list[Any]: ...

    def pseudonym(self, key_id: str) -> tuple[str, str] | None: ...

    def put_pseudonym(self, key_id: str, pseudonym: str, token: str) -> None: ...


class Store(ABC):
    """A store of record for long-term memory with exact cosine search.

    Invariants every implementation keeps (checked by the contract suite):
    - vectors are unit float32 of ``dim``; the i-th episodic (visual) record in insertion order
      has vector position i;
    - ``search`` is exact: it returns the k largest cosines within the scope, ties broken by
      insertion order, in descending score;
    - at most one ACTIVE semantic state per ``(patient_id, category)``;
    - a failed :meth:`write` leaves nothing behind.
    """

    dim: int
    encoder_name: str
    #: random id of this store, bound into every ciphertext's AAD
    tenant: str
    _codec: FieldCodec

    def sync(self) -> None:  # noqa: B027  (an optional hook: a store without caches has nothing to do)
        """Drop read caches made stale by other connections' commits (default: none kept)."""

    def use_codec(self, codec: FieldCodec) -> None:
        """Set the PHI codec (before any read or write of PHI fields)."""
        self._codec = codec

    @abstractmethod
    def write(self, batch: WriteBatch) -> None:
        """Apply the batch in one transaction; raise and store nothing on any error."""

    @abstractmethod
    def search(self, kind: VectorKind, z: Vector, k: int, scope: str | None) -> list[tuple[str, float]]:
        """Top-k ``(record id, cosine)`` among ACTIVE and ANONYMIZED records of the scope."""

    def search_many(
        self, z: Vector, requests: Sequence[tuple[VectorKind, int]], scope: str | None
    ) -> list[list[tuple[str, float]]]:
        """Several searches with one query vector and scope (for example E and V), in order.

        Same results as calling :meth:`search` for each ``(kind, k)``; a backend may do it in
        one round trip.
        """
        return [self.search(kind, z, k, scope) for kind, k in requests]

    def max_cosine(self, z: Vector, kinds: Sequence[VectorKind], scope: str) -> float | None:
        """The largest cosine of ``z`` over the scope's vectors of ``kinds`` (the write-back
        gate's novelty), None when the scope has none; the top-1 score of :meth:`search_many`."""
        scores = [s for hits in self.search_many(z, [(kind, 1) for kind in kinds], scope) for _, s in hits]
        return max(scores) if scores else None

    @abstractmethod
    def get_episodes(self, ids: Sequence[str]) -> list[EpisodicRecord]:
        """Records in the order of ``ids``; raises NotFound for an unknown id."""

    def find_episodes(self, ids: Sequence[str]) -> dict[str, EpisodicRecord]:
        """The records of those ids that exist (unknown ids are left out)."""
        found: dict[str, EpisodicRecord] = {}
        for i in dict.fromkeys(ids):
            try:
                found[i] = self.get_episodes([i])[0]
            except LookupError:
                continue
        return found

    @abstractmethod
    def get_visuals(self, ids: Sequence[str]) -> list[VisualRecord]:
        """Records in the order of ``ids``; raises NotFound for an unknown id."""

    @abstractmethod
    def semantic_active(self, patient_id: str, category: str | None = None) -> list[SemanticState]:
        """The ACTIVE semantic state(s) of a patient (one per category), sorted by category."""

    @abstractmethod
    def semantic_history(self, patient_id: str, category: str) -> list[SemanticState]:
        """Every version of one semantic key, oldest first."""

    @abstractmethod
    def iter_episodes(self) -> Iterator[EpisodicRecord]:
        """All episodic records in insertion order."""

    @abstractmethod
    def iter_visuals(self) -> Iterator[VisualRecord]:
        """All visual records in insertion order."""

    @abstractmethod
    def iter_semantic(self) -> Iterator[SemanticState]:
        """All semantic versions, by patient, category and version."""

    @abstractmethod
    def count(self, kind: Literal["episodic", "visual", "semantic"]) -> int:
        """Number of stored rows of a table (every state)."""

    @abstractmethod
    def patients(self) -> list[str]:
        """Sorted ids of the patients that have any record (anonymised pool excluded)."""

    @abstractmethod
    def record_ids(self, table: Literal["episodic", "visual", "semantic", "claims"], patient_id: str) -> list[str]:
        """Ids of a patient's ACTIVE and SUPERSEDED rows of one table, oldest first."""

    @abstractmethod
    def studies(self, patient_id: str) -> set[str]:
        """Study ids already stored for a patient (to make ingest idempotent)."""

    # governed tiers -----------------------------------------------------------------------

    @abstractmethod
    def stm_get(self, item_ids: Sequence[str]) -> list[StmItem]:
        """Short-term items in the order asked; raises NotFound for an unknown id."""

    @abstractmethod
    def stm_list(
        self,
        *,
        patient_id: str | None = None,
        state: StmState | None = None,
        expires_before: float | None = None,
        created_before: float | None = None,
    ) -> list[StmItem]:
        """Short-term items matching every given filter, oldest first."""

    @abstractmethod
    def claims_active(self, patient_id: str, key: str | None = None) -> list[Claim]:
        """ACTIVE claims of a patient (optionally one key), by key."""

    @abstractmethod
    def claim_history(self, patient_id: str, key: str) -> list[Claim]:
        """Every version of one claim key, oldest first."""

    @abstractmethod
    def get_claims(self, ids: Sequence[str]) -> list[Claim]:
        """Claims in the order asked; raises NotFound for an unknown id."""

    @abstractmethod
    def entities(self, patient_id: str) -> list[Entity]:
        """A patient's ACTIVE entities, oldest first."""

    @abstractmethod
    def relationships(self, patient_id: str) -> list[Relationship]:
        """A patient's ACTIVE relationships, oldest first."""

    @abstractmethod
    def decay_due(self, now: float) -> list[tuple[str, str]]:
        """``(table, record id)`` of ACTIVE or SUPERSEDED long-term records with decay_at <= now."""

    @abstractmethod
    def semantic_created_before(self, before: float) -> list[SemanticState]:
        """ACTIVE and SUPERSEDED semantic versions created at or before ``before`` (decay)."""

    @abstractmethod
    def consents(self, patient_id: str | None = None) -> list[ConsentRecord]:
        """Consent records for a patient and for every patient (``*``); all when None."""

    @abstractmethod
    def audit_head(self) -> tuple[int, str]:
        """``(seq, event_hash)`` of the last audit event, or ``(base seq, base hash)``."""

    @abstractmethod
    def audit_base(self) -> tuple[int, str]:
        """``(seq, hash)`` the stored chain continues from: (0, GENESIS) unless purged."""

    def iter_audit(self, start_seq: int = 1) -> Iterator[AuditRow]:
        """Stored audit rows with seq >= start_seq, ascending."""
        for rows in self.iter_audit_batches(start_seq):
            yield from map(AuditRow._make, rows)

    @abstractmethod
    def iter_audit_batches(self, start_seq: int = 1) -> Iterator[list[tuple[int, bytes, str]]]:
        """Stored audit rows with seq >= start_seq, ascending, as plain ``(seq, payload,
        event_hash)`` tuples in pages of :data:`AUDIT_PAGE_ROWS` (the last may be shorter, none
        is empty); for the hash walk of a verification, which would otherwise spend more time
        building records than hashing."""

    @abstractmethod
    def audit_purge(self, through_seq: int) -> int:
        """Delete audit rows with seq <= through_seq (retention is checked by the caller)."""

    @abstractmethod
    def keys(self) -> WrappedKeyTable:
        """The table of wrapped per-patient data keys (see governance.keys.WrappedKeyStore)."""

    @abstractmethod
    def close(self) -> None:
        """Flush caches and release the store; later calls fail."""

    def has_patient(self, patient_id: str) -> bool:
        """Whether the patient has any stored record."""
        return patient_id in set(self.patients())

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

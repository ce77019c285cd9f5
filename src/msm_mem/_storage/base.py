"""The storage contract: small typed protocols that every store (SQLite, PostgreSQL) composes.

A store keeps the long-term records of the paper's three memories (episodic, visual,
semantic) plus the governance tables, and answers exact vector queries. Writes go through one
method, :meth:`Store.write`, which applies a :class:`WriteBatch` in a single transaction: either
every record, vector, state flip and audit row of the batch is stored, or none is; a batch the
transition table does not allow is refused whole (:class:`IllegalTransition`).

PHI fields are passed through a :class:`FieldCodec` at this boundary; a store has none until
:meth:`Store.use_codec` is given an encrypting one, and refuses PHI until then.

The protocols, one concern each: :class:`Records` (long-term records), :class:`Vectors`
(search), :class:`Tiers` (claims, entities and short-term items), :class:`Audit`,
:class:`Keys` (wrapped data keys, typed :class:`WrappedKeyTable`), :class:`Consents` and
:class:`Erasable` (what erasing a patient reads).

Vector scope: ``scope`` is a patient id for exact patient-scoped retrieval, ``None`` for the
whole population, and ``""`` for the pool of anonymised records (patient identifiers removed).
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal, Protocol

from .._errors import InvalidInput
from .._records import EpisodicRecord, SemanticState, State, Vector, VisualRecord
from .._tier_records import AuditRow, Claim, ConsentRecord, Entity, Relationship, StmItem, StmState, WrappedKey
from .batch import Erasure, StateChange, WriteBatch
from .codec import PII_FIELDS, FieldCodec
from .row_digest import TableDigest

__all__ = [
    "AuditChainer",
    "AUDIT_PAGE_ROWS",
    "PII_FIELDS",
    "Audit",
    "Consents",
    "DecayDue",
    "Erasable",
    "Erasure",
    "FieldCodec",
    "Keys",
    "Records",
    "RecordTable",
    "StateChange",
    "Store",
    "Tiers",
    "VectorKind",
    "Vectors",
    "WrappedKeyTable",
    "WriteBatch",
    "check_needle",
]

VectorKind = Literal["episodic", "visual"]
RecordTable = Literal["episodic", "visual", "semantic", "claims"]


class AuditChainer(Protocol):
    """Builds a batch's audit rows after the stored chain head ``(seq, event_hash)``; in a store
    of several lanes the store also passes ``after``, the highest seq stored in any chain: the
    rows then take the first seqs of their chain's residue above it."""

    def __call__(self, seq: int, prev: str, after: int = 0) -> list[AuditRow]: ...


@dataclass(frozen=True, slots=True)
class DecayDue:
    """A long-term row :meth:`Records.decay_due` found due: its table, id, state, confidence
    (1 for semantic state), evidence tier and its patient's last activity (UTC seconds)."""

    table: RecordTable
    record_id: str
    state: State
    confidence: float
    evidence_tier: str
    last_activity: float


#: audit rows per page of :meth:`Audit.iter_audit_batches`: one query per page costs little,
#: and a page this small stays in the CPU caches and is freed before the cyclic GC scans it
AUDIT_PAGE_ROWS = 1000


def check_needle(needle: object) -> None:
    """InvalidInput unless ``needle`` (of :meth:`Audit.iter_audit_naming`) is non-empty bytes."""
    if type(needle) is not bytes or not needle:
        raise InvalidInput("the needle of an audit search must be non-empty bytes")


class Records(Protocol):
    """The long-term records of the three memories."""

    @abstractmethod
    def get_episodes(self, ids: Sequence[str]) -> list[EpisodicRecord]:
        """Records in the order of ``ids``; raises NotFound for an unknown id."""

    @abstractmethod
    def find_episodes(self, ids: Sequence[str]) -> dict[str, EpisodicRecord]:
        """The records of those ids that exist (unknown ids are left out)."""

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
    def semantic_created_before(self, before: float) -> list[SemanticState]:
        """ACTIVE and SUPERSEDED semantic versions created at or before ``before`` (decay)."""

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
    def has_patient(self, patient_id: str) -> bool:
        """Whether the patient has any stored record."""

    @abstractmethod
    def record_ids(self, table: RecordTable, patient_id: str) -> list[str]:
        """Ids of a patient's ACTIVE and SUPERSEDED rows of one table, oldest first."""

    @abstractmethod
    def studies(self, patient_id: str) -> set[str]:
        """Study ids already stored for a patient (to make ingest idempotent)."""

    @abstractmethod
    def study_episodes(self, patient_id: str, study_id: str, limit: int | None = None) -> list[EpisodicRecord]:
        """The patient's episodes of one study, its active ones first, then newest first (the
        first ``limit`` of them, all when None); empty when the patient has no episode of that
        study (or ``study_id`` is blank). Only the episodes returned are read and decrypted."""

    @abstractmethod
    def last_activity(self, patient_id: str) -> float | None:
        """The newest ``created_at`` (UTC seconds, the store's clock) among the patient's ACTIVE
        and SUPERSEDED episodic, visual, semantic and claim rows; None when there is none."""

    @abstractmethod
    def decay_due(
        self, now: float, retention_s: float, weights: Mapping[str, float], default_weight: float
    ) -> list[DecayDue]:
        """ACTIVE and SUPERSEDED long-term rows (episodic, visual, semantic, claims; in that
        order of tables, by id) whose patient's :meth:`last_activity` plus ``retention_s x
        (confidence x weight)`` is at or before ``now``; ``weight`` is ``weights[evidence tier]``
        (``default_weight`` for another tier); a semantic version keeps the whole
        ``retention_s`` (its confidence reads 1). The anonymised pool (no patient) is never due."""


class Erasable(Protocol):
    """What erasing a patient reads first."""

    @abstractmethod
    def patient_rows(self, patient_id: str) -> dict[str, list[str]]:
        """The ids of every row of the patient (every state) in each table of
        :data:`~msm_mem._storage.batch.ERASED_TABLES`, by id: what an :class:`Erasure` destroys."""


class Vectors(Protocol):
    """Exact cosine search over the episodic and visual vectors."""

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


class Tiers(Protocol):
    """Claims, the knowledge graph derived from them, and short-term items."""

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


class Audit(Protocol):
    """The append-only audit rows; only :meth:`audit_purge` (retention) ever removes any.

    A store of several lanes (:mod:`.lanes`) keeps one chain per lane: chain ``c`` is the rows
    whose ``seq % audit_chains()`` is ``c``. Every method taking ``chain`` means chain 0, the
    only one, by default."""

    def audit_chains(self) -> int:
        """How many audit chains (patient lanes) the store keeps: 1 unless made with more."""
        return 1

    @abstractmethod
    def audit_head(self, chain: int = 0) -> tuple[int, str]:
        """``(seq, event_hash)`` of the chain's last audit event, or its ``(base seq, base hash)``."""

    @abstractmethod
    def audit_base(self, chain: int = 0) -> tuple[int, str]:
        """``(seq, hash)`` the stored chain continues from: ``(chain, GENESIS)`` unless purged."""

    def audit_heads(self) -> tuple[tuple[int, str], ...]:
        """:meth:`audit_head` of every chain, in chain order (inside a write: what it sees)."""
        return tuple(self.audit_head(chain) for chain in range(self.audit_chains()))

    def iter_audit(self, start_seq: int = 1) -> Iterator[AuditRow]:
        """Stored audit rows with seq >= start_seq, ascending."""
        for rows in self.iter_audit_batches(start_seq):
            yield from map(AuditRow._make, rows)

    def iter_audit_naming(self, needle: bytes, start_seq: int = 1) -> Iterator[AuditRow]:
        """The stored audit rows with seq >= start_seq, ascending, whose payload holds the bytes
        ``needle`` or does not match its hash: a row is left out only when its bytes lack the
        needle and its hash holds. A patient's view of the chain reads these (the needle its
        pseudonym), so a changed row of another patient still shows."""
        check_needle(needle)
        for rows in self.iter_audit_batches(start_seq):
            for seq, payload, event_hash in rows:
                raw = bytes(payload)
                if needle in raw or hashlib.sha256(raw).hexdigest() != event_hash:
                    yield AuditRow(seq, raw, event_hash)

    @abstractmethod
    def iter_audit_batches(
        self, start_seq: int = 1, chain: int | None = None
    ) -> Iterator[list[tuple[int, bytes, str]]]:
        """Stored audit rows with seq >= start_seq, ascending, as plain ``(seq, payload,
        event_hash)`` tuples in pages of :data:`AUDIT_PAGE_ROWS` (the last may be shorter, none
        is empty); for the hash walk of a verification, which would otherwise spend more time
        building records than hashing. ``chain``: that chain's rows only (None: every row)."""

    @abstractmethod
    def audit_purge(self, through_seq: int) -> int:
        """Delete audit rows with seq <= through_seq (retention is checked by the caller)."""


class WrappedKeyTable(Protocol):
    """Storage of wrapped data keys and the encrypted pseudonym of each patient."""

    def get(self, patient_ref: str) -> WrappedKey | None: ...

    def get_by_id(self, key_id: str) -> WrappedKey | None: ...

    def put(self, key: WrappedKey) -> None: ...

    def shred(self, patient_ref: str, tomb_ref: str | None = None) -> None: ...

    def all(self) -> list[WrappedKey]: ...

    def pseudonym(self, key_id: str) -> tuple[str, str] | None: ...

    def pseudonyms(self) -> dict[str, tuple[str, str]]:
        """Every stored pseudonym: ``{key_id: (pseudonym, encrypted patient reference)}``."""
        ...

    def put_pseudonym(self, key_id: str, pseudonym: str, token: str) -> None: ...


class Keys(Protocol):
    """Where the wrapped per-patient data keys live."""

    @abstractmethod
    def keys(self) -> WrappedKeyTable:
        """The table of wrapped per-patient data keys (see governance.keys.WrappedKeyStore)."""


class Consents(Protocol):
    """The consent records."""

    @abstractmethod
    def consents(self, patient_id: str | None = None) -> list[ConsentRecord]:
        """Consent records for a patient and for every patient (``*``); all when None."""


class Store(Records, Erasable, Vectors, Tiers, Audit, Keys, Consents, ABC):
    """A store of record for long-term memory with exact cosine search.

    Invariants every implementation keeps (checked by the contract suite):
    - vectors are unit float32 of ``dim``; the i-th episodic (visual) record in insertion order
      has vector position i;
    - ``search`` is exact: it returns the k largest cosines within the scope, ties broken by
      insertion order, in descending score;
    - at most one ACTIVE semantic state per ``(patient_id, category)``;
    - a failed :meth:`write` leaves nothing behind; one the transition table forbids fails;
    - no PHI field is written or read before :meth:`use_codec` is given an encrypting codec;
    - every write keeps the row digests (:mod:`.row_digest`) equal to those of the rows, and
      none is accepted before :meth:`use_row_key`.
    """

    dim: int
    encoder_name: str
    #: random id of this store, bound into every ciphertext's AAD (and the row digests' key)
    store_id: str
    #: the tenant (distribution column) of every row of this store; tenants sharing the tables
    #: of one database are separate stores, none reading another's rows
    tenant: str

    def sync(self) -> None:  # noqa: B027  (an optional hook: a store without caches has nothing to do)
        """Drop read caches made stale by other connections' commits (default: none kept)."""

    def prefetch(  # noqa: B027  (an optional hook, as sync)
        self, patient_ids: Sequence[str], queries: Sequence[tuple[str, Vector]] = ()
    ) -> None:
        """Read ahead what governed turns of these patients will read (consent records, data keys,
        active semantic states, claims and entities), and the novelty searches of ``queries``
        (for each ``(patient id, query)``, the top hit over the patient's episodic and over
        its visual vectors, as :meth:`max_cosine` asks), where that saves round trips to a
        server; kept until the next :meth:`sync` or write. Reads then return what they would
        have returned at this call. Default: nothing (an embedded store reads locally)."""

    @abstractmethod
    def use_codec(self, codec: FieldCodec) -> None:
        """Set the PHI codec (before any read or write of PHI fields); it must be encrypting."""

    @abstractmethod
    def use_row_key(self, key: bytes) -> None:
        """Set the key of the row digests (at least 32 bytes); writes are refused until then."""

    @abstractmethod
    def row_digests(self) -> dict[str, TableDigest]:
        """The digest of each governed table as the last commit left it (inside a write's
        ``before_commit``: as that write leaves it); see :mod:`.row_digest`."""

    @abstractmethod
    def computed_row_digests(self) -> dict[str, TableDigest]:
        """The digest of each governed table recomputed from its rows (reads every row)."""

    def lane_digests(self) -> dict[int, dict[str, TableDigest]]:
        """:meth:`row_digests` by lane (inside a write's ``before_commit``: of the lanes that
        write changed); ``{0: row_digests()}`` in a store of one lane."""
        return {0: self.row_digests()}

    def computed_lane_digests(self) -> dict[int, dict[str, TableDigest]]:
        """:meth:`computed_row_digests` by lane, every lane."""
        return {0: self.computed_row_digests()}

    #: the store's schema as opened (an older one only for :meth:`upgrade`), and the current one
    schema_version: str
    CURRENT_SCHEMA: ClassVar[str]

    @abstractmethod
    def upgrade(
        self,
        chain: AuditChainer,
        reencode: Callable[[str, str, str], str | None],
        *,
        before_commit: Callable[[], None],
        check: Callable[[], None] | None = None,
    ) -> int:
        """Bring a store opened ``upgrading`` to the current schema in one transaction (see
        :meth:`~msm_mem._storage.sql_write.SqlWriter.upgrade`); returns the tags re-encoded."""

    @abstractmethod
    def write(
        self,
        batch: WriteBatch,
        chain: AuditChainer | None = None,
        *,
        before_commit: Callable[[], None] | None = None,
    ) -> None:
        """Apply the batch in one transaction; raise and store nothing on any error.

        ``chain`` builds the batch's audit rows from the stored chain head ``(seq, event_hash)``
        and is called inside the write transaction, under the store's write lock, so writers
        of several processes can neither collide on a sequence number nor fork the chain.
        ``before_commit`` runs inside the transaction once every row is in place, just before
        the commit; if it raises, nothing is stored (the audit log signs the new chain head
        there)."""

    @abstractmethod
    def close(self) -> None:
        """Flush caches and release the store; later calls fail."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

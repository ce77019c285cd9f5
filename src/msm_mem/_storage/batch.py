"""What one atomic write carries: :class:`WriteBatch`, :class:`StateChange` for existing rows and
:class:`Erasure` for everything of one patient."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .._records import EpisodicRecord, SemanticState, State, VisualRecord
from .._tier_records import AuditRow, Claim, ConsentRecord, Entity, Relationship, StmChange, StmItem, WrappedKey

__all__ = ["ERASED_TABLES", "ChangeableTable", "Erasure", "StateChange", "WriteBatch"]

ChangeableTable = Literal["episodic", "visual", "semantic", "claims", "entities", "relationships"]


@dataclass(frozen=True, slots=True)
class StateChange:
    """Flip one long-term record's state; optionally replace its patient id, id and fields.

    Used for supersession (``ACTIVE -> SUPERSEDED``, the old version kept as it was),
    retraction and anonymisation in place (``new_patient_id=""``, ``new_id`` random, ``fields``
    the content as the anonymiser keeps it). ``expect`` is the state the record must be in, or
    the whole batch fails; ``expect -> to`` must be a long-term state change of the transition
    table.
    """

    table: ChangeableTable
    record_id: str
    expect: State
    to: State
    new_id: str | None = None
    new_patient_id: str | None = None
    fields: tuple[tuple[str, str], ...] = ()


#: the tables an erasure destroys rows of, in the order its counts and audit record ids follow;
#: the rows of ``episodic`` and ``visual`` keep their vector position as empty rows (their
#: random id, no patient, no content, a zero vector), the others are deleted
ERASED_TABLES: tuple[str, ...] = (
    "episodic",
    "visual",
    "semantic",
    "claims",
    "entities",
    "relationships",
    "stm",
    "consents",
)


@dataclass(frozen=True, slots=True)
class Erasure:
    """Everything of one patient a batch destroys (shredding).

    ``rows`` holds, for each of :data:`ERASED_TABLES` in that order, the ids of the patient's
    rows the caller read (every state); the store destroys exactly those and fails the whole
    batch when the patient then still has a row in any of them (a write landed in between).
    The patient's data key is destroyed in the same transaction and its row keeps only
    ``key_ref`` (a keyed digest of the patient id; None: the id) instead of the id; the
    pseudonym link goes.
    """

    patient_id: str
    key_ref: str | None
    rows: tuple[tuple[str, tuple[str, ...]], ...]

    def counts(self) -> dict[str, int]:
        """Rows destroyed per table, in :data:`ERASED_TABLES` order."""
        return {table: len(ids) for table, ids in self.rows}

    def ids(self) -> list[str]:
        """Every id destroyed, table after table."""
        return [i for _, ids in self.rows for i in ids]


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
    #: the patients the batch's audit events are about: with the patients of its rows, they
    #: choose the lanes it locks and the chain its events join in a store of several lanes
    patients: list[str] = field(default_factory=list)
    #: existing data keys rewrapped under a new key-encryption key (key rotation): the same key
    #: id, patient and data key, only ``kek_id`` and ``wrapped`` change
    rewrapped: list[WrappedKey] = field(default_factory=list)
    #: patients whose data key (and pseudonym link) is destroyed with this batch (shredding): a
    #: crash right after the commit cannot leave a live key behind records already retracted
    shred_keys: list[str] = field(default_factory=list)
    #: patients erased with this batch (see :class:`Erasure`), after everything else it writes
    erase: list[Erasure] = field(default_factory=list)
    #: store versions exactly as given (import/restore): no supersession flips, any state
    restore: bool = False

    def __bool__(self) -> bool:
        return any(bool(getattr(self, name)) for name in self.__dataclass_fields__ if name != "restore")

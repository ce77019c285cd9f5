"""Reads of one patient's memory through :class:`~msm_mem.MsmMem`: semantic state and its
history, episodes, visual records, claims and their supersession chains, short-term items.

Each read is a consent-checked turn for the data class it touches and leaves one audit event
naming the ids it returned. Records are immutable; the auditor role reads none of them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from .. import _transitions as tr
from .._records import EpisodicRecord, SemanticState, VisualRecord
from .._tier_records import Claim, StmItem, StmState
from .access import Operation
from .base import _Base

__all__: list[str] = []

_R = TypeVar("_R")


def _id(record: object) -> str:
    for name in ("episode_id", "visual_id", "state_id", "claim_id", "item_id"):
        value = getattr(record, name, None)
        if isinstance(value, str):
            return value
    raise TypeError(f"not a memory record: {type(record).__name__}")


class _Reads(_Base):
    def _read(self, principal: object, patient_id: str, data_class: str, fetch: Callable[[], Sequence[_R]]) -> list[_R]:
        p = self._allow(principal, Operation.READ)
        turn = self._gm.begin(p, patient_id, classes=(data_class,))
        self._gm._check(turn, tr.LTM_ACTIVE, tr.LTM_ACTIVE, tr.Trigger.READ)
        records = list(fetch())
        source = "stm" if data_class == "stm" else "ltm"
        self._gm._event(turn, "read", source, "source", [_id(r) for r in records])
        self._gm.commit(turn)
        return records

    def semantic_state(self, principal: object, patient_id: str, category: str | None = None) -> list[SemanticState]:
        """The patient's active semantic state (one version per category, or just ``category``)."""
        return self._read(principal, patient_id, "semantic", lambda: self._store.semantic_active(patient_id, category))

    def semantic_history(self, principal: object, patient_id: str, category: str = "impression") -> list[SemanticState]:
        """Every version of the patient's semantic state in ``category``, oldest first, each
        naming the version it supersedes."""
        return self._read(principal, patient_id, "semantic", lambda: self._store.semantic_history(patient_id, category))

    def episodes(self, principal: object, patient_id: str) -> list[EpisodicRecord]:
        """The patient's episodic records (every state; superseded ones name their successor
        through ``supersedes`` of the newer record)."""
        return self._read(
            principal,
            patient_id,
            "episodic",
            lambda: self._store.get_episodes(self._store.record_ids("episodic", patient_id)),
        )

    def visuals(self, principal: object, patient_id: str) -> list[VisualRecord]:
        """The patient's visual records."""
        return self._read(
            principal,
            patient_id,
            "visual",
            lambda: self._store.get_visuals(self._store.record_ids("visual", patient_id)),
        )

    def claims(self, principal: object, patient_id: str, key: str | None = None) -> list[Claim]:
        """The patient's active claims (or those under ``key``, e.g. ``study:<id>``)."""
        return self._read(principal, patient_id, "claims", lambda: self._store.claims_active(patient_id, key))

    def claim_history(self, principal: object, patient_id: str, key: str) -> list[Claim]:
        """The supersession chain of one claim key, oldest first."""
        return self._read(principal, patient_id, "claims", lambda: self._store.claim_history(patient_id, key))

    def stm_items(self, principal: object, patient_id: str, state: StmState | None = None) -> list[StmItem]:
        """The patient's short-term items (every state, or just ``state``), with their expiry."""
        return self._read(
            principal, patient_id, "stm", lambda: self._store.stm_list(patient_id=patient_id, state=state)
        )

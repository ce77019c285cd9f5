"""Semantic memory: a per-patient, per-category bounded history of impressions (paper 2.2, A.1(e)).

``M_S^p(t) = U_S(M_S^p(t-1), a(t), d(t))``: the update appends the impression and decision with
their time marker and keeps the last N (default 5). It aggregates nothing and decides nothing;
every update is a new version that supersedes the previous one (never an in-place rewrite).
"""

from __future__ import annotations

from .._records import Impression, SemanticState, new_id
from .._storage.base import Store

__all__ = ["DEFAULT_CATEGORY", "SemanticMemory"]

DEFAULT_CATEGORY = "impression"


class SemanticMemory:
    """Reads and versions a patient's semantic state."""

    def __init__(self, store: Store, history: int = 5) -> None:
        self.store = store
        self.history = history

    def get(self, patient_id: str, category: str | None = None) -> list[SemanticState]:
        """``semantic.get(p)``: the patient's active state per category (empty when none)."""
        return self.store.semantic_active(patient_id, category)

    def next_version(
        self,
        current: SemanticState | None,
        patient_id: str,
        impression: Impression,
        *,
        category: str = DEFAULT_CATEGORY,
        created_at: float,
        evidence_tier: str = "agent",
    ) -> SemanticState:
        """The version that supersedes ``current`` with ``impression`` appended (bounded to N).

        Impressions stay ordered by their time marker, so a late-arriving older study lands in
        its place rather than at the end.
        """
        previous = current.impressions if current is not None else ()
        merged = sorted((*previous, impression), key=lambda i: i.timestamp)[-self.history :]
        return SemanticState(
            state_id=new_id("S"),
            patient_id=patient_id,
            category=category,
            impressions=tuple(merged),
            version=(current.version + 1) if current is not None else 1,
            created_at=created_at,
            supersedes=current.state_id if current is not None else None,
            evidence_tier=evidence_tier,
        )

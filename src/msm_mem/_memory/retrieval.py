"""Per-memory retrieval (paper A.1(f)): ``semantic.get(p)``, ``episodic.query(z, k, p)``,
``visual.query(z, k, p)``.

Patient scope is exact: every stored vector of the patient is scored (the paper samples 5K
candidates and then filters, which can miss a patient's own items). The population scope
searches every patient's records, for cross-patient experience.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from .._errors import InvalidInput
from .._records import EpisodicRecord, Hit, SemanticState, Vector, VisualRecord
from .._storage.base import Store, VectorKind
from .ranking import tie_key

__all__ = ["Retrieval", "Scope", "query"]

Scope = Literal["patient", "population", "anonymous"]


@dataclass(frozen=True, slots=True)
class Retrieval:
    """What one retrieval returned; hits are in descending cosine within each memory."""

    semantic: tuple[SemanticState, ...]
    episodic: tuple[Hit, ...]
    visual: tuple[Hit, ...]
    #: the patient's study claims (:mod:`msm_mem._memory.claim_evidence`), read with semantic memory
    claims: tuple[Hit, ...] = ()

    def evidence(self, top_k: int | None = None) -> list[Hit]:
        """Every hit, semantic first (score 1.0), then E, V and claims merged by descending cosine
        (ties: :func:`~.ranking.tie_key`: kind, then the newer evidence first)."""
        sem = [Hit(s.state_id, "semantic", 1.0, s) for s in self.semantic]
        ranked = sorted([*self.episodic, *self.visual, *self.claims], key=lambda h: (-h.score, tie_key(h)))
        hits = sem + ranked
        return hits if top_k is None else hits[:top_k]


def _store_scope(patient_id: str, scope: Scope) -> str | None:
    if scope == "patient":
        return patient_id
    if scope == "population":
        return None
    if scope == "anonymous":
        return ""
    raise InvalidInput(f"unknown retrieval scope {scope!r}: use patient, population or anonymous")


def query(
    store: Store, z: Vector, requests: list[tuple[VectorKind, int]], patient_id: str, scope: Scope = "patient"
) -> list[list[Hit]]:
    """Top-k hits of each requested memory with their records, descending cosine."""
    for _, k in requests:
        if not isinstance(k, int) or isinstance(k, bool) or k < 0:
            raise InvalidInput(f"k must be a non-negative integer, got {k!r}")
    results = store.search_many(z, requests, _store_scope(patient_id, scope))
    out: list[list[Hit]] = []
    for (kind, _), pairs in zip(requests, results, strict=True):
        ids = [i for i, _ in pairs]
        if not ids:
            out.append([])
            continue
        records: Sequence[EpisodicRecord | VisualRecord] = (
            store.get_episodes(ids) if kind == "episodic" else store.get_visuals(ids)
        )
        out.append([Hit(i, kind, s, r) for (i, s), r in zip(pairs, records, strict=True)])
    return out

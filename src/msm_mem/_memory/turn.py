"""One governed turn: who acts, for which patient, under which consent, and what it stages."""

from __future__ import annotations

from dataclasses import dataclass, field

from .._governance.audit.event import AuditSpec
from .._principal import Principal
from .._records import Hit
from .._storage.base import WriteBatch
from .msm import Staging
from .ranking import Score
from .retrieval import Retrieval

__all__ = ["Ranked", "Turn"]


@dataclass(frozen=True)
class Turn:
    """The writes and audit rows of one turn, committed together.

    Who acts, for whom and under which consent are fixed when the turn begins (frozen): a turn
    begun for one patient can never write under another patient's consent."""

    actor: Principal
    patient_id: str
    consent_id: str
    staging: Staging = field(default_factory=Staging)
    #: audit events of the turn, chained and written at commit
    audit: list[AuditSpec] = field(default_factory=list)

    @property
    def purpose(self) -> str:
        return self.actor.purpose.value

    @property
    def batch(self) -> WriteBatch:
        return self.staging.batch


@dataclass(frozen=True, slots=True)
class Ranked:
    """A retrieval reranked by ``cosine x composite_k``, with every factor per hit."""

    retrieval: Retrieval
    ranked: tuple[tuple[Hit, Score], ...]

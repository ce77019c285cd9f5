"""Ranking of long-term evidence: ``composite_k = confidence x freshness x evidence_tier_weight``.

- ``confidence`` in [0, 1] is stored with each record;
- ``freshness = 0.5 ** (age / half_life(kind))``, exponential decay with a half-life per kind of
  memory (:data:`HALF_LIFE_DAYS`); ``age`` is the time between the evidence's observation
  (its ``timestamp``) and the query, clamped at 0, in seconds;
- ``evidence_tier_weight`` from :data:`TIER_WEIGHTS` (a signed report outranks the agent's
  own impression).

Retrieval reranks by ``cosine x composite_k``. The same scorer sets ``decay_at``: the time
after ``created_at`` when ``confidence x tier_weight x freshness`` falls below
:data:`DECAY_THRESHOLD`, i.e. ``created_at + half_life x log2(confidence x weight / threshold)``
(immediately when ``confidence x weight`` is already below the threshold).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .._records import EpisodicRecord, Hit, SemanticState, VisualRecord

__all__ = ["DECAY_THRESHOLD", "HALF_LIFE_DAYS", "TIER_WEIGHTS", "Score", "composite", "decay_at", "rerank"]

DAY = 86_400.0
HALF_LIFE_DAYS: dict[str, float] = {"episodic": 365.0, "visual": 365.0, "claims": 365.0, "semantic": 180.0}
TIER_WEIGHTS: dict[str, float] = {
    "ground_truth": 1.0,  # the data set's reference (base memory)
    "report": 1.0,  # a signed report arriving after the answer
    "critic": 0.95,  # a critic's accepted or corrected verdict
    "clinician": 0.9,
    "agent": 0.6,  # the agent's own, unverified impression
    "population": 0.5,
}
DEFAULT_TIER_WEIGHT = 0.5
DECAY_THRESHOLD = 0.05


@dataclass(frozen=True, slots=True)
class Score:
    """The factors of one hit's rank; ``rank = cosine x composite``."""

    cosine: float
    confidence: float
    freshness: float
    tier_weight: float

    @property
    def composite(self) -> float:
        return self.confidence * self.freshness * self.tier_weight

    @property
    def rank(self) -> float:
        return self.cosine * self.composite


def tier_weight(tier: str) -> float:
    return TIER_WEIGHTS.get(tier, DEFAULT_TIER_WEIGHT)


def freshness(age_s: float, kind: str) -> float:
    """``0.5 ** (age / half_life)`` in (0, 1]; ages below zero count as zero."""
    half = HALF_LIFE_DAYS.get(kind, 365.0) * DAY
    return float(0.5 ** (max(age_s, 0.0) / half))


def composite(confidence: float, age_s: float, tier: str, kind: str) -> float:
    """``confidence x freshness x evidence_tier_weight``, in [0, 1]."""
    return confidence * freshness(age_s, kind) * tier_weight(tier)


def decay_at(created_at: float, confidence: float, tier: str, kind: str) -> float:
    """When the record's composite (aged from ``created_at``) falls below the threshold."""
    start = confidence * tier_weight(tier)
    if start <= DECAY_THRESHOLD:
        return created_at
    return created_at + HALF_LIFE_DAYS.get(kind, 365.0) * DAY * math.log2(start / DECAY_THRESHOLD)


def score(hit: Hit, now: float) -> Score:
    """The factors of one hit at query time ``now``."""
    r = hit.record
    if isinstance(r, (EpisodicRecord, VisualRecord)):
        return Score(hit.score, r.confidence, freshness(now - r.timestamp, hit.kind), tier_weight(r.evidence_tier))
    assert isinstance(r, SemanticState)
    last = r.last.timestamp if r.last else now
    return Score(hit.score, 1.0, freshness(now - last, "semantic"), tier_weight(r.evidence_tier))


def rerank(hits: list[Hit], now: float) -> list[tuple[Hit, Score]]:
    """Hits with their factors, by descending ``cosine x composite_k`` (ties: cosine, id)."""
    scored = [(h, score(h, now)) for h in hits]
    scored.sort(key=lambda hs: (-hs[1].rank, -hs[1].cosine, hs[0].id))
    return scored

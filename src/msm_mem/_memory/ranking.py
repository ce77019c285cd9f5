"""Ranking of long-term evidence: ``composite_k = confidence x freshness x evidence_tier_weight``.

- ``confidence`` in [0, 1] is stored with each record;
- ``freshness = 0.5 ** (age / half_life(kind))``, exponential decay with a half-life per kind of
  memory (:data:`HALF_LIFE_DAYS`);
- ``evidence_tier_weight`` from :data:`TIER_WEIGHTS` (a signed report outranks the agent's
  own impression).

**One notion of time.** Every age is clinical: from the evidence's clinical time (the time of
the study it is about: an episodic or visual record's ``timestamp``, a semantic state's newest
impression, a claim's study) to the query's clinical time (the asked study's time), clamped at
0, in seconds. When and where a record was ingested never enters a score.

Retrieval reranks by ``cosine x composite_k``, then applies one rule: a verified record
(:data:`VERIFIED_TIERS`: ground truth, a signed report, a critic's or a clinician's verdict)
never ranks below an unverified one about the same study (the same patient and clinical time);
the unverified one's rank is capped at the lowest verified rank of its study
(:attr:`Score.cap`).

**Retention is not ranking.** When a long-term record decays does not depend on its clinical
age: it counts from the patient's last activity in the store (the newest ``created_at``, the
store's clock, among the patient's ACTIVE and SUPERSEDED long-term records: a new study, a
written answer, a critic's verdict), so an imported archive of old studies keeps its history.
:func:`decay_at` is ``last_activity + retention x confidence x tier_weight``: the retention
setting (:attr:`msm_mem.Settings.retention_s`) is what a record of full trust keeps (confidence
1, weight 1: ground truth, a signed report); a critic's verdict keeps 0.95 of it, the agent's
own impression at confidence 0.8 keeps 0.48 of it, a record of confidence 0 goes at the next
sweep. A semantic version (the patient's running summary, written with every study, answer
and verdict) keeps the whole retention whatever its tier: so the newest write outlives every
other record of the patient, and the last activity never moves back while anything is kept.
It is decided at sweep time, never stored: a new activity moves every record of the patient
at once without rewriting any.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from .._records import Claim, EpisodicRecord, Hit, SemanticState, VisualRecord

__all__ = [
    "HALF_LIFE_DAYS",
    "TIER_WEIGHTS",
    "VERIFIED_TIERS",
    "Later",
    "Score",
    "TieKey",
    "clinical_time",
    "composite",
    "decay_at",
    "rank_key",
    "rerank",
    "retention_share",
    "tie_key",
    "verified",
    "verified_first",
]

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
#: the tiers checked by someone other than the agent (every other tier is unverified)
VERIFIED_TIERS = frozenset({"ground_truth", "report", "critic", "clinician"})


@dataclass(frozen=True, slots=True)
class Score:
    """The factors of one hit's rank; ``rank = min(cosine x composite, cap)``.

    ``cap`` is infinite unless the hit is unverified and a verified record about the same
    study ranks lower: then it is that record's rank (see the module docstring)."""

    cosine: float
    confidence: float
    freshness: float
    tier_weight: float
    cap: float = math.inf

    @property
    def composite(self) -> float:
        return self.confidence * self.freshness * self.tier_weight

    @property
    def rank(self) -> float:
        return min(self.cosine * self.composite, self.cap)


def verified(tier: str) -> bool:
    """Whether an evidence tier is verified (:data:`VERIFIED_TIERS`)."""
    return tier in VERIFIED_TIERS


def tier_weight(tier: str) -> float:
    return TIER_WEIGHTS.get(tier, DEFAULT_TIER_WEIGHT)


def freshness(age_s: float, kind: str) -> float:
    """``0.5 ** (age / half_life)`` in (0, 1]; ages below zero count as zero."""
    half = HALF_LIFE_DAYS.get(kind, 365.0) * DAY
    return float(0.5 ** (max(age_s, 0.0) / half))


def composite(confidence: float, age_s: float, tier: str, kind: str) -> float:
    """``confidence x freshness x evidence_tier_weight``, in [0, 1]."""
    return confidence * freshness(age_s, kind) * tier_weight(tier)


def retention_share(confidence: float, tier: str, kind: str) -> float:
    """The share of the retention a record keeps, in [0, 1]: ``confidence x tier_weight``; 1
    for a semantic version (``kind == "semantic"``, see the module docstring)."""
    return 1.0 if kind == "semantic" else confidence * tier_weight(tier)


def decay_at(last_activity: float, confidence: float, tier: str, retention_s: float, kind: str = "claims") -> float:
    """When a long-term record decays (UTC seconds): ``last_activity + retention_s x
    retention_share(confidence, tier, kind)``, ``last_activity`` the patient's newest long-term
    write (UTC seconds, the store's clock), ``confidence`` in [0, 1], ``retention_s`` > 0 (see
    the module docstring). The sweep and every read compute it the same way."""
    return last_activity + retention_s * retention_share(confidence, tier, kind)


def clinical_time(hit: Hit) -> float | None:
    """The clinical time of a hit's evidence (UTC seconds): a record's ``timestamp``, a
    semantic state's newest impression, a claim's study time; None when unknown."""
    r = hit.record
    if isinstance(r, (EpisodicRecord, VisualRecord)):
        return r.timestamp
    if isinstance(r, SemanticState):
        return r.last.timestamp if r.last else None
    return hit.time


@dataclass(frozen=True, slots=True)
class Later:
    """A study id in reverse order: of two studies of one clinical time, the later one (by id,
    as ingestion and the evaluation protocol take them) sorts first."""

    study: str

    def __lt__(self, other: Later) -> bool:
        return self.study > other.study


#: :func:`tie_key`: kind, minus the clinical time, patient, study in reverse, content, id
TieKey = tuple[str, float, str, Later, str, str]


def tie_key(hit: Hit) -> TieKey:
    """How hits that score the same are ordered: by what they are about, never first by their
    ids, which are random, so the same memory ingested again lists its evidence the same way.

    By kind (claim, episodic, semantic, visual), then the newer clinical time first (the
    patient's latest evidence leads; unknown times last), patient, the later study first (an
    episode's study id, a claim's key, a visual record's view tag, a semantic state's category:
    of studies of one time, ingestion and the evaluation protocol take the smaller id first),
    content (an episode's question and answer, a claim's content, a visual record's image path,
    a semantic state's last impression), and only then the id."""
    r = hit.record
    when = clinical_time(hit)
    if isinstance(r, EpisodicRecord):
        study, content = r.study_id, f"{r.question}\n{r.answer}"
    elif isinstance(r, VisualRecord):
        study, content = r.visual_tag, r.media_path
    elif isinstance(r, SemanticState):
        study, content = r.category, r.last.text if r.last else ""
    else:
        study, content = r.key, r.content
    return (hit.kind, math.inf if when is None else -when, r.patient_id, Later(study), content, hit.id)


def _factors(hit: Hit, now: float) -> Score:
    r = hit.record
    when = clinical_time(hit)
    age = 0.0 if when is None else now - when
    if isinstance(r, (EpisodicRecord, VisualRecord, Claim)):
        kind = "claims" if isinstance(r, Claim) else hit.kind
        return Score(hit.score, r.confidence, freshness(age, kind), tier_weight(r.evidence_tier))
    return Score(hit.score, 1.0, freshness(age, "semantic"), tier_weight(r.evidence_tier))


def score(hit: Hit, now: float) -> Score:
    """The factors of one hit at query time ``now`` (no cap: :func:`rerank` sets it)."""
    return _factors(hit, now)


def _study(hit: Hit) -> tuple[str, float] | None:
    owner = getattr(hit.record, "patient_id", "")
    when = clinical_time(hit)
    return None if not owner or when is None else (owner, when)


def _tier(hit: Hit) -> str:
    return hit.record.evidence_tier


def rerank(hits: list[Hit], now: float) -> list[tuple[Hit, Score]]:
    """Hits with their factors, by descending rank (ties: verified first, then cosine, :func:`tie_key`),
    each unverified hit capped by :func:`verified_first`."""
    return verified_first([(h, score(h, now)) for h in hits])


def verified_first(pairs: list[tuple[Hit, Score]]) -> list[tuple[Hit, Score]]:
    """The pairs with every unverified hit's rank capped at the lowest verified rank about the
    same study among them, in the order of :func:`rank_key`. Evidence gathered by several reads
    is capped over all of them."""
    floor: dict[tuple[str, float], float] = {}
    for h, sc in pairs:
        key = _study(h)
        if key is not None and verified(_tier(h)):
            floor[key] = min(floor.get(key, math.inf), sc.rank)
    capped = []
    for h, sc in pairs:
        key = _study(h)
        if key in floor and not verified(_tier(h)) and sc.rank > floor[key]:
            sc = replace(sc, cap=floor[key])
        capped.append((h, sc))
    capped.sort(key=rank_key)
    return capped


def rank_key(pair: tuple[Hit, Score]) -> tuple[float, bool, float, TieKey]:
    """The order of :func:`rerank`: descending rank, verified first, descending cosine, then
    :func:`tie_key` (the newer evidence first)."""
    hit, sc = pair
    return (-sc.rank, not verified(_tier(hit)), -sc.cosine, tie_key(hit))

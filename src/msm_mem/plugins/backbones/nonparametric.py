"""The memory-conditioned nonparametric backbone: the honest CPU baseline.

It does not read the image or generate text. It answers with the impression that the
retrieved evidence supports most: every candidate votes for its (normalised) answer text with
its ranking weight (cosine x composite_k), the most recent semantic impression with its weight
times ``semantic_weight`` (so an old or unverified impression weighs what its rank says, never
a fixed amount); the answer with the largest total wins (ties: the most recent
evidence, then the lexicographically smallest text, so the result is deterministic). With no
patient evidence it votes over the population prior (nearest neighbours of other patients, or
anonymised experience). With nothing at all it says so.
"""

from __future__ import annotations

from collections import defaultdict

from .base import BackboneReply, BackboneRequest, Candidate

__all__ = ["NonparametricBackbone"]

EMPTY_ANSWER = "No prior evidence in memory."


def _key(text: str) -> str:
    return " ".join(text.lower().split())


class NonparametricBackbone:
    """Similarity-weighted vote over retrieved answers (see module docstring)."""

    name = "nonparametric"

    def __init__(self, semantic_weight: float = 1.0) -> None:
        self.semantic_weight = semantic_weight

    def _vote(self, candidates: tuple[Candidate, ...], source: str) -> BackboneReply | None:
        usable = [c for c in candidates if c.text.strip()]
        if not usable:
            return None
        score: dict[str, float] = defaultdict(float)
        latest: dict[str, float] = defaultdict(lambda: float("-inf"))
        first: dict[str, Candidate] = {}
        cited: dict[str, list[str]] = defaultdict(list)
        last_semantic = max((c for c in usable if c.kind == "semantic"), key=lambda c: (c.time, c.id), default=None)
        for c in usable:
            k = _key(c.text)
            scale = self.semantic_weight if c is last_semantic else 1.0
            score[k] += max(c.weight, 0.0) * scale
            latest[k] = max(latest[k], c.time)
            cited[k].append(c.id)
            if k not in first or c.time > first[k].time:
                first[k] = c
        best = min(score, key=lambda k: (-score[k], -latest[k], k))
        total = sum(score.values()) or 1.0
        winner = first[best]
        return BackboneReply(
            answer=winner.text.strip(),
            cited=tuple(dict.fromkeys(cited[best])),
            decision=winner.decision,
            confidence=score[best] / total,
            source=source,
        )

    def generate(self, request: BackboneRequest) -> BackboneReply:
        """Vote over the patient's evidence, else the population prior, else say there is none."""
        return (
            self._vote(request.candidates, "memory")
            or self._vote(request.prior, "population-prior")
            or BackboneReply(EMPTY_ANSWER, source="empty")
        )

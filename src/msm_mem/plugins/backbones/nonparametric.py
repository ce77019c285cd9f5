"""The memory-conditioned nonparametric backbone: the honest CPU baseline.

It does not read the image or generate text. It answers the question asked with the answer
the retrieved evidence supports most:

1. **The patient's evidence of the same question first.** When some of the patient's evidence
   answered the question asked (its question key equals the request's), only that evidence
   votes; among it, when a
   verified answer exists (evidence tier weight at least 0.95: ground truth, a signed report, a
   critic's verdict), the newest verified answer of the patient is the answer: an outcome that
   changes within a patient (in the ICU, then out) is answered as it stands now, not by the
   count of older answers.
2. **Else the patient's evidence of the same form.** A question that asks yes or no (it opens
   with an auxiliary verb: is, are, was, does, did, has, can, ...) is answered only from
   evidence that says yes or no; an open question (what, which, where, how, ...) never from a
   bare yes or no; a question of no telling form from any evidence.
3. **Else population experience:** other patients' answers to the same question, then their
   evidence of the same form; and only then the whole evidence of the patient, then of the
   population.
4. **The vote** (within whichever step answers). Every candidate votes for its (normalised)
   answer text with its ranking weight (cosine x composite_k), the most recent semantic
   impression with its weight times ``semantic_weight`` (so an old or unverified impression
   weighs what its rank says, never a fixed amount); the answer with the largest total wins
   (ties: the most recent evidence, then the lexicographically smallest text, so the result is
   deterministic).

With no patient evidence it votes over the population prior (nearest neighbours of other
patients, or anonymised experience). With nothing at all it says so.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence

from .base import BackboneReply, BackboneRequest, Candidate

__all__ = ["NonparametricBackbone"]

EMPTY_ANSWER = "No prior evidence in memory."
#: the evidence tier weight from which an answer counts as verified
VERIFIED_TIER = 0.95

_YES_NO_OPENERS = frozenset(
    "is are was were am do does did has have had can could will would should shall may might must".split()
)
_OPEN_OPENERS = frozenset("what which where when why how who whom whose describe list name".split())
_YES_NO_ANSWERS = frozenset({"yes", "no", "y", "n", "true", "false"})
_WORD = re.compile(r"[^\W_]+")


def _key(text: str) -> str:
    return " ".join(text.lower().split())


def _form(question: str) -> str:
    """``yes_no``, ``open`` or "" (not told) from the question's first word."""
    words = _WORD.findall(question.casefold())
    if not words:
        return ""
    return "yes_no" if words[0] in _YES_NO_OPENERS else "open" if words[0] in _OPEN_OPENERS else ""


def _says_yes_or_no(text: str) -> bool:
    words = _WORD.findall(text.casefold())
    return len(words) == 1 and words[0] in _YES_NO_ANSWERS


def _compatible(candidates: Sequence[Candidate], form: str) -> list[Candidate]:
    if form == "yes_no":
        return [c for c in candidates if _says_yes_or_no(c.text)]
    if form == "open":
        return [c for c in candidates if not _says_yes_or_no(c.text)]
    return list(candidates)


def _newest(candidates: Sequence[Candidate]) -> Candidate | None:
    """The newest of ``candidates``; of two at the same time (two views of one study) the one
    retrieval weighed higher, then the one it ranked first: never the record ids, which are
    random, so the same data ingested again answers the same."""
    ranked = list(enumerate(candidates))
    if not ranked:
        return None
    return max(ranked, key=lambda ic: (ic[1].time, ic[1].weight, -ic[0]))[1]


class NonparametricBackbone:
    """Question-aware, similarity-weighted vote over retrieved answers (see module docstring)."""

    name = "nonparametric"

    def __init__(self, semantic_weight: float = 1.0) -> None:
        self.semantic_weight = semantic_weight

    def _vote(self, candidates: Sequence[Candidate], source: str) -> BackboneReply | None:
        usable = [c for c in candidates if c.text.strip()]
        if not usable:
            return None
        score: dict[str, float] = defaultdict(float)
        latest: dict[str, float] = defaultdict(lambda: float("-inf"))
        first: dict[str, Candidate] = {}
        cited: dict[str, list[str]] = defaultdict(list)
        last_semantic = _newest([c for c in usable if c.kind == "semantic"])
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

    def _same_question(
        self, candidates: Sequence[Candidate], key: str, source: str, *, newest_verified: bool
    ) -> BackboneReply | None:
        """The answer from the evidence of the question asked: with ``newest_verified`` (the
        patient's own evidence) the newest verified one, else the vote."""
        same = [c for c in candidates if key and c.question_key == key and c.text.strip()]
        if not same:
            return None
        newest = _newest([c for c in same if c.tier >= VERIFIED_TIER]) if newest_verified else None
        if newest is None:
            return self._vote(same, source)
        agreeing = [c for c in same if _key(c.text) == _key(newest.text)]
        total = sum(max(c.weight, 0.0) for c in same) or 1.0
        return BackboneReply(
            answer=newest.text.strip(),
            cited=tuple(dict.fromkeys(c.id for c in agreeing)),
            decision=newest.decision,
            confidence=sum(max(c.weight, 0.0) for c in agreeing) / total,
            source=source,
        )

    def generate(self, request: BackboneRequest) -> BackboneReply:
        """Answer from the patient's evidence, else the population prior (module docstring),
        else say there is none."""
        key, form = request.question_key, _form(request.question)
        own, prior = request.candidates, request.prior
        return (
            self._same_question(own, key, "memory", newest_verified=True)
            or self._vote(_compatible(own, form), "memory")
            or self._same_question(prior, key, "population-prior", newest_verified=False)
            or self._vote(_compatible(prior, form), "population-prior")
            or self._vote(own, "memory")
            or self._vote(prior, "population-prior")
            or BackboneReply(EMPTY_ANSWER, source="empty")
        )

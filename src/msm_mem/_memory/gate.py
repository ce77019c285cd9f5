"""The outcome-driven write-back gate (paper section 2.4).

An interaction is consolidated into episodic and visual memory only when all three criteria
pass:

- novelty: the maximum cosine between its embedding and the patient's stored embeddings is
  ``< tau`` (a patient with no stored embedding is novel);
- substance: the answer has at least ``min_answer_words`` words;
- clinical relevance: the answer contains at least one lexicon term.

With ``structured`` (``Settings.structured_gate``) an answer shorter than ``min_answer_words``
is a short structured answer (a label, yes/no): novelty alone decides it, and a written one
carries the codes ``novel`` and ``structured_answer``. Longer answers meet all three criteria.

Semantic memory is updated after every interaction whatever the gate decides.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .lexicon import Lexicon

__all__ = ["GateDecision", "WriteBackGate"]

_WORD = re.compile(r"\w+(?:[-']\w+)*")

#: reason codes; a decision carries the codes of the criteria that failed, or of all that passed
NOVEL, NOT_NOVEL = "novel", "not_novel"
LONG_ENOUGH, TOO_SHORT = "answer_long_enough", "answer_too_short"
KEYWORD, NO_KEYWORD = "clinical_keyword", "no_clinical_keyword"
STRUCTURED = "structured_answer"


@dataclass(frozen=True, slots=True)
class GateDecision:
    """Whether to write; ``reasons`` are codes; ``max_cosine`` is None for a new patient."""

    written: bool
    reasons: tuple[str, ...]
    max_cosine: float | None
    keywords: tuple[str, ...] = ()


class WriteBackGate:
    """Decides consolidation from novelty, answer length and clinical keywords."""

    def __init__(self, tau: float, min_answer_words: int, lexicon: Lexicon, *, structured: bool = False) -> None:
        self.tau = tau
        self.min_answer_words = min_answer_words
        self.lexicon = lexicon
        self.structured = structured

    def decide(self, max_cosine: float | None, answer: str) -> GateDecision:
        """Apply the three criteria; the decision lists failed codes, or all passed codes."""
        novel = max_cosine is None or max_cosine < self.tau
        words = len(_WORD.findall(answer))
        keywords = tuple(self.lexicon.find(answer))
        if self.structured and 0 < words < self.min_answer_words:
            if novel:
                return GateDecision(True, (NOVEL, STRUCTURED), max_cosine, keywords)
            return GateDecision(False, (NOT_NOVEL,), max_cosine, keywords)
        passed = [
            NOVEL if novel else None,
            LONG_ENOUGH if words >= self.min_answer_words else None,
            KEYWORD if keywords else None,
        ]
        failed = [code for ok, code in zip(passed, (NOT_NOVEL, TOO_SHORT, NO_KEYWORD), strict=True) if ok is None]
        if failed:
            return GateDecision(False, tuple(failed), max_cosine, keywords)
        return GateDecision(True, (NOVEL, LONG_ENOUGH, KEYWORD), max_cosine, keywords)

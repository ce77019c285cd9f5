"""Answer comparison shared by the router and the evaluation: SQuAD normalisation, exact
match and token F1 (every score in ``[0, 1]``; both empty after normalisation is ``1.0``,
exactly one empty is ``0.0``)."""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter

__all__ = ["exact_match", "normalize_answer", "token_f1"]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_ASCII_PUNCT = frozenset(string.punctuation)


def _is_punct(ch: str) -> bool:
    # string.punctuation is SQuAD's set; Unicode punctuation (en dash, curly quotes) is added
    # because clinical notes copied from PDFs are full of it.
    return ch in _ASCII_PUNCT or unicodedata.category(ch).startswith("P")


def normalize_answer(s: str) -> str:
    """Return ``s`` normalised the SQuAD way, for comparing free-text answers.

    Steps, in SQuAD's order: lowercase; delete punctuation characters (ASCII
    ``string.punctuation`` plus every Unicode ``P*`` category character), deleting rather than
    replacing them so ``"ground-glass"`` becomes ``"groundglass"``; drop the articles ``a``,
    ``an`` and ``the`` as whole words; collapse runs of whitespace to one space and strip.
    The result is idempotent: ``normalize_answer(normalize_answer(s)) == normalize_answer(s)``.
    """
    lowered = s.lower()
    no_punct = "".join(ch for ch in lowered if not _is_punct(ch))
    no_articles = _ARTICLES.sub(" ", no_punct)
    return " ".join(no_articles.split())


def _tokens(s: str) -> list[str]:
    return normalize_answer(s).split()


def exact_match(prediction: str, reference: str) -> float:
    """Return 1.0 when both strings normalise to the same text, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(reference))


def token_f1(prediction: str, reference: str) -> float:
    """Return the SQuAD token F1 in [0, 1] between normalised bags of tokens.

    Overlap counts each token at most as often as it occurs in both (multiset intersection).
    Both empty after normalisation gives 1.0; exactly one empty gives 0.0.
    """
    pred, ref = _tokens(prediction), _tokens(reference)
    if not pred or not ref:
        return float(pred == ref)
    same = sum((Counter(pred) & Counter(ref)).values())
    if same == 0:
        return 0.0
    precision = same / len(pred)
    recall = same / len(ref)
    return 2 * precision * recall / (precision + recall)

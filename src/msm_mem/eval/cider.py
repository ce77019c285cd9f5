"""CIDEr-D (Vedantam et al., 2015), as the COCO caption evaluation computes it.

For every answer the 1- to 4-gram counts of prediction and reference become tf-idf vectors,
the document frequency of an n-gram being the number of references (over the whole corpus)
that contain it and the idf ``log(N) - log(max(1, df))`` for ``N`` references. Per order, the
similarity is the clipped cosine ``sum(min(h, r) * r) / (|h| |r|)`` times the length penalty
``exp(-(l_h - l_r)**2 / (2 sigma**2))`` (``sigma = 6``); an answer's score is 10 times the
mean over the four orders, and the corpus score is the mean over answers. Every choice follows
the reference implementation (``pycocoevalcap.cider.cider_scorer``), including its length
``l``, which counts the text's bigrams, not its words. Tokens are those of
:func:`~msm_mem.eval.metrics.normalize_answer` (the reference implementation tokenises with
the Stanford PTB tokenizer, which needs Java); so scores are comparable with COCO's only on
text that both tokenise alike. Scores are non-negative and usually at most 10.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from .._errors import InvalidInput
from .._memory.answers import _tokens

__all__ = ["CIDER_SIGMA", "cider_d", "cider_d_scores"]

#: the length penalty's standard deviation (tokens), the reference implementation's default
CIDER_SIGMA = 6.0
_N = 4

Grams = Counter[tuple[str, ...]]


def _grams(text: str) -> Grams:
    tokens = _tokens(text)
    return Counter(tuple(tokens[i : i + n]) for n in range(1, _N + 1) for i in range(len(tokens) - n + 1))


def _vector(
    grams: Grams, df: Counter[tuple[str, ...]], log_n: float
) -> tuple[list[dict[tuple[str, ...], float]], list[float], int]:
    vec: list[dict[tuple[str, ...], float]] = [{} for _ in range(_N)]
    norm = [0.0] * _N
    length = 0
    for gram, tf in grams.items():
        n = len(gram) - 1
        weight = float(tf) * (log_n - math.log(max(1.0, float(df[gram]))))
        vec[n][gram] = weight
        norm[n] += weight * weight
        if n == 1:  # the reference implementation's length: the number of bigrams
            length += tf
    return vec, [math.sqrt(x) for x in norm], length


def cider_d_scores(predictions: Sequence[str], references: Sequence[str], *, sigma: float = CIDER_SIGMA) -> list[float]:
    """CIDEr-D of each prediction against its one reference, idf taken over ``references``.

    Raises :class:`InvalidInput` when the sequences differ in length or are empty, or
    ``sigma`` is not a positive finite number."""
    if len(predictions) != len(references):
        raise InvalidInput(f"{len(predictions)} predictions but {len(references)} references")
    if not predictions:
        raise InvalidInput("CIDEr of an empty corpus is undefined")
    if not (sigma > 0 and math.isfinite(sigma)):
        raise InvalidInput(f"sigma must be a positive finite number, got {sigma!r}")
    hyps = [_grams(p) for p in predictions]
    refs = [_grams(r) for r in references]
    df: Counter[tuple[str, ...]] = Counter()
    for grams in refs:
        df.update(grams.keys())
    log_n = math.log(float(len(refs)))
    scores = []
    for h, r in zip(hyps, refs, strict=True):
        vh, nh, lh = _vector(h, df, log_n)
        vr, nr, lr = _vector(r, df, log_n)
        penalty = math.exp(-((lh - lr) ** 2) / (2 * sigma * sigma))
        total = 0.0
        for n in range(_N):
            val = sum(min(w, vr[n].get(g, 0.0)) * vr[n].get(g, 0.0) for g, w in vh[n].items())
            if nh[n] != 0 and nr[n] != 0:
                val /= nh[n] * nr[n]
            total += val * penalty
        scores.append(10.0 * total / _N)
    return scores


def cider_d(predictions: Sequence[str], references: Sequence[str], *, sigma: float = CIDER_SIGMA) -> float:
    """Corpus CIDEr-D: the mean of :func:`cider_d_scores`."""
    scores = cider_d_scores(predictions, references, sigma=sigma)
    return sum(scores) / len(scores)

"""Answer-level text metrics and a patient-level bootstrap.

All text metrics work on the tokens of :func:`normalize_answer` (SQuAD normalisation), so
``"The effusion."`` and ``"effusion"`` are the same answer for every metric here. Every score
lies in ``[0, 1]``. The shared convention for degenerate inputs is SQuAD's: when prediction and
reference both normalise to nothing the score is ``1.0``; when exactly one does it is ``0.0``.

The confidence interval resamples groups (patients), not single answers, because answers from
one patient are correlated and treating them as independent would make intervals too narrow.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

from msm_mem._errors import InvalidInput
from msm_mem._memory.answers import _tokens, exact_match, normalize_answer, token_f1

__all__ = [
    "BLEU_EPSILON",
    "bleu4",
    "bootstrap_ci",
    "class_f1",
    "corpus_bleu",
    "corpus_bleu4",
    "exact_match",
    "normalize_answer",
    "rouge_l",
    "token_f1",
    "yes_no",
]

#: Chen & Cherry (2014) smoothing method 1: an n-gram order with no match counts
#: ``BLEU_EPSILON`` matches instead of 0, so one missing order does not zero the score.
BLEU_EPSILON = 0.1


def _ngrams(tokens: Sequence[str], n: int) -> Counter[tuple[str, ...]]:
    return Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


def _bleu_stats(pred: Sequence[str], ref: Sequence[str]) -> list[tuple[int, int]]:
    """(clipped matches, candidate n-gram count) for n = 1..4."""
    stats = []
    for n in range(1, 5):
        cand = _ngrams(pred, n)
        clipped = sum((cand & _ngrams(ref, n)).values())
        stats.append((clipped, max(len(pred) - n + 1, 0)))
    return stats


def _bleu_from_stats(stats: Sequence[tuple[int, int]], hyp_len: int, ref_len: int) -> float:
    if hyp_len == 0:
        return float(ref_len == 0)
    log_p = 0.0
    for matches, total in stats:
        # Method 1: zero matches -> epsilon; an order with no candidate n-grams (a hypothesis
        # shorter than n) has denominator 0, taken as 1 as in the reference implementation.
        log_p += math.log((matches if matches > 0 else BLEU_EPSILON) / max(total, 1))
    brevity = 1.0 if hyp_len > ref_len else math.exp(1.0 - ref_len / hyp_len)
    return brevity * math.exp(log_p / 4)


def bleu4(prediction: str, reference: str) -> float:
    """Return sentence-level BLEU-4 in [0, 1] on normalised tokens, against one reference.

    Geometric mean of the clipped 1- to 4-gram precisions (uniform weights 1/4) times the brevity
    penalty ``exp(1 - r/c)`` when the prediction (``c`` tokens) is not longer than the reference
    (``r`` tokens). Smoothing is Chen & Cherry method 1: an order with zero matches uses
    :data:`BLEU_EPSILON` matches. So a prediction of fewer than 4 tokens scores below 1 even
    when identical to the reference (``"right lower lobe"`` vs itself gives ``0.1 ** 0.25``).
    Both empty gives 1.0; exactly one empty gives 0.0.
    """
    pred, ref = _tokens(prediction), _tokens(reference)
    if not ref:
        return float(not pred)
    return _bleu_from_stats(_bleu_stats(pred, ref), len(pred), len(ref))


def corpus_bleu(predictions: Sequence[str], references: Sequence[str], *, max_order: int = 4) -> float:
    """Return corpus-level BLEU-``max_order`` (1..4) in [0, 1]: n-gram matches and lengths
    summed over all pairs (not the mean of sentence scores).

    This is sacreBLEU's corpus BLEU (``BLEU(max_ngram_order=max_order, tokenize="none",
    smooth_method="floor", smooth_value=0.1)`` on the :func:`normalize_answer` tokens joined by
    spaces, divided by 100; a test holds the two together): uniform weights, the brevity
    penalty ``exp(1 - r/c)`` when the predictions (``c`` tokens) are not longer than the
    references (``r``), and Chen & Cherry method 1 smoothing (an order with no match counts
    :data:`BLEU_EPSILON` matches). No matching unigram gives 0, and so does an order with no
    n-gram at all (every prediction shorter than it). All references and predictions empty
    gives 1.0. Raises :class:`InvalidInput` when the sequences differ in length, are empty, or
    ``max_order`` is not 1..4.
    """
    if len(predictions) != len(references):
        raise InvalidInput(f"{len(predictions)} predictions but {len(references)} references")
    if not predictions:
        raise InvalidInput("corpus BLEU of an empty corpus is undefined")
    if max_order not in (1, 2, 3, 4):
        raise InvalidInput(f"max_order must be 1, 2, 3 or 4, got {max_order!r}")
    totals = [[0, 0] for _ in range(4)]
    hyp_len = ref_len = 0
    for p, r in zip(predictions, references, strict=True):
        pred, ref = _tokens(p), _tokens(r)
        hyp_len += len(pred)
        ref_len += len(ref)
        for acc, (matches, total) in zip(totals, _bleu_stats(pred, ref), strict=True):
            acc[0] += matches
            acc[1] += total
    if ref_len == 0:
        return float(hyp_len == 0)
    used = totals[:max_order]
    if hyp_len == 0 or used[0][0] == 0 or any(total == 0 for _, total in used):
        return 0.0
    log_p = sum(math.log((m if m > 0 else BLEU_EPSILON) / t) for m, t in used)
    brevity = 1.0 if hyp_len >= ref_len else math.exp(1.0 - ref_len / hyp_len)
    return brevity * math.exp(log_p / max_order)


def corpus_bleu4(predictions: Sequence[str], references: Sequence[str]) -> float:
    """Return corpus-level BLEU-4 in [0, 1]: :func:`corpus_bleu` with ``max_order=4``."""
    return corpus_bleu(predictions, references, max_order=4)


#: normalised answers read as yes or no (anything else is neither: a wrong yes/no answer)
_YES = frozenset({"yes", "y", "true"})
_NO = frozenset({"no", "n", "false"})


def yes_no(text: str) -> str:
    """``"yes"``, ``"no"`` or ``""`` (neither) for an answer, after :func:`normalize_answer`:
    ``yes``/``y``/``true`` and ``no``/``n``/``false``, alone."""
    norm = normalize_answer(text)
    return "yes" if norm in _YES else "no" if norm in _NO else ""


def class_f1(predictions: Sequence[str], references: Sequence[str]) -> float:
    """Macro F1 in [0, 1] over the classes of the references (each distinct normalised
    reference is a class; a prediction outside them is wrong for every class).

    Per class ``c``: ``F1 = 2 TP / (2 TP + FP + FN)`` with TP = prediction and reference both
    ``c``; the mean over the reference classes. Raises :class:`InvalidInput` when the
    sequences differ in length or are empty."""
    if len(predictions) != len(references):
        raise InvalidInput(f"{len(predictions)} predictions but {len(references)} references")
    if not predictions:
        raise InvalidInput("F1 of no answers is undefined")
    preds = [normalize_answer(p) for p in predictions]
    refs = [normalize_answer(r) for r in references]
    scores = []
    for c in sorted(set(refs)):
        tp = sum(p == c and r == c for p, r in zip(preds, refs, strict=True))
        fp = sum(p == c and r != c for p, r in zip(preds, refs, strict=True))
        fn = sum(r == c and p != c for p, r in zip(preds, refs, strict=True))
        scores.append(2 * tp / (2 * tp + fp + fn))
    return sum(scores) / len(scores)


def _lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    if len(a) < len(b):
        a, b = b, a
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b, start=1):
            cur.append(prev[j - 1] + 1 if x == y else max(prev[j], cur[j - 1]))
        prev = cur
    return prev[-1]


def rouge_l(prediction: str, reference: str, *, beta: float = 1.0) -> float:
    """Return ROUGE-L F in [0, 1] from the longest common subsequence of normalised tokens.

    ``P = LCS/len(prediction)``, ``R = LCS/len(reference)``,
    ``F = (1 + beta**2) P R / (R + beta**2 P)``; ``beta = 1`` is the harmonic mean.
    Both empty gives 1.0; exactly one empty, or no common token, gives 0.0.
    """
    if beta <= 0 or not math.isfinite(beta):
        raise InvalidInput(f"beta must be a positive finite number, got {beta!r}")
    pred, ref = _tokens(prediction), _tokens(reference)
    if not pred or not ref:
        return float(pred == ref)
    lcs = _lcs_length(pred, ref)
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(pred), lcs / len(ref)
    b2 = beta * beta
    return (1 + b2) * precision * recall / (recall + b2 * precision)


def bootstrap_ci(
    values_by_group: Mapping[str, Sequence[float]],
    *,
    n_resamples: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Return ``(mean, low, high)``: the pooled mean and a percentile bootstrap interval.

    ``mean`` is the mean over all values of all groups (a group with more values weighs more).
    Each of ``n_resamples`` resamples draws as many groups as there are (non-empty) groups,
    with replacement, and takes the pooled mean of the values of the drawn groups; ``low`` and
    ``high`` are the ``alpha/2`` and ``1 - alpha/2`` quantiles (linear interpolation) of those
    means. Groups are taken in sorted key order, so the result depends only on the contents of
    the mapping and ``seed`` (a ``numpy.random.Generator``), never on insertion order. Groups
    with no values are ignored. With one group every resample is that group, so
    ``low == mean == high``.

    Raises :class:`InvalidInput` when there are no values, a value is not finite,
    ``n_resamples < 1`` or ``alpha`` is not in (0, 1).
    """
    if n_resamples < 1:
        raise InvalidInput(f"n_resamples must be at least 1, got {n_resamples}")
    if not 0.0 < alpha < 1.0:
        raise InvalidInput(f"alpha must be in (0, 1), got {alpha!r}")
    sums: list[float] = []
    counts: list[int] = []
    for key in sorted(values_by_group):
        arr = np.asarray(values_by_group[key], dtype=np.float64)
        if arr.ndim != 1:
            raise InvalidInput(f"group {key!r}: values must be a flat sequence of numbers")
        if arr.size == 0:
            continue
        if not np.all(np.isfinite(arr)):
            raise InvalidInput(f"group {key!r} holds a non-finite value")
        sums.append(float(arr.sum()))
        counts.append(arr.size)
    if not counts:
        raise InvalidInput("bootstrap_ci needs at least one value")
    s = np.asarray(sums)
    n = np.asarray(counts, dtype=np.float64)
    # Same formula for the point estimate and the resamples, so one group gives exactly equal
    # numbers rather than ones that differ in the last bit.
    mean = float(s.sum() / n.sum())
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(counts), size=(n_resamples, len(counts)))
    stats = s[idx].sum(axis=1) / n[idx].sum(axis=1)
    low, high = np.quantile(stats, [alpha / 2, 1 - alpha / 2])
    return mean, float(low), float(high)

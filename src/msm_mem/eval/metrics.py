"""Answer-level text metrics and a patient-level bootstrap.

All text metrics work on the tokens of :func:`normalize_answer` (SQuAD normalisation), so
``"The effusion."`` and ``"effusion"`` are the same answer for every metric here. Every score
lies in ``[0, 1]``. The shared convention for degenerate inputs is SQuAD's: when prediction and
reference both normalise to nothing the score is ``1.0``; when exactly one does it is ``0.0``.

The confidence interval resamples groups (patients), not single answers, because answers from
one patient are correlated and treating them as independent would make intervals too narrow.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence

import numpy as np
from rouge_score import rouge_scorer
from sacrebleu.metrics.bleu import BLEU

from msm_mem._errors import InvalidInput
from msm_mem._memory.answers import _tokens, exact_match, normalize_answer, token_f1

__all__ = [
    "BLEU_EPSILON",
    "bootstrap_ci",
    "class_f1",
    "corpus_bleu",
    "exact_match",
    "normalize_answer",
    "rouge_l",
    "token_f1",
    "yes_no",
]

#: sacreBLEU's floor smoothing (Chen & Cherry method 1): an n-gram order with no match counts
#: ``BLEU_EPSILON`` matches instead of 0, so one missing order does not zero the score.
BLEU_EPSILON = 0.1


@functools.cache
def _bleu(max_order: int) -> BLEU:
    return BLEU(
        max_ngram_order=max_order, tokenize="none", smooth_method="floor", smooth_value=BLEU_EPSILON, force=True
    )


def corpus_bleu(predictions: Sequence[str], references: Sequence[str], *, max_order: int = 4) -> float:
    """Return corpus-level BLEU-``max_order`` (1..4) in [0, 1]: n-gram matches and lengths
    summed over all pairs (not the mean of sentence scores), computed by sacreBLEU.

    sacreBLEU's ``BLEU(max_ngram_order=max_order, tokenize="none", smooth_method="floor",
    smooth_value=0.1)`` on the :func:`normalize_answer` tokens joined by spaces, divided by 100:
    uniform weights, the brevity penalty ``exp(1 - r/c)`` when the predictions (``c`` tokens)
    are not longer than the references (``r``), and Chen & Cherry method 1 smoothing (an order
    with no match counts :data:`BLEU_EPSILON` matches). No matching unigram gives 0, and so does
    an order with no n-gram at all (every prediction shorter than it). All references empty
    gives 1.0 when every prediction is empty too, else 0.0 (SQuAD's convention). Raises
    :class:`InvalidInput` when the sequences differ in length, are empty, or ``max_order`` is
    not 1..4.
    """
    if len(predictions) != len(references):
        raise InvalidInput(f"{len(predictions)} predictions but {len(references)} references")
    if not predictions:
        raise InvalidInput("corpus BLEU of an empty corpus is undefined")
    if max_order not in (1, 2, 3, 4):
        raise InvalidInput(f"max_order must be 1, 2, 3 or 4, got {max_order!r}")
    preds = [" ".join(_tokens(p)) for p in predictions]
    refs = [" ".join(_tokens(r)) for r in references]
    if not any(refs):
        return float(not any(preds))
    # sacreBLEU works in percent through exp/log: a perfect score can come back as 100.00000000000004
    return min(1.0, float(_bleu(max_order).corpus_score(preds, [refs]).score) / 100)


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


class _Tokens:
    """rouge-score's tokenizer protocol: the :func:`normalize_answer` tokens, joined by spaces."""

    def tokenize(self, text: str) -> list[str]:
        return text.split()


_ROUGE_L = rouge_scorer.RougeScorer(["rougeL"], tokenizer=_Tokens())


def rouge_l(prediction: str, reference: str, *, beta: float = 1.0) -> float:
    """Return ROUGE-L F in [0, 1] from the longest common subsequence of normalised tokens,
    its precision and recall computed by rouge-score.

    ``P = LCS/len(prediction)``, ``R = LCS/len(reference)``,
    ``F = (1 + beta**2) P R / (R + beta**2 P)``; ``beta = 1`` is the harmonic mean (rouge-score's
    F-measure). Both empty gives 1.0; exactly one empty, or no common token, gives 0.0.
    """
    if beta <= 0 or not math.isfinite(beta):
        raise InvalidInput(f"beta must be a positive finite number, got {beta!r}")
    pred, ref = _tokens(prediction), _tokens(reference)
    if not pred or not ref:
        return float(pred == ref)
    score = _ROUGE_L.score(" ".join(ref), " ".join(pred))["rougeL"]
    precision, recall = float(score.precision), float(score.recall)
    if precision == 0.0:
        return 0.0
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

"""The router's examples and each group's strategy, chosen on the fine-tune patients only.

:mod:`msm_mem.eval.fit` fits a router per question group from the fine-tune patients' online
pass; this module turns that pass into the router's examples and chooses how the group answers
(:data:`~msm_mem.plugins.backbones.fitted_format.STRATEGIES`): the router, the patient's newest
own evidence (what copy-prior does), the nearest evidence of any patient (what nearest neighbour
does), the untrained vote, or the memory-free model.

The choice is a cross-validation over the fine-tune patients: they are cut into folds (sorted
patient order, every ``k``-th patient); for each fold the router is fitted on the other folds'
examples, and every strategy answers the fold's studies (the router with that fold's fit, the
model with its out-of-fold prediction). The strategy with the best mean score under the group's
scorer wins; ties go to the earlier in ``STRATEGIES`` (the router first). No validation or
memory-split answer is read: every example is a fine-tune row. With fewer than two fine-tune
patients there is nothing to hold out and the router is kept.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .._errors import MissingExtra
from .._records import ManifestRow
from ..plugins.backbones.base import BackboneRequest
from ..plugins.backbones.fitted import answer_with, proposals
from ..plugins.backbones.fitted_format import GATE_FEATURES, STRATEGIES

__all__ = ["CORRECT", "Example", "fit_gate", "gate_examples", "patient_folds", "select_strategy"]

#: a proposal is right when its score reaches this
CORRECT = 0.5
Array = npt.NDArray[np.float64]
Scorer = Callable[[str, str], float]
Gate = Callable[[Array], float | None]


@dataclass(frozen=True, slots=True)
class Example:
    """One fine-tune study of the online pass: its row, the request its answer was built from
    and the memory-free model's out-of-fold (answer, probability) for it."""

    row: ManifestRow
    request: BackboneRequest
    model: tuple[str, float] | None


def patient_folds(patients: Sequence[str], k: int) -> list[set[str]]:
    """Up to ``k`` folds of the distinct ``patients``: sorted, every ``k``-th one."""
    ordered = sorted(set(patients))
    return [set(ordered[i::k]) for i in range(min(k, len(ordered)))]


def gate_examples(examples: Sequence[Example], score: Scorer) -> tuple[Array, npt.NDArray[np.int64]]:
    """The router's training set: every proposal's features, labelled 1 when its answer scores
    at least :data:`CORRECT` against the reference."""
    x: list[Array] = []
    y: list[int] = []
    for ex in examples:
        for p in proposals(ex.request, ex.model):
            x.append(p.features)
            y.append(int(score(p.text, ex.row.answer) >= CORRECT))
    return (np.stack(x) if x else np.zeros((0, len(GATE_FEATURES)))), np.array(y, dtype=np.int64)


def fit_gate(x: Array, y: npt.NDArray[np.int64], c: float) -> tuple[Array, float]:
    """A logistic regression (scikit-learn, L-BFGS, inverse penalty ``c``) of rightness on the
    features; a constant router when every proposal is right (or wrong)."""
    if len(set(int(v) for v in y)) < 2:
        mean = min(max(float(np.mean(y)) if len(y) else 0.5, 1e-3), 1 - 1e-3)
        return np.zeros(x.shape[1]), math.log(mean / (1 - mean))
    try:
        from sklearn.linear_model import LogisticRegression
    except ImportError as exc:
        raise MissingExtra("scikit-learn (to fit the fine-tune split; or run eval with --no-fit)", "fit") from exc
    model = LogisticRegression(C=c, max_iter=5000).fit(x, y)
    return np.asarray(model.coef_[0], dtype=np.float64), float(model.intercept_[0])


def _gate(coef: Array, intercept: float) -> Gate:
    def gate(x: Array) -> float:
        a = float(coef @ np.asarray(x, dtype=np.float64)) + intercept
        return 1.0 / (1.0 + math.exp(-a)) if a >= 0 else math.exp(a) / (1.0 + math.exp(a))

    return gate


def select_strategy(
    examples: Sequence[Example], score: Scorer, *, folds: int, router_c: float
) -> tuple[str, dict[str, float]]:
    """The group's strategy and every strategy's cross-validated mean score (module docstring)."""
    parts = patient_folds([ex.row.patient_id for ex in examples], folds)
    if len(parts) < 2:
        return STRATEGIES[0], {}
    scores: dict[str, list[float]] = {s: [] for s in STRATEGIES}
    for held in parts:
        train = [ex for ex in examples if ex.row.patient_id not in held]
        x, y = gate_examples(train, score)
        gate = _gate(*fit_gate(x, y, router_c)) if len(y) else None
        for ex in examples:
            if ex.row.patient_id in held:
                for s in STRATEGIES:
                    reply = answer_with(s, ex.request, ex.model, gate if s == "router" else None)
                    scores[s].append(score(reply.answer, ex.row.answer))
    means = {s: float(np.mean(v)) for s, v in scores.items()}
    best = min(STRATEGIES, key=lambda s: (-means[s], STRATEGIES.index(s)))
    return best, means

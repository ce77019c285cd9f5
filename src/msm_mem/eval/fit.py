"""Fitting on the fine-tune split: the paper's FT and MoE-FT rows, on the CPU.

The paper fine-tunes its backbone on the 60% fine-tune split. Here two things are fitted on the
fine-tune patients only (never a validation or memory-split patient's answer), per question
group ``(question_type, question)``, and saved as one ``fitted.npz``
(:mod:`msm_mem.plugins.backbones.fitted_format`) that the ``fitted`` backbone reads:

1. **The memory-free model** (the paper's FT backbone, the honest "no memory" row): a
   multinomial logistic regression (scikit-learn, L-BFGS) over the encoder's unit embedding of
   the image, standardised per dimension (folded into the saved coefficients). Its classes are
   the answers (after normalisation; wording: the most frequent, ties the smallest) given for
   at least ``min_patients`` (default 2) different fine-tune patients, so no answer unique to one
   patient is written into the file. The same rule serves every question type: a label or a
   yes/no answer is a class; for free text the model can only answer with a text that at least
   two patients share (with nothing shared, the group has no model and the backbone falls back
   to the nonparametric vote). The inverse penalty ``C`` is chosen from ``c_grid`` by grouped
   cross-validation over patients (``folds`` folds, the group's scorer, ties: the smaller C).
2. **The router** (the MoE-FT analogue): the fine-tune patients' studies are answered in time
   order through the online loop (all of S, E and V, the nonparametric backbone, write-back and
   the protocol's feedback) on a copy of the Base memory; for each answer every expert's
   proposal (:func:`msm_mem.plugins.backbones.fitted.proposals`: semantic, episodic, visual,
   claims, population, and the memory-free model's *out-of-fold* prediction, so the router does
   not learn to trust a model on its own training images) is labelled right when the group's
   scorer gives it at least ``CORRECT`` (0.5) against the reference. One logistic regression per
   group (``router_c``) maps the proposal's features to the probability that it is right.
3. **The strategy** (:mod:`msm_mem.eval.fit_select`): how the group answers, chosen by
   cross-validation over the same fine-tune patients among the router, the patient's newest
   own evidence (copy-prior's rule), the nearest evidence of any patient (nearest neighbour's
   rule), the untrained vote and the model alone, so the full memory can fall back to the
   patient's own history or to the population where the fine-tune patients show that to be
   more reliable.

The question type enters as the group key: every group has its own model and router, so a
yes/no or free-text group learns its own weights. Scorers are per question type
(:data:`SCORERS`) and passed in, so new types plug in.
Determinism: no randomness (grouped folds in sorted patient order, L-BFGS from zero).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from .._errors import InvalidInput, MissingExtra
from .._records import ManifestRow
from ..plugins.backbones.base import BackboneReply, BackboneRequest
from ..plugins.backbones.fitted_format import GATE_FEATURES, STRATEGIES, FittedGroup, FittedModels
from ..plugins.backbones.nonparametric import NonparametricBackbone
from .fit_select import CORRECT, Example, fit_gate, gate_examples, patient_folds, select_strategy
from .metrics import exact_match, normalize_answer, token_f1

__all__ = [
    "CORRECT",
    "SCORERS",
    "FitSettings",
    "GroupKey",
    "RecordingBackbone",
    "Scorer",
    "combine_models",
    "fit_classifiers",
    "fit_models",
    "fittable",
    "group_of",
]

GroupKey = tuple[str, str]
Scorer = Callable[[str, str], float]
#: the score in [0, 1] of a prediction against a reference, per question type
SCORERS: dict[str, Scorer] = {"label": token_f1, "yes_no": exact_match, "text": token_f1}
_ABSENT = -50.0  # the intercept of a class absent from a fold's training rows
Array = npt.NDArray[np.float64]
#: unit embeddings by (patient, study), any float dtype
Embeddings = Mapping[tuple[str, str], npt.NDArray[np.floating[Any]]]


def group_of(row: object) -> GroupKey:
    """A row's (or answer's) question group ``(question_type, question)``; an object without a
    ``question_type`` asks free text, like a :class:`~msm_mem._records.ManifestRow` by default."""
    return (str(getattr(row, "question_type", "text") or "text"), str(getattr(row, "question", "")))


def scorer_for(group: GroupKey, scorers: Mapping[str, Scorer]) -> Scorer:
    """The scorer of a group's question type; raises :class:`InvalidInput` for an unknown type."""
    if group[0] not in scorers:
        raise InvalidInput(f"no scorer for question type {group[0]!r}; known: {', '.join(sorted(scorers))}")
    return scorers[group[0]]


@dataclass(frozen=True, slots=True)
class FitSettings:
    """How the fine-tune split is fitted (module docstring)."""

    min_patients: int = 2
    c_grid: tuple[float, ...] = (0.01, 0.1, 1.0, 10.0)
    folds: int = 5
    router_c: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.min_patients, bool) or not isinstance(self.min_patients, int) or self.min_patients < 1:
            raise InvalidInput(f"min_patients must be a positive integer, got {self.min_patients!r}")
        if not self.c_grid or any(not (c > 0 and math.isfinite(c)) for c in self.c_grid):
            raise InvalidInput("c_grid must hold positive finite numbers")
        if isinstance(self.folds, bool) or not isinstance(self.folds, int) or self.folds < 2:
            raise InvalidInput(f"folds must be an integer >= 2, got {self.folds!r}")
        if not (self.router_c > 0 and math.isfinite(self.router_c)):
            raise InvalidInput("router_c must be a positive finite number")

    def to_json(self) -> dict[str, Any]:
        return {
            "min_patients": self.min_patients,
            "c_grid": list(self.c_grid),
            "folds": self.folds,
            "router_c": self.router_c,
        }


def _sklearn() -> Any:
    try:
        from sklearn.linear_model import LogisticRegression
    except ImportError as exc:
        raise MissingExtra("scikit-learn (to fit the fine-tune split; or run eval with --no-fit)", "fit") from exc
    return LogisticRegression


def _fit_lr(x: Array, y: npt.NDArray[np.int64], n_classes: int, c: float) -> tuple[Array, Array]:
    """Standardised multinomial logistic regression -> (coef ``n_classes x d``, intercept) on raw ``x``."""
    present = sorted(set(int(v) for v in y))
    coef = np.zeros((n_classes, x.shape[1]))
    intercept = np.full(n_classes, _ABSENT)
    if len(present) == 1:
        intercept[present[0]] = 0.0
        return coef, intercept
    mean, scale = x.mean(axis=0), x.std(axis=0)
    scale = np.where(scale < 1e-8, 1.0, scale)
    model = _sklearn()(C=c, max_iter=5000).fit((x - mean) / scale, y)
    w, b = np.asarray(model.coef_, dtype=np.float64), np.asarray(model.intercept_, dtype=np.float64)
    if len(present) == 2:  # scikit-learn's binary form: one row for the second class
        w, b = np.vstack([-w[0] / 2, w[0] / 2]), np.array([-b[0] / 2, b[0] / 2])
    for row, cls in enumerate(int(v) for v in model.classes_):
        coef[cls] = w[row] / scale
        intercept[cls] = b[row] - float((w[row] / scale) @ mean)
    return coef, intercept


def _predict(coef: Array, intercept: Array, z: Array) -> tuple[int, float]:
    logits = coef @ z + intercept
    p = np.exp(logits - logits.max())
    p /= p.sum()
    i = int(np.argmax(p))
    return i, float(p[i])


@dataclass(slots=True)
class _Classifier:
    group: GroupKey
    classes: tuple[str, ...]
    coef: Array
    intercept: Array
    examples: int
    patients: int
    c: float
    cv_score: float
    #: out-of-fold (answer, probability) per (patient, study) of every fine-tune row of the group
    oof: dict[tuple[str, str], tuple[str, float]] = field(default_factory=dict)


def _fit_group(
    group: GroupKey, rows: Sequence[ManifestRow], z: Embeddings, fs: FitSettings, score: Scorer
) -> _Classifier | None:
    owners: dict[str, set[str]] = defaultdict(set)
    wording: dict[str, Counter[str]] = defaultdict(Counter)
    for r in rows:
        owners[normalize_answer(r.answer)].add(r.patient_id)
        wording[normalize_answer(r.answer)][r.answer.strip()] += 1
    keys = sorted(k for k in owners if k and len(owners[k]) >= fs.min_patients)
    if not keys:
        return None
    classes = tuple(min(wording[k], key=lambda w: (-wording[k][w], w)) for k in keys)
    index = {k: i for i, k in enumerate(keys)}
    train = [r for r in rows if normalize_answer(r.answer) in index]
    x = np.stack([np.asarray(z[(r.patient_id, r.study_id)], dtype=np.float64) for r in train])
    y = np.array([index[normalize_answer(r.answer)] for r in train], dtype=np.int64)
    folds = patient_folds([r.patient_id for r in train], fs.folds)

    def out_of_fold(c: float, targets: Sequence[ManifestRow]) -> dict[tuple[str, str], tuple[str, float]]:
        out: dict[tuple[str, str], tuple[str, float]] = {}
        for held in folds if len(folds) > 1 else []:
            mask = np.array([r.patient_id not in held for r in train])
            coef, icpt = _fit_lr(x[mask], y[mask], len(classes), c)
            for r in targets:
                if r.patient_id in held:
                    i, p = _predict(coef, icpt, np.asarray(z[(r.patient_id, r.study_id)], dtype=np.float64))
                    out[(r.patient_id, r.study_id)] = (classes[i], p)
        return out

    scored: list[tuple[float, float]] = []
    for c in sorted(fs.c_grid):
        pred = out_of_fold(c, train)
        cv = float(np.mean([score(pred[(r.patient_id, r.study_id)][0], r.answer) for r in train])) if pred else 0.0
        scored.append((cv, c))
    cv_score, best_c = max(scored, key=lambda t: (t[0], -t[1]))
    coef, intercept = _fit_lr(x, y, len(classes), best_c)
    in_folds = {p for f in folds for p in f}
    oof = out_of_fold(best_c, [r for r in rows if r.patient_id in in_folds])
    for r in rows:  # a patient in no fold (every row of theirs unclassed) gets the final model
        if (r.patient_id, r.study_id) not in oof:
            i, p = _predict(coef, intercept, np.asarray(z[(r.patient_id, r.study_id)], dtype=np.float64))
            oof[(r.patient_id, r.study_id)] = (classes[i], p)
    return _Classifier(
        group, classes, coef, intercept, len(train), len({r.patient_id for r in train}), best_c, cv_score, oof
    )


def fit_classifiers(
    rows: Sequence[ManifestRow],
    z: Embeddings,
    *,
    settings: FitSettings | None = None,
    scorers: Mapping[str, Scorer] = SCORERS,
) -> dict[GroupKey, _Classifier]:
    """The memory-free model of every question group of the fine-tune ``rows`` (module
    docstring); ``z`` maps (patient, study) to the unit embedding. Groups with no answer shared
    by ``min_patients`` patients are left out."""
    fs = settings or FitSettings()
    by_group: dict[GroupKey, list[ManifestRow]] = defaultdict(list)
    for r in rows:
        if r.answer.strip():
            by_group[group_of(r)].append(r)
    out: dict[GroupKey, _Classifier] = {}
    for g in sorted(by_group):
        if (clf := _fit_group(g, by_group[g], z, fs, scorer_for(g, scorers))) is not None:
            out[g] = clf
    return out


class RecordingBackbone:
    """The nonparametric backbone, keeping every request it answers (the router's examples)."""

    name = "nonparametric"

    def __init__(self) -> None:
        self.inner = NonparametricBackbone()
        self.requests: list[BackboneRequest] = []

    def generate(self, request: BackboneRequest) -> BackboneReply:
        self.requests.append(request)
        return self.inner.generate(request)


def fit_models(
    rows: Sequence[ManifestRow],
    z: Embeddings,
    requests: Sequence[tuple[ManifestRow, BackboneRequest]],
    *,
    encoder: str,
    settings: FitSettings | None = None,
    scorers: Mapping[str, Scorer] = SCORERS,
    record: Mapping[str, Any] | None = None,
) -> FittedModels:
    """Fit the memory-free models on ``rows`` and the router on ``requests`` (each fine-tune row
    with the request the online loop built for it), every one of them a fine-tune row.

    Raises :class:`InvalidInput` when a request's row is not among ``rows`` (the router sees
    only what the model may see) or when there is nothing to fit."""
    fs = settings or FitSettings()
    known = {(r.patient_id, r.study_id) for r in rows}
    if stray := [r for r, _ in requests if (r.patient_id, r.study_id) not in known]:
        raise InvalidInput(f"router example {stray[0].study_id} of {stray[0].patient_id} is not a fitted row")
    classifiers = fit_classifiers(rows, z, settings=fs, scorers=scorers)
    if not classifiers:
        raise InvalidInput("nothing to fit: no answer is shared by enough fine-tune patients")
    examples: dict[GroupKey, list[Example]] = defaultdict(list)
    for row, request in requests:
        if (clf := classifiers.get(g := group_of(row))) is not None:
            examples[g].append(Example(row, request, clf.oof.get((row.patient_id, row.study_id))))
    groups: list[FittedGroup] = []
    strategy_cv: dict[str, dict[str, float]] = {}
    for g, clf in sorted(classifiers.items()):
        gate_coef: Array | None = None
        gate_intercept, strategy, n_gate = 0.0, STRATEGIES[0], 0
        if ex := examples.get(g, []):
            score = scorer_for(g, scorers)
            x, y = gate_examples(ex, score)
            gate_coef, gate_intercept = fit_gate(x, y, fs.router_c)
            n_gate = len(y)
            strategy, strategy_cv[f"{g[0]}: {g[1]}"] = select_strategy(ex, score, folds=fs.folds, router_c=fs.router_c)
        groups.append(
            FittedGroup(
                g[0],
                g[1],
                clf.classes,
                clf.coef,
                clf.intercept,
                gate_coef,
                gate_intercept,
                clf.examples,
                clf.patients,
                n_gate,
                strategy,
            )
        )
    dim = next(iter(classifiers.values())).coef.shape[1]
    fit = {
        **dict(record or {}),
        "settings": fs.to_json(),
        "model": "multinomial logistic regression over standardised embeddings (scikit-learn, lbfgs)",
        "router": "logistic regression over the proposal features (scikit-learn, lbfgs)",
        "chosen_c": {f"{g[0]}: {g[1]}": clf.c for g, clf in sorted(classifiers.items())},
        "cv_score": {f"{g[0]}: {g[1]}": clf.cv_score for g, clf in sorted(classifiers.items())},
        "gate_features": list(GATE_FEATURES),
        "strategy": "per group, the best cross-validated mean score over the fine-tune patients "
        f"among {', '.join(STRATEGIES)} (ties: the earlier)",
        "strategy_cv": strategy_cv,
    }
    return FittedModels(encoder, int(dim), tuple(groups), fit)


def fittable(rows: Sequence[ManifestRow], settings: FitSettings | None = None) -> bool:
    """Whether some question group of ``rows`` has an answer given for at least
    ``min_patients`` different patients (else :func:`fit_models` has nothing to fit)."""
    fs = settings or FitSettings()
    owners: dict[tuple[GroupKey, str], set[str]] = defaultdict(set)
    for r in rows:
        if key := normalize_answer(r.answer):
            owners[(group_of(r), key)].add(r.patient_id)
    return any(len(p) >= fs.min_patients for p in owners.values())


def combine_models(models: Sequence[FittedModels], record: Mapping[str, Any] | None = None) -> FittedModels | None:
    """One :class:`FittedModels` holding the groups of every one of ``models`` (each fitted on
    its own question group, same encoder and fit settings), with the per-group choices merged
    and ``record`` added; None for no models. Raises :class:`InvalidInput` when they disagree
    on the encoder or the dimension."""
    if not models:
        return None
    first = models[0]
    if any((m.encoder, m.dim) != (first.encoder, first.dim) for m in models):
        raise InvalidInput("fitted groups to combine must share one encoder and dimension")
    fit: dict[str, Any] = {**dict(first.fit), **dict(record or {})}
    for key in ("chosen_c", "cv_score", "strategy_cv"):
        fit[key] = {k: v for m in models for k, v in dict(m.fit.get(key, {})).items()}
    return FittedModels(first.encoder, first.dim, tuple(g for m in models for g in m.groups), fit)

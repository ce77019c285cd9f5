"""Metrics per (scope, mode, phase, arm): overall, per question type, and per question.

A *scope* is ``("all", "")`` (every answer), ``(question_type, "")`` (every answer of that
type) or ``(question_type, question)`` (one question, listed when its type has several). Each
scope is scored by what fits it (every value in [0, 1] except CIDEr-D, in [0, 10]):

- every scope: ``token_f1`` and ``exact_match``, SQuAD-style on normalised answers, mean over
  answers with a 95% percentile bootstrap interval that resamples *patients*
  (:func:`~.metrics.bootstrap_ci`);
- ``all`` (the paper's Table 1 columns): also ``bleu4`` (corpus BLEU-4), ``rouge_l`` (mean
  ROUGE-L F, patient interval), ``finding_f1`` (micro F1 of the 14 CheXpert-style finding
  labels of :mod:`.labeler`, uncertain counted positive, patient interval) and
  ``finding_f1_macro``;
- ``label``: also ``label_f1`` (macro F1 over the distinct reference labels,
  :func:`~.metrics.class_f1`) and the finding F1s;
- ``yes_no``: also ``accuracy`` (the answer read as yes or no by :func:`~.metrics.yes_no`
  equals the reference; anything else is wrong; patient interval) and ``yes_no_f1`` (macro F1
  over yes and no);
- ``text``: also ``bleu1``..``bleu4`` (corpus BLEU, equal to sacreBLEU's), ``rouge_l``
  (equal to rouge-score's), ``cider`` (CIDEr-D, :mod:`.cider`) and the finding F1s.

METEOR is not computed: its standard implementations need the WordNet data, which nothing
here may download at run time. Gate counts (memory configurations only) are in every record:
answers written to long-term memory, answers discarded and the discard reasons.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from .._memory.labeler import finding_f1, label
from .cider import cider_d
from .metrics import bootstrap_ci, class_f1, corpus_bleu, exact_match, rouge_l, token_f1, yes_no
from .recall import evidence_recall
from .records import CONFIGS, FITTED_ARMS, MODES, Answered, ProtocolRun, arm_config
from .split import PHASES

__all__ = [
    "ALL",
    "METRICS",
    "PER_ANSWER",
    "PRIMARY",
    "SCOPE_METRICS",
    "finding_counts",
    "in_scope",
    "scopes",
    "summarise",
]

#: the scope of every answer
ALL = "all"
#: Metric keys with their column titles, in report order.
METRICS: dict[str, str] = {
    "token_f1": "F1",
    "exact_match": "EM",
    "accuracy": "Accuracy",
    "yes_no_f1": "Yes/no F1",
    "label_f1": "Label F1",
    "bleu1": "BLEU-1",
    "bleu2": "BLEU-2",
    "bleu3": "BLEU-3",
    "bleu4": "BLEU-4",
    "rouge_l": "ROUGE-L",
    "cider": "CIDEr-D",
    "finding_f1": "Finding F1",
    "finding_f1_macro": "Finding F1 (macro)",
}
_FINDING = ("finding_f1", "finding_f1_macro")
#: the metrics of each scope's question type (``all``: the paper's Table 1 columns)
SCOPE_METRICS: dict[str, tuple[str, ...]] = {
    ALL: ("token_f1", "exact_match", "bleu4", "rouge_l", *_FINDING),
    "label": ("exact_match", "label_f1", "token_f1", *_FINDING),
    "yes_no": ("accuracy", "yes_no_f1", "exact_match", "token_f1"),
    "text": ("token_f1", "exact_match", "bleu1", "bleu2", "bleu3", "bleu4", "rouge_l", "cider", *_FINDING),
}


@lru_cache(maxsize=65536)
def _positives(text: str) -> frozenset[str]:
    return frozenset(obs for obs, v in label(text).items() if v in (1, -1))


def finding_counts(prediction: str, reference: str) -> tuple[int, int, int]:
    """(TP, FP, FN) of the finding labels of one pair over the 14 observations (uncertain = positive)."""
    p, r = _positives(prediction), _positives(reference)
    return len(p & r), len(p - r), len(r - p)


def _micro(counts: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    tp, fp, fn = counts[..., 0], counts[..., 1], counts[..., 2]
    den = 2 * tp + fp + fn
    return np.where(den == 0, 1.0, 2 * tp / np.maximum(den, 1))


def _finding_ci(answers: Sequence[Answered], n_boot: int, seed: int) -> dict[str, float]:
    by_patient: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for a in answers:
        by_patient[a.patient_id].append(finding_counts(a.prediction, a.reference))
    sums = np.array([np.sum(by_patient[p], axis=0) for p in sorted(by_patient)], dtype=np.float64)
    point = float(_micro(sums.sum(axis=0)))
    idx = np.random.default_rng(seed).integers(0, len(sums), size=(n_boot, len(sums)))
    low, high = np.quantile(_micro(sums[idx].sum(axis=1)), [0.025, 0.975])
    return {"mean": point, "low": float(low), "high": float(high)}


def _ci(answers: Sequence[Answered], fn: Callable[[str, str], float], n_boot: int, seed: int) -> dict[str, float]:
    by_patient: dict[str, list[float]] = defaultdict(list)
    for a in answers:
        by_patient[a.patient_id].append(fn(a.prediction, a.reference))
    mean, low, high = bootstrap_ci(by_patient, n_resamples=n_boot, seed=seed)
    return {"mean": mean, "low": low, "high": high}


def _accuracy(prediction: str, reference: str) -> float:
    return float(yes_no(prediction) == yes_no(reference) != "")


#: each scope's primary metric (the paired bootstrap's, :mod:`msm_mem.eval.bootstrap`)
PRIMARY = {ALL: "token_f1", "label": "exact_match", "yes_no": "accuracy", "text": "token_f1"}
#: the per-answer scores of the primary metrics, in [0, 1]
PER_ANSWER: dict[str, Callable[[str, str], float]] = {
    "token_f1": token_f1,
    "exact_match": exact_match,
    "accuracy": _accuracy,
}


def _metric(key: str, answers: Sequence[Answered], n_boot: int, seed: int) -> dict[str, float]:
    preds, refs = [a.prediction for a in answers], [a.reference for a in answers]
    if key == "token_f1":
        return _ci(answers, token_f1, n_boot, seed)
    if key == "exact_match":
        return _ci(answers, exact_match, n_boot, seed)
    if key == "rouge_l":
        return _ci(answers, rouge_l, n_boot, seed)
    if key == "accuracy":
        return _ci(answers, _accuracy, n_boot, seed)
    if key == "yes_no_f1":
        return {"mean": class_f1([yes_no(p) or "neither" for p in preds], [yes_no(r) for r in refs])}
    if key == "label_f1":
        return {"mean": class_f1(preds, refs)}
    if key.startswith("bleu"):
        return {"mean": corpus_bleu(preds, refs, max_order=int(key[-1]))}
    if key == "cider":
        return {"mean": cider_d(preds, refs)}
    if key == "finding_f1":
        return _finding_ci(answers, n_boot, seed)
    return {"mean": finding_f1(preds, refs)["macro"]}


def _score(kind: str, answers: Sequence[Answered], n_boot: int, seed: int) -> dict[str, Any]:
    gates = [a.gate for a in answers if a.gate]
    reasons = Counter(code for g in gates if g != "written" for code in g.split(":", 1)[1].split("+"))
    return {
        "n": len(answers),
        "patients": len({a.patient_id for a in answers}),
        **{key: _metric(key, answers, n_boot, seed) for key in SCOPE_METRICS[kind]},
        "gate": {
            "written": sum(g == "written" for g in gates),
            "discarded": sum(g != "written" for g in gates),
            "reasons": dict(sorted(reasons.items())),
        },
    }


def scopes(run: ProtocolRun) -> list[tuple[str, str]]:
    """The run's scopes in report order: ``all``, then each question type present, each
    followed by its questions when it has more than one."""
    order = {t: i for i, t in enumerate(SCOPE_METRICS)}
    groups = sorted({(a.question_type, a.question) for a in run.answers}, key=lambda g: (order[g[0]], g[1]))
    out = [(ALL, "")]
    for kind in SCOPE_METRICS:
        mine = [g for g in groups if g[0] == kind]
        if mine:
            out.append((kind, ""))
            if len(mine) > 1:
                out += mine
    return out


def in_scope(answers: Sequence[Answered], kind: str, question: str) -> list[Answered]:
    """The answers of one scope: every answer for ``all``, else those of the type ``kind``
    (and of ``question`` when it is not ``""``)."""
    if kind == ALL:
        return list(answers)
    return [a for a in answers if a.question_type == kind and (not question or a.question == question)]


def summarise(run: ProtocolRun, *, n_boot: int = 1000) -> list[dict[str, Any]]:
    """One metrics record per (scope, mode, phase, arm) that has answers, in that order; each
    carries ``question_type`` (``all`` or a type) and ``question`` (``""`` for a whole type)."""
    groups: dict[tuple[str, str, str, str, str], list[Answered]] = defaultdict(list)
    for a in run.answers:
        for scope in ((ALL, ""), (a.question_type, ""), (a.question_type, a.question)):
            groups[(*scope, a.mode, a.phase, a.arm)].append(a)
    out = []
    for kind, question in scopes(run):
        for mode in MODES:
            for phase in PHASES:
                for arm in run.arms:
                    if answers := groups.get((kind, question, mode, phase, arm)):
                        fixed = arm == "none" and run.memory_free
                        record = {
                            "question_type": kind,
                            "question": question,
                            "mode": mode,
                            "phase": phase,
                            "arm": arm,
                            "kind": "memory-free"
                            if fixed
                            else "memory"
                            if arm in CONFIGS
                            else "fitted"
                            if arm in FITTED_ARMS
                            else "baseline",
                            **_score(kind, answers, n_boot, run.settings.seed),
                        }
                        if arm_config(arm) is not None and not fixed:  # an agent arm: memory or fitted
                            record["evidence_recall"] = evidence_recall(answers)
                        out.append(record)
    return out

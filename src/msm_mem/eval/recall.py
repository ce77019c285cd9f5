"""Evidence recall@k: does the answer's evidence reach the patient's own relevant prior study?

For a query of a patient whose earlier study was answered before it in the same probe (and so
is in the arm's memory), the *relevant prior* is that most recent earlier study. The ranked
evidence trail is read as the distinct studies of the patient its lines are about, in rank order
(episodic, visual and claim lines; the semantic state spans the whole history and population
experience has no study), and the query counts as a hit at ``k`` when the relevant prior is
among the first ``k`` of those studies, so configurations with more kinds of memory are not
penalised for listing one study several times.
Recall@k is the fraction of such queries that hit; queries without a prior (a patient's first
study) are not counted, and baselines, which retrieve no evidence, have none.
"""

from __future__ import annotations

from collections.abc import Sequence

from .records import Answered

__all__ = ["RECALL_K", "evidence_recall"]

#: the cut-offs reported per phase and configuration
RECALL_K = (1, 5)


def evidence_recall(answers: Sequence[Answered], ks: Sequence[int] = RECALL_K) -> dict[str, float | int | None]:
    """``{"n": queries with a relevant prior, "at_<k>": recall@k in [0, 1] (None when n = 0)}``."""
    counted = [a for a in answers if a.prior]
    out: dict[str, float | int | None] = {"n": len(counted)}
    for k in ks:
        hits = sum(a.prior in a.retrieved[:k] for a in counted)
        out[f"at_{k}"] = hits / len(counted) if counted else None
    return out

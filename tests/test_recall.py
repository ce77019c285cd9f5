"""Tests of evidence recall@k (msm_mem.eval.recall)."""

from __future__ import annotations

import pytest

from msm_mem.eval.recall import evidence_recall
from msm_mem.eval.records import Answered


def answered(prior: str, retrieved: tuple[str, ...], study: str = "S9") -> Answered:
    return Answered("frozen", "WB4", "SEV", "P1", study, "a", "a", "", prior=prior, retrieved=retrieved)


def test_recall_counts_the_prior_among_the_first_k_study_linked_items() -> None:
    """A hit at k when the relevant prior is among the first k retrieved studies; first studies are not counted."""
    answers = [
        answered("S1", ("S1", "S0")),  # hit at 1
        answered("S2", ("S0", "S4", "S2")),  # hit at 5, not at 1
        answered("S3", ("S0",)),  # miss
        answered("", ("S0",)),  # a first study: not counted
    ]
    got = evidence_recall(answers)
    assert got["n"] == 3
    assert got["at_1"] == pytest.approx(1 / 3) and got["at_5"] == pytest.approx(2 / 3)


def test_recall_without_queries_is_none() -> None:
    """With no query that has a prior, recall is undefined (None), n is 0."""
    assert evidence_recall([answered("", ())], ks=(3,)) == {"n": 0, "at_3": None}

"""Tests for msm_mem.eval.baselines: population prior, copy-prior, nearest neighbour."""

from __future__ import annotations

import numpy as np
import pytest

from msm_mem._errors import InvalidInput
from msm_mem.eval.baselines import BASELINES, Known, KnownStudies, baseline_answer, majority


def _z(*values: float) -> np.ndarray:
    v = np.asarray(values, dtype=np.float32)
    return v / np.linalg.norm(v)


def _known() -> KnownStudies:
    return KnownStudies(
        [
            Known("p1", 10.0, "s1", "Pleural effusion.", _z(1, 0, 0)),
            Known("p1", 20.0, "s2", "Cardiomegaly.", _z(0, 1, 0)),
            Known("p2", 15.0, "s3", "pleural effusion", _z(0, 0, 1)),
            Known("p3", 5.0, "s4", "Cardiomegaly", _z(0.9, 0.1, 0)),
        ]
    )


def test_prior_is_the_most_frequent_normalised_answer_in_its_latest_wording() -> None:
    """Two effusions vs two cardiomegalies: the tie goes to the smaller text ("cardiomegaly"),
    worded as its latest study (p1 at t=20)."""
    assert _known().prior() == "Cardiomegaly."


def test_prior_counts_after_normalisation() -> None:
    """ "The effusion." and "effusion" are one answer with two votes."""
    known = KnownStudies(
        [
            Known("a", 1, "1", "The effusion.", _z(1, 0)),
            Known("b", 2, "2", "effusion", _z(0, 1)),
            Known("c", 3, "3", "edema", _z(1, 1)),
        ]
    )
    assert known.prior() == "effusion"


def test_copy_prior_takes_the_patients_latest_answer_else_the_prior() -> None:
    """p1's latest is s2 (t=20); an unknown patient gets the population prior."""
    known = _known()
    assert baseline_answer("copy-prior", known, "p1", _z(1, 0, 0)) == "Cardiomegaly."
    assert baseline_answer("copy-prior", known, "nobody", _z(1, 0, 0)) == known.prior()


def test_nearest_neighbour_searches_every_patient() -> None:
    """The query (0, 0, 1) is nearest to p2's study whatever patient asks."""
    assert baseline_answer("nearest-neighbour", _known(), "p1", _z(0, 0.1, 1)) == "pleural effusion"
    assert baseline_answer("nearest-neighbour", _known(), "p1", _z(1, 0.05, 0)) == "Pleural effusion."


def test_learning_updates_every_index() -> None:
    """A new study changes the prior, the patient's last answer and the nearest neighbour."""
    known = _known()
    for t in (30.0, 31.0, 32.0):
        known.add(Known("p2", t, f"n{t}", "Edema.", _z(-1, 0, 0)))
    assert known.prior() == "Edema."
    assert known.last_of("p2") == "Edema."
    assert known.nearest(_z(-1, 0, 0)) == "Edema."


def test_copy_is_independent() -> None:
    """Adding to a copy leaves the original unchanged."""
    known = _known()
    scratch = known.copy()
    scratch.add(Known("p9", 1.0, "x", "Edema.", _z(1, 1, 1)))
    assert len(scratch) == len(known) + 1
    assert known.last_of("p9") == known.prior()


def test_empty_memory_answers_nothing() -> None:
    """With nothing known every baseline answers the empty string."""
    empty = KnownStudies()
    assert [baseline_answer(b, empty, "p", _z(1, 0)) for b in BASELINES] == ["", "", "", ""]


def test_unknown_baseline_is_refused() -> None:
    """A name outside BASELINES raises InvalidInput."""
    with pytest.raises(InvalidInput, match="unknown baseline"):
        baseline_answer("oracle", _known(), "p1", _z(1, 0, 0))


def test_view_baseline_votes_among_studies_of_the_same_view() -> None:
    """PA studies say effusion, AP studies cardiomegaly: the view decides (case-insensitive);
    an unknown or missing view falls back to the population prior."""
    known = KnownStudies(
        [
            Known("a", 1, "1", "effusion", _z(1, 0), "PA"),
            Known("b", 2, "2", "effusion", _z(1, 0), "pa"),
            Known("c", 3, "3", "cardiomegaly", _z(0, 1), "AP"),
            Known("d", 4, "4", "cardiomegaly", _z(0, 1), "AP"),
            Known("e", 5, "5", "cardiomegaly", _z(0, 1), ""),
        ]
    )
    assert baseline_answer("view", known, "x", _z(1, 0), "PA") == "effusion"
    assert baseline_answer("view", known, "x", _z(1, 0), " Ap ") == "cardiomegaly"
    assert baseline_answer("view", known, "x", _z(1, 0), "L") == known.prior() == "cardiomegaly"
    assert baseline_answer("view", known, "x", _z(1, 0)) == "cardiomegaly"


def test_majority_is_the_most_frequent_answer_fixed_from_its_rows() -> None:
    """Three "no" against two "yes" (after normalisation); ties go to the smaller text; no rows
    give the empty answer."""
    assert majority([(1, "a", "No"), (2, "b", "yes"), (3, "c", "no."), (4, "d", "Yes"), (5, "e", "NO")]) == "NO"
    assert majority([(1, "a", "yes"), (2, "b", "no")]) == "no"
    assert majority([]) == ""

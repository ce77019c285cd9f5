"""Tests for msm_mem.eval.split: largest-remainder counts and the subject-level split."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from msm_mem._errors import InvalidInput
from msm_mem.eval.split import (
    PHASE_SHARES,
    PHASES,
    SPLIT_SHARES,
    fold_patients,
    largest_remainder,
    split_patients,
)


def _ids(n: int) -> list[str]:
    return [f"P{i:03d}" for i in range(n)]


# ---------------------------------------------------------------- largest_remainder


def test_covid_sized_split_counts_by_hand() -> None:
    """119 patients: quotas 35.7/71.4/11.9 -> floors 35/71/11, the 2 left go to .9 then .7."""
    assert largest_remainder(119, SPLIT_SHARES) == [36, 71, 12]


def test_phase_counts_of_36_memory_patients_by_hand() -> None:
    """36 x (4,6,6,6,8)/30 = 4.8/7.2/7.2/7.2/9.6 -> floors 4/7/7/7/9, 2 left go to .8 and .6."""
    assert largest_remainder(36, PHASE_SHARES) == [5, 7, 7, 7, 10]


def test_ties_in_remainders_go_to_the_earlier_part() -> None:
    """1 item over equal shares goes to the first part; 2 items to the first two."""
    assert largest_remainder(1, [1, 1, 1]) == [1, 0, 0]
    assert largest_remainder(2, [1, 1, 1]) == [1, 1, 0]


def test_every_part_gets_one_when_there_are_enough_items() -> None:
    """5 items over the phase shares: quotas .67/1/1/1/1.33 would leave Base empty; it takes one."""
    assert largest_remainder(5, PHASE_SHARES) == [1, 1, 1, 1, 1]
    assert largest_remainder(3, SPLIT_SHARES) == [1, 1, 1]


def test_too_few_items_may_leave_parts_empty() -> None:
    """With fewer items than parts the plain largest remainder stands (no part can be forced)."""
    assert largest_remainder(2, PHASE_SHARES) == [0, 1, 0, 0, 1]
    assert largest_remainder(0, SPLIT_SHARES) == [0, 0, 0]


@pytest.mark.parametrize(
    ("n", "shares"), [(-1, [1.0]), (3, []), (3, [0.0, 0.0]), (3, [1.0, -1.0]), (3, [float("nan"), 1.0])]
)
def test_bad_arguments_are_refused(n: int, shares: list[float]) -> None:
    """A negative count, no shares, all-zero, negative or NaN shares raise InvalidInput."""
    with pytest.raises(InvalidInput):
        largest_remainder(n, shares)


@given(st.integers(0, 500), st.lists(st.floats(0.01, 100), min_size=1, max_size=8))
def test_counts_add_up_and_stay_near_their_quotas(n: int, shares: list[float]) -> None:
    """Counts sum to n; none exceeds the ceiling of its quota (or 1, when forced up to one);
    with at least as many items as parts, none is 0."""
    counts = largest_remainder(n, shares)
    assert sum(counts) == n
    total = sum(shares)
    for count, share in zip(counts, shares, strict=True):
        assert count <= max(math.ceil(n * share / total), 1)
    if n >= len(shares):
        assert min(counts) >= 1


def test_a_zero_share_gets_nothing() -> None:
    """A part with share 0 is never forced up to one."""
    assert largest_remainder(10, [1.0, 0.0, 1.0]) == [5, 0, 5]


# ---------------------------------------------------------------- split_patients


def test_split_of_119_patients_has_the_documented_sizes() -> None:
    """119 patients -> 36 memory (5/7/7/7/10), 71 fine-tune, 12 validation."""
    s = split_patients(_ids(119), seed=0)
    counts = s.counts()
    assert (counts["memory"], counts["finetune"], counts["validation"]) == (36, 71, 12)
    assert [counts[p] for p in PHASES] == [5, 7, 7, 7, 10]


@given(st.integers(3, 300), st.integers(0, 2**32 - 1))
def test_parts_are_disjoint_and_cover_every_patient(n: int, seed: int) -> None:
    """No patient is in two parts; together the parts hold every patient once; none is empty
    of memory or validation; each phase has a patient when the memory split has 5."""
    s = split_patients(_ids(n), seed=seed)
    parts = [*s.phases, s.finetune, s.validation]
    flat = [p for part in parts for p in part]
    assert len(flat) == len(set(flat)) == n
    assert set(flat) == set(_ids(n))
    assert s.validation and s.memory
    if len(s.memory) >= len(PHASES):
        assert all(s.phases)
    assert set(s.phase_of()) == set(_ids(n))


def test_same_seed_same_split_and_input_order_does_not_matter() -> None:
    """The split depends only on the set of ids and the seed (duplicates and order ignored)."""
    ids = _ids(50)
    a = split_patients(ids, seed=7)
    b = split_patients(list(reversed(ids)) + ids[:10], seed=7)
    assert a == b


def test_different_seeds_give_different_splits() -> None:
    """Another seed puts (some) other patients in validation."""
    assert split_patients(_ids(100), seed=0).validation != split_patients(_ids(100), seed=1).validation


def test_too_few_patients_is_an_error() -> None:
    """Two patients cannot fill memory and validation."""
    with pytest.raises(InvalidInput, match="at least 3"):
        split_patients(["a", "b"])


def test_a_zero_validation_share_is_refused() -> None:
    """Shares that leave validation empty raise InvalidInput."""
    with pytest.raises(InvalidInput):
        split_patients(_ids(2) + ["c"], shares=(1.0, 1.0, 0.0))


# ---------------------------------------------------------------- cross-validation folds


@given(st.integers(2, 10), st.integers(0, 60), st.integers(0, 2**32 - 1))
def test_folds_validate_every_patient_once(folds: int, extra: int, seed: int) -> None:
    """Each fold's parts are disjoint and cover every patient; the validation parts of the
    folds are disjoint, cover every patient, and differ in size by at most one; memory and
    fine-tune keep the 30:60 weights within one patient."""
    n = folds + 2 + extra
    splits = fold_patients(_ids(n), folds, seed=seed)
    assert [s.fold for s in splits] == list(range(folds)) and {s.folds for s in splits} == {folds}
    for s in splits:
        flat = [p for part in (*s.phases, s.finetune, s.validation) for p in part]
        assert len(flat) == len(set(flat)) == n and s.memory and s.validation
        rest = n - len(s.validation)
        assert abs(len(s.memory) - rest / 3) < 1
    validated = [p for s in splits for p in s.validation]
    assert sorted(validated) == _ids(n)
    sizes = [len(s.validation) for s in splits]
    assert max(sizes) - min(sizes) <= 1


def test_one_fold_is_the_paper_split() -> None:
    """folds=1 is the single 30/60/10 split of the same seed."""
    assert fold_patients(_ids(40), 1, seed=5) == (split_patients(_ids(40), seed=5),)


@pytest.mark.parametrize(("n", "folds"), [(6, 5), (10, 0), (10, True), (10, 2.0)])
def test_bad_folds_are_refused(n: int, folds: object) -> None:
    """Too few patients for the folds, or folds that are not a positive whole number."""
    with pytest.raises(InvalidInput, match="folds"):
        fold_patients(_ids(n), folds)  # type: ignore[arg-type]

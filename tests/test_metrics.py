"""Tests for msm_mem.eval.metrics: hand-computed cases, the arithmetic in comments."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from msm_mem._errors import InvalidInput
from msm_mem.eval.metrics import (
    BLEU_EPSILON,
    bootstrap_ci,
    corpus_bleu,
    exact_match,
    normalize_answer,
    rouge_l,
    token_f1,
)

# ---------------------------------------------------------------- normalize_answer


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("The Pleural Effusion.", "pleural effusion"),
        ("  a   small\teffusion\n", "small effusion"),
        ("ground-glass", "groundglass"),  # punctuation is deleted, not replaced by a space
        ("An opacity; the other", "opacity other"),
        ("theory anatomy", "theory anatomy"),  # articles only as whole words
        ("“Bilateral” opacities – right", "bilateral opacities right"),  # Unicode punctuation
        ("?!...", ""),
        ("", ""),
    ],
)
def test_normalize_answer_cases(raw: str, expected: str) -> None:
    """Lowercases, deletes punctuation, drops whole-word articles and collapses whitespace."""
    assert normalize_answer(raw) == expected


@given(st.text())
def test_normalize_answer_is_idempotent(s: str) -> None:
    """Normalising twice gives the same string as normalising once."""
    once = normalize_answer(s)
    assert normalize_answer(once) == once


# ---------------------------------------------------------------- exact match and token F1


def test_exact_match_after_normalisation() -> None:
    """Exact match ignores case, punctuation and articles but not word changes."""
    assert exact_match("The effusion.", "effusion") == 1.0
    assert exact_match("effusion", "effusions") == 0.0
    assert exact_match("", "") == 1.0
    assert exact_match("...", "") == 1.0  # punctuation-only normalises to empty
    assert exact_match("", "effusion") == 0.0


def test_token_f1_partial_overlap() -> None:
    """Token F1 is the harmonic mean of token precision and recall."""
    # pred: [small, left, effusion] ref: [left, pleural, effusion, no, pneumothorax]
    # overlap = {left, effusion} = 2; P = 2/3, R = 2/5; F1 = 2*(2/3)(2/5)/(2/3+2/5) = 0.5
    assert token_f1("A small left effusion", "Left pleural effusion, no pneumothorax") == (pytest.approx(0.5))


def test_token_f1_clips_repeated_tokens() -> None:
    """A repeated predicted token matches only as often as it occurs in the reference."""
    # pred: [yes, yes, yes] ref: [yes, no]; overlap min(3, 1) = 1
    # P = 1/3, R = 1/2; F1 = 2*(1/3)(1/2)/(1/3+1/2) = (1/3)/(5/6) = 0.4
    assert token_f1("yes yes yes", "yes no") == pytest.approx(0.4)


def test_token_f1_edge_cases() -> None:
    """Both empty gives 1, one empty or no overlap gives 0, punctuation-only counts as empty."""
    assert token_f1("", "") == 1.0
    assert token_f1("!!", "the") == 1.0  # both normalise to ""
    assert token_f1("", "effusion") == 0.0
    assert token_f1("effusion", "...") == 0.0
    assert token_f1("cardiomegaly", "effusion") == 0.0
    assert token_f1("The Effusion", "effusion.") == 1.0


# ---------------------------------------------------------------- BLEU


def bleu4(prediction: str, reference: str) -> float:
    """Corpus BLEU-4 of a corpus of one pair."""
    return corpus_bleu([prediction], [reference])


def test_bleu4_one_substitution() -> None:
    """A last-token substitution gives the geometric mean of 5/6, 4/5, 3/4, 2/3."""
    # c = r = 6, BP = 1; product = (5*4*3*2)/(6*5*4*3) = 120/360 = 1/3; BLEU = 3 ** -0.25
    score = bleu4("one two three four five seven", "one two three four five six")
    assert score == pytest.approx(3**-0.25)  # 0.7598...


def test_bleu4_brevity_penalty() -> None:
    """A correct but short prediction is scaled by exp(1 - r/c)."""
    # all precisions 1; c = 4, r = 6; BP = exp(1 - 6/4) = exp(-0.5) = 0.6065...
    assert bleu4("one two three four", "one two three four five six") == pytest.approx(math.exp(-0.5))


def test_bleu4_no_penalty_for_longer_prediction() -> None:
    """A prediction longer than the reference has BP = 1 and loses only precision."""
    # pred 5 tokens, ref 4: p1 = 4/5, p2 = 3/4, p3 = 2/3, p4 = 1/2; product = 24/120 = 1/5
    assert bleu4("one two three four extra", "one two three four") == pytest.approx(5**-0.25)


def test_bleu4_smoothing_on_repeated_tokens() -> None:
    """Zero-match orders use epsilon matches (Chen & Cherry method 1) and unigrams are clipped."""
    # pred [yes x4] ref [yes, no]: p1 = min(4,1)/4 = 1/4; p2 = eps/3; p3 = eps/2; p4 = eps/1
    # c = 4 > r = 2 so BP = 1; BLEU = (1/4 * 0.1/3 * 0.1/2 * 0.1) ** (1/4) = 0.0803...
    eps = BLEU_EPSILON
    expected = (0.25 * (eps / 3) * (eps / 2) * eps) ** 0.25
    assert bleu4("yes yes yes yes", "yes no") == pytest.approx(expected)
    assert expected == pytest.approx(0.08034, abs=1e-5)


def test_bleu4_short_identical_sentence_has_no_four_grams() -> None:
    """A corpus of 3-token predictions has no 4-grams, so even an exact copy scores 0 at
    order 4 (sacreBLEU's rule) and 1 at order 3."""
    assert bleu4("right lower lobe", "Right lower lobe.") == 0.0
    assert corpus_bleu(["right lower lobe"], ["Right lower lobe."], max_order=3) == 1.0


def test_bleu4_identical_long_sentence_is_one() -> None:
    """An exact copy of at least four tokens scores 1."""
    assert bleu4("small left pleural effusion", "Small left pleural effusion.") == 1.0


def test_bleu4_edge_cases() -> None:
    """Both empty gives 1, one empty gives 0."""
    assert bleu4("", "") == 1.0
    assert bleu4("...", "the") == 1.0
    assert bleu4("", "effusion") == 0.0
    assert bleu4("effusion", "") == 0.0


def test_corpus_bleu4_sums_counts() -> None:
    """Corpus BLEU pools n-gram counts and lengths before taking the geometric mean."""
    # pair 1: (5/6, 4/5, 3/4, 2/3); pair 2 identical 4 tokens: (4/4, 3/3, 2/2, 1/1)
    # pooled: 9/10, 7/8, 5/6, 3/4; c = r = 10 so BP = 1
    # product = (9*7*5*3)/(10*8*6*4) = 945/1920; BLEU = (945/1920) ** 0.25 = 0.8376...
    preds = ["one two three four five seven", "one two three four"]
    refs = ["one two three four five six", "one two three four"]
    assert corpus_bleu(preds, refs) == pytest.approx((945 / 1920) ** 0.25)


def test_corpus_bleu4_rejects_bad_input() -> None:
    """Mismatched lengths and an empty corpus raise InvalidInput (a ValueError)."""
    with pytest.raises(InvalidInput):
        corpus_bleu(["a"], [])
    with pytest.raises(ValueError):
        corpus_bleu([], [])


# ---------------------------------------------------------------- ROUGE-L


def test_rouge_l_hand_computed() -> None:
    """ROUGE-L F is the harmonic mean of LCS precision and recall."""
    # pred [police, kill, gunman] ref [police, killed, gunman]: LCS = 2; P = R = 2/3; F = 2/3
    assert rouge_l("police kill the gunman", "police killed the gunman") == pytest.approx(2 / 3)


def test_rouge_l_uses_order() -> None:
    """LCS respects order, unlike token F1."""
    # pred [c, b, a] ref [a, b, c]: LCS = 1; P = R = 1/3; F = 1/3 (token F1 would be 1)
    assert rouge_l("c b x", "x b c") == pytest.approx(1 / 3)
    assert token_f1("c b x", "x b c") == 1.0


def test_rouge_l_repeated_tokens_and_beta() -> None:
    """Repeated tokens match once each in the LCS; beta weighs recall."""
    # pred [yes, yes, yes] ref [yes, no]: LCS = 1; P = 1/3, R = 1/2
    # beta = 1: F = 2PR/(P+R) = 0.4; beta = 2: F = 5PR/(R + 4P) = (5/6)/(1/2 + 4/3) = 5/11
    assert rouge_l("yes yes yes", "yes no") == pytest.approx(0.4)
    assert rouge_l("yes yes yes", "yes no", beta=2.0) == pytest.approx(5 / 11)
    with pytest.raises(InvalidInput):
        rouge_l("a", "b", beta=0.0)


def test_rouge_l_edge_cases() -> None:
    """Both empty gives 1; one empty, or nothing in common, gives 0."""
    assert rouge_l("", "") == 1.0
    assert rouge_l("?", "") == 1.0
    assert rouge_l("", "effusion") == 0.0
    assert rouge_l("cardiomegaly", "effusion") == 0.0


@given(st.text(max_size=40), st.text(max_size=40))
def test_text_metrics_stay_in_unit_interval(p: str, r: str) -> None:
    """Every text metric lies in [0, 1] for any strings."""
    for fn in (token_f1, exact_match, bleu4, rouge_l):
        assert 0.0 <= fn(p, r) <= 1.0 + 1e-12


# ---------------------------------------------------------------- bootstrap


def test_bootstrap_single_group_has_zero_width() -> None:
    """With one group every resample is that group, so low == mean == high."""
    mean, low, high = bootstrap_ci({"p1": [0.2, 0.4, 0.9]}, n_resamples=200)
    assert mean == pytest.approx(0.5)  # (0.2 + 0.4 + 0.9) / 3
    assert low == mean == high


def test_bootstrap_mean_is_pooled_over_values() -> None:
    """The point estimate is the mean of all values, not the mean of group means."""
    # values 1, 1, 1, 0 -> 3/4 (the mean of group means would be (1 + 0) / 2)
    mean, low, high = bootstrap_ci({"a": [1.0, 1.0, 1.0], "b": [0.0]}, seed=3)
    assert mean == pytest.approx(0.75)
    # a resample is some mix of groups a and b; its pooled mean is in {0, 3/4, 1}
    assert 0.0 <= low <= mean <= high <= 1.0


def test_bootstrap_is_deterministic_for_a_seed() -> None:
    """The same seed gives the same interval, another seed may not, key order is irrelevant."""
    data = {f"p{i}": [float(i % 3), float(i % 5) / 4] for i in range(12)}
    first = bootstrap_ci(data, seed=7)
    assert bootstrap_ci(data, seed=7) == first
    assert bootstrap_ci(dict(reversed(list(data.items()))), seed=7) == first
    others = {bootstrap_ci(data, seed=s)[1:] for s in range(5)}
    assert len(others) > 1


def test_bootstrap_resamples_groups_not_values() -> None:
    """Two groups, each constant, give resampled means only from whole-group mixes."""
    # groups: a = [0]*9 (sum 0, n 9), b = [1] (sum 1, n 1); draws of 2 groups:
    # aa -> 0, ab/ba -> 1/10, bb -> 1. The 2.5% quantile is 0 and the 97.5% is 1.
    mean, low, high = bootstrap_ci({"a": [0.0] * 9, "b": [1.0]}, n_resamples=2000, seed=1)
    assert mean == pytest.approx(0.1)
    assert low == 0.0
    assert high == 1.0


def test_bootstrap_rejects_bad_input() -> None:
    """Empty data, non-finite values and bad parameters raise InvalidInput."""
    with pytest.raises(InvalidInput):
        bootstrap_ci({})
    with pytest.raises(InvalidInput):
        bootstrap_ci({"a": []})
    with pytest.raises(InvalidInput):
        bootstrap_ci({"a": [float("nan")]})
    with pytest.raises(InvalidInput):
        bootstrap_ci({"a": [1.0]}, n_resamples=0)
    with pytest.raises(InvalidInput):
        bootstrap_ci({"a": [1.0]}, alpha=1.0)


def test_bootstrap_ignores_empty_groups() -> None:
    """A group with no values neither moves the mean nor the interval."""
    with_empty = bootstrap_ci({"a": [0.5, 1.0], "b": [0.0], "z": []}, seed=2)
    assert with_empty == bootstrap_ci({"a": [0.5, 1.0], "b": [0.0]}, seed=2)

"""Our text metrics against the standard libraries on the same inputs: sacreBLEU (corpus
BLEU-1..4), rouge-score (ROUGE-L) and, where installed, pycocoevalcap (CIDEr-D).

Every library gets the tokens of ``normalize_answer`` (joined by spaces, with its own
tokeniser turned off), so a disagreement is one of the metric, never of tokenisation."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from msm_mem._memory.answers import _tokens
from msm_mem.eval.cider import cider_d, cider_d_scores
from msm_mem.eval.metrics import class_f1, corpus_bleu, rouge_l, yes_no

sacrebleu = pytest.importorskip("sacrebleu")
rouge_scorer = pytest.importorskip("rouge_score.rouge_scorer")

WORDS = ["left", "right", "pleural", "effusion", "small", "no", "lobe", "lower", "opacity", "ards"]
texts = st.lists(st.sampled_from(WORDS), min_size=0, max_size=12).map(" ".join)
pairs = st.lists(st.tuples(texts, texts), min_size=1, max_size=8)

REPORTS = [
    ("Small left pleural effusion.", "small left pleural effusion"),
    ("Patient intubated, ARDS in both lungs.", "Severe ARDS. Person is intubated with an OG in place."),
    ("No acute findings", "Diffuse bilateral opacities, no effusion."),
    ("right lower lobe consolidation", "Consolidation of the right lower lobe with small effusion."),
]


def _sacre(preds: list[str], refs: list[str], order: int) -> float:
    bleu = sacrebleu.metrics.BLEU(
        max_ngram_order=order, tokenize="none", smooth_method="floor", smooth_value=0.1, force=True
    )
    joined = [" ".join(_tokens(t)) for t in preds]
    return float(bleu.corpus_score(joined, [[" ".join(_tokens(t)) for t in refs]]).score) / 100


@settings(max_examples=200, deadline=None)
@given(pairs)
def test_corpus_bleu_matches_sacrebleu(data: list[tuple[str, str]]) -> None:
    """Corpus BLEU-1..4 equals sacreBLEU's (floor smoothing 0.1, no tokeniser) up to rounding."""
    preds, refs = [p for p, _ in data], [r for _, r in data]
    if not any(_tokens(r) for r in refs):
        return  # both conventions for an empty reference corpus are documented, and differ
    for order in (1, 2, 3, 4):
        assert corpus_bleu(preds, refs, max_order=order) == pytest.approx(_sacre(preds, refs, order), abs=1e-9)


def test_corpus_bleu_matches_sacrebleu_on_reports() -> None:
    """On report-like text, each order agrees with sacreBLEU and lies strictly between 0 and 1."""
    preds, refs = [p for p, _ in REPORTS], [r for _, r in REPORTS]
    for order in (1, 2, 3, 4):
        ours = corpus_bleu(preds, refs, max_order=order)
        assert 0 < ours < 1
        assert ours == pytest.approx(_sacre(preds, refs, order), abs=1e-9)


class _Split:
    """rouge-score's tokenizer protocol: our tokens as they are."""

    def tokenize(self, text: str) -> list[str]:
        return text.split()


@settings(max_examples=200, deadline=None)
@given(texts, texts)
def test_rouge_l_matches_rouge_score(prediction: str, reference: str) -> None:
    """ROUGE-L F equals rouge-score's rougeL F-measure on the same tokens (both non-empty)."""
    if not _tokens(prediction) or not _tokens(reference):
        return  # ours follows SQuAD (both empty: 1.0); rouge-score gives 0
    scorer = rouge_scorer.RougeScorer(["rougeL"], tokenizer=_Split())
    theirs = scorer.score(" ".join(_tokens(reference)), " ".join(_tokens(prediction)))["rougeL"].fmeasure
    assert rouge_l(prediction, reference) == pytest.approx(theirs, abs=1e-12)


def test_rouge_l_with_rouge_scores_own_tokeniser_on_plain_text() -> None:
    """On lower-case words without articles or punctuation the two tokenisers agree, so
    rouge-score's default configuration gives the same number."""
    scorer = rouge_scorer.RougeScorer(["rougeL"])
    for pred, ref in [("small left pleural effusion", "left pleural effusion small"), ("no ards", "severe ards")]:
        assert rouge_l(pred, ref) == pytest.approx(scorer.score(ref, pred)["rougeL"].fmeasure)


def test_cider_d_by_hand() -> None:
    """Two answers: an exact copy, and one whose last word differs (the same numbers as
    pycocoevalcap gives). Idf over 2 references:
    every n-gram in one reference has idf log 2, so the copy's cosine is 1 at each order (10)
    and the other's is 2/3, 1/2, 0, 0 at orders 1..4 with equal bigram counts (no penalty)."""
    scores = cider_d_scores(["p q r s", "e f g"], ["p q r s", "e f h"])
    assert scores[0] == pytest.approx(10.0)
    assert scores[1] == pytest.approx(10.0 * (2 / 3 + 1 / 2) / 4)
    assert cider_d(["p q r s", "e f g"], ["p q r s", "e f h"]) == pytest.approx((scores[0] + scores[1]) / 2)


def test_cider_d_length_penalty() -> None:
    """A prediction 3 bigrams longer than its reference is scaled by exp(-9 / 72)."""
    long, short = cider_d_scores(["x y z w v u t", "p q r s"], ["x y z w", "p q r s"])
    assert short == pytest.approx(10.0)
    same = cider_d_scores(["x y z w", "p q r s"], ["x y z w", "p q r s"])[0]
    assert same == pytest.approx(10.0)
    assert 0 < long < same * math.exp(-9 / 72) + 1e-9


def test_cider_d_matches_pycocoevalcap_when_installed() -> None:
    """Where pycocoevalcap is installed (its CIDEr needs no Java), the scores are equal."""
    cider = pytest.importorskip("pycocoevalcap.cider.cider")
    preds, refs = [p for p, _ in REPORTS], [r for _, r in REPORTS]
    joined = {i: [" ".join(_tokens(p))] for i, p in enumerate(preds)}
    gts = {i: [" ".join(_tokens(r))] for i, r in enumerate(refs)}
    mean, each = cider.Cider().compute_score(gts, joined)
    assert cider_d(preds, refs) == pytest.approx(float(mean), abs=1e-9)
    assert cider_d_scores(preds, refs) == pytest.approx([float(x) for x in each], abs=1e-9)


def test_yes_no_and_class_f1() -> None:
    """yes/no reads only a lone yes or no; class F1 is the macro F1 over the reference classes."""
    assert [yes_no(t) for t in ("Yes.", "no", "TRUE", "yes, intubated", "")] == ["yes", "no", "yes", "", ""]
    # yes: TP 1, FP 1, FN 1 -> 1/2; no: TP 1, FP 0, FN 1 -> 2/3
    assert class_f1(["yes", "yes", "no", "maybe"], ["yes", "no", "no", "yes"]) == pytest.approx((1 / 2 + 2 / 3) / 2)

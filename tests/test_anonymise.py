"""Tests for msm_mem._governance.anonymise: the allow-list anonymiser at the population
boundary, in decay and for reasons, over a fixed sample of the generated identifier corpus."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from msm_mem._errors import InvalidInput
from msm_mem._governance.anonymise import Vocabulary, anonymise, for_population, plain_reason
from msm_mem._memory.population import deidentified_text
from msm_mem.testing.phi_corpus import CATEGORIES, corpus, leaks

SAMPLE = corpus(1_500, seed=7)


def test_no_planted_identifier_reaches_another_patient() -> None:
    """Over 1,500 planted identifiers of every category, nothing crosses the population
    boundary: every identifier is replaced or its sentence withheld."""
    planted = Counter(p.category for s in SAMPLE for p in s.planted)
    assert set(planted) == set(CATEGORIES) and sum(planted.values()) >= 1_500
    leaked = [(p.value, out) for s in SAMPLE if (out := deidentified_text(s.text)) for p in leaks(s, out)]
    assert leaked == []


def test_population_keeps_most_clinical_content() -> None:
    """The findings of the sample survive (at least 85% of their words), and fewer than 15% of
    the sentences are withheld: the anonymiser does not make the experience useless."""
    kept = total = withheld = 0
    for s in SAMPLE:
        out = for_population(s.text)
        withheld += out is None
        words = s.finding.lower().split()
        total += len(words)
        kept += sum(w in (out or "").lower() for w in words)
    assert kept / total >= 0.85 and withheld / len(SAMPLE) < 0.15


def test_decay_removes_what_the_rules_miss() -> None:
    """The common vocabulary (decay) removes the identifiers the rules let through: names with
    no cue and in lower case, bare numbers, cities; the clinical content and the year stay."""
    text = "per Wojciechowski; maria gonzalez seen 03/04/2020 in Goyang, phone 6175550166, SSN 987654321: 2 cm nodule"
    out = anonymise(text, Vocabulary.COMMON).text
    for gone in ("Wojciechowski", "maria", "gonzalez", "03/04", "Goyang", "6175550166", "987654321"):
        assert gone.lower() not in out.lower()
    assert "2020" in out and "2 cm nodule" in out


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("a 2 cm nodule", "2 cm"),
        ("SpO2 94 % on day 9", "94 %"),
        ("54-year-old with BP 120/80 mmHg", "120/80 mmHg"),
        ("a 5mg dose", "5mg"),
        ("seen in 2019", "2019"),
    ],
)
def test_measurements_counts_and_years_stay(text: str, kept: str) -> None:
    """A number with its unit, after a counting word, or a year alone is clinical content."""
    assert kept in anonymise(text, Vocabulary.CLINICAL).text


@pytest.mark.parametrize(
    ("text", "gone"),
    [
        ("call 0142 now", "0142"),  # a leading zero is never a measurement
        ("SSN 310 60 1966", "1966"),  # a year beside another number is part of it
        ("car 419G", "419G"),  # a plate is not 419 grams
        ("per Day", "Day"),  # a capitalised word inside a sentence is a name
        ("note by PARKER", "PARKER"),  # capitals outside the clinical vocabulary
        ("admitted in May", "May"),  # a month is finer than the year
        ("call 6175550166 he said", "6175550166"),  # a word after a number is a unit only if it is one
        ("car ETT-5486", "5486"),  # a clinical word joined to digits is an id, not a term
    ],
)
def test_what_reads_as_an_identifier_goes(text: str, gone: str) -> None:
    assert gone not in anonymise(text, Vocabulary.COMMON).text


def test_categories_are_named_and_runs_collapse() -> None:
    """Each replacement is a category; a name of three words is one placeholder; what was
    kept is counted."""
    result = anonymise("discussed with Juan Carlos Wojciechowski about 6175550166", Vocabulary.COMMON)
    assert result.text == "discussed with [NAME] about [NUMBER]"
    assert result.categories == ("[NAME]", "[NUMBER]")
    assert (result.kept, result.words) == (3, 4)  # the name was the rules': not judged again


def test_a_text_mostly_of_identifiers_is_withheld_from_population_use() -> None:
    """Less than half of its words surviving, a text is not passed on at all."""
    assert for_population("Quixote improving; lives in Goyang near Myongji") is None
    assert for_population("Right lower lobe consolidation, per Quixote") is not None


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="abcXYZ019 .,;:-/%[]", max_size=60))
def test_anonymising_twice_changes_nothing(text: str) -> None:
    """Idempotent on any text of words, numbers, units, punctuation and brackets."""
    once = anonymise(text).text
    assert anonymise(once).text == once


def test_reasons_keep_their_sense_and_lose_their_names() -> None:
    """A reason is kept anonymised; one with nothing but identifiers is refused naming the
    class, never the words."""
    assert plain_reason("the reason", "Quixote family asked") == "[NAME] family asked"
    assert plain_reason("the reason", "emergency: patient unconscious") == "emergency: patient unconscious"
    with pytest.raises(InvalidInput, match="name") as caught:
        plain_reason("the break-glass reason", "Quixote")
    assert "Quixote" not in str(caught.value)

"""Tests of msm_mem._memory.lexicon: matching rules, file parsing and the packaged default."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

from msm_mem import InvalidInput
from msm_mem._memory.lexicon import Lexicon


@pytest.fixture
def lex() -> Lexicon:
    return Lexicon(["effusion", "pleural effusion", "covid-19", "icu", "ground glass"])


def test_terms_are_lower_cased_unique_and_longest_first() -> None:
    """terms holds each cleaned term once, longest first, then alphabetical."""
    lex = Lexicon(["  Effusion ", "effusion", "ICU", "Pleural   Effusion", "", "   "])
    assert lex.terms == ("pleural effusion", "effusion", "icu")


def test_matches_on_word_boundaries_only(lex: Lexicon) -> None:
    """A term inside a longer word does not match; at word edges and punctuation it does."""
    assert "effusions noted" not in lex
    assert "preeffusion" not in lex
    assert "picu admission" not in lex
    assert "icu_bed" not in lex
    assert "(effusion)." in lex
    assert "effusion" in lex
    assert lex.find("Effusion, then ICU.") == ["effusion", "icu"]


def test_hyphen_joins_words(lex: Lexicon) -> None:
    """A hyphen is part of a word: 'non-effusion' and 'effusion-like' do not match 'effusion'."""
    assert "non-effusion" not in lex
    assert "effusion-like" not in lex
    assert lex.find("covid-19 pneumonia") == ["covid-19"]


def test_matching_is_case_insensitive(lex: Lexicon) -> None:
    """Upper and mixed case match, and find reports terms lower-cased."""
    assert lex.find("PLEURAL EFFUSION and Icu") == ["pleural effusion", "icu"]


def test_phrase_is_preferred_to_its_word(lex: Lexicon) -> None:
    """A phrase that contains a shorter term is reported once, as the phrase."""
    assert lex.find("small pleural effusion") == ["pleural effusion"]


def test_phrase_matches_across_line_breaks_and_spaces(lex: Lexicon) -> None:
    """A phrase split by a newline or several spaces still matches, reported normalised."""
    assert lex.find("left pleural\n  effusion") == ["pleural effusion"]
    assert lex.find("ground \t glass opacity") == ["ground glass"]


def test_find_returns_every_occurrence_in_order(lex: Lexicon) -> None:
    """find lists each occurrence in order of appearance, repeats included."""
    assert lex.find("icu; effusion; icu") == ["icu", "effusion", "icu"]
    assert lex.find("nothing relevant here") == []


def test_contains_refuses_non_strings(lex: Lexicon) -> None:
    """'in' is False for non-string operands instead of raising."""
    assert 3 not in lex
    assert None not in lex


def test_regex_metacharacters_are_literal() -> None:
    """Terms are matched literally, so '.' or '+' in a term does not act as a pattern."""
    lex = Lexicon(["c.t", "hiv+"])
    assert "cat" not in lex
    assert lex.find("c.t scan, hiv+ status") == ["c.t", "hiv+"]


def test_parse_ignores_comments_and_blank_lines() -> None:
    """Whole-line and trailing '#' comments and blank lines are not terms."""
    lex = Lexicon.parse("# header comment\n\neffusion  # trailing note\n   \n# edema\nmass\n")
    assert lex.terms == ("effusion", "mass")
    assert "edema" not in lex


@pytest.mark.parametrize("text", ["", "\n\n", "# only comments\n  # more\n"])
def test_empty_lexicon_raises_invalid_input(text: str) -> None:
    """A lexicon with no terms raises InvalidInput."""
    with pytest.raises(InvalidInput, match="empty"):
        Lexicon.parse(text)
    with pytest.raises(InvalidInput):
        Lexicon([])


def test_a_bare_string_is_refused() -> None:
    """Lexicon('effusion') raises rather than making one term per character."""
    with pytest.raises(InvalidInput):
        Lexicon("effusion")  # type: ignore[arg-type]


def test_from_file_reads_utf8_terms(tmp_path: Path) -> None:
    """from_file reads a UTF-8 file of terms, comments included."""
    path = tmp_path / "terms.txt"
    path.write_text("# mine\nœdème\nnodule\n", encoding="utf-8")
    lex = Lexicon.from_file(path)
    assert lex.terms == ("nodule", "œdème")
    assert "ŒDÈME présent" in lex


def test_from_file_missing_raises_invalid_input(tmp_path: Path) -> None:
    """A missing lexicon file raises InvalidInput naming the path."""
    with pytest.raises(InvalidInput, match="absent.txt"):
        Lexicon.from_file(tmp_path / "absent.txt")


def test_from_file_directory_raises_invalid_input(tmp_path: Path) -> None:
    """A directory given as lexicon raises InvalidInput."""
    with pytest.raises(InvalidInput):
        Lexicon.from_file(tmp_path)


def test_from_file_non_utf8_raises_invalid_input(tmp_path: Path) -> None:
    """A file that is not UTF-8 raises InvalidInput, not UnicodeDecodeError."""
    path = tmp_path / "latin.txt"
    path.write_bytes("œdème\n".encode("cp1252"))
    with pytest.raises(InvalidInput):
        Lexicon.from_file(path)


def test_from_file_with_only_comments_raises_invalid_input(tmp_path: Path) -> None:
    """A readable file that holds no term raises InvalidInput."""
    path = tmp_path / "empty.txt"
    path.write_text("# nothing\n", encoding="utf-8")
    with pytest.raises(InvalidInput, match="empty"):
        Lexicon.from_file(path)


def test_packaged_default_loads_with_chest_terms() -> None:
    """The packaged lexicon loads and knows the core chest findings."""
    lex = Lexicon.default()
    for term in ("effusion", "pneumothorax", "cardiomegaly", "consolidation", "heart failure"):
        assert term in lex.terms
    assert lex.find("Mild cardiomegaly with small left pleural effusion.") == [
        "cardiomegaly",
        "pleural",
        "effusion",
    ]
    assert "The patient is well." not in lex


def test_packaged_file_has_no_duplicate_or_padded_terms() -> None:
    """Each line of the packaged file is a distinct, trimmed, lower-case term or a comment."""
    text = resources.files("msm_mem._memory").joinpath("clinical_keywords.txt").read_text("utf-8")
    terms = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    assert len(terms) == len(set(terms))
    assert all(t == t.strip().lower() for t in terms)
    assert len(Lexicon.default().terms) == len(terms)

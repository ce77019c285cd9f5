"""Tests of msm_mem._limits: the id rules and the bounds on text from outside."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from msm_mem import InvalidInput
from msm_mem._limits import (
    MAX_ID_CHARS,
    MAX_QUESTION_CHARS,
    check_actor_id,
    check_grantee,
    check_id,
    check_observation,
    check_path,
    check_text,
)


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("*", "wildcard"),
        ("p*1", "wildcard"),
        ("\x00retired", "control"),
        ("p\n1", "control"),
        ("p1\r", "control"),
        ("p\t1", "control"),
        ("p\u2028x", "separator"),
        ("p\u202ex", "control"),  # a bidirectional override
        ("p\u200bx", "control"),  # a zero-width space
        ("", "blank"),
        ("   ", "blank"),
        ("x" * (MAX_ID_CHARS + 1), "longer"),
        (7, "string"),
        (None, "string"),
    ],
)
def test_bad_ids_are_refused_naming_the_field(value: object, match: str) -> None:
    """Wildcards, control characters, newlines, blank, overlong and non-text ids are refused."""
    with pytest.raises(InvalidInput, match=match) as info:
        check_id("patient_id", value)
    assert "patient_id" in str(info.value)


@pytest.mark.parametrize("value", ["P1", "covid-123", "mimic-10000032", "x" * MAX_ID_CHARS, "Müller-7", "患者1", "a b"])
def test_ordinary_ids_pass_unchanged(value: str) -> None:
    """Letters of any script, digits, dashes and inner spaces are ids; they come back as given."""
    assert check_id("patient_id", value) == value


def test_optional_id_admits_only_the_empty_string() -> None:
    """allow_empty admits "" (an optional study id left out) but not a blank one."""
    assert check_id("study_id", "", allow_empty=True) == ""
    with pytest.raises(InvalidInput, match="blank"):
        check_id("study_id", "  ", allow_empty=True)


@given(st.text(max_size=40))
def test_check_id_either_returns_the_id_or_raises_invalid_input(value: str) -> None:
    """No text makes check_id fail otherwise; what passes holds no wildcard and no newline."""
    try:
        assert check_id("id", value) == value
    except InvalidInput:
        return
    assert "*" not in value and "\n" not in value and "\x00" not in value and value.strip()


def test_text_bounds_and_unicode() -> None:
    """Text over its limit, blank required text and lone surrogates are refused by name."""
    assert check_text("answer", "ok", 10) == "ok"
    with pytest.raises(InvalidInput, match="answer is longer than 10 characters"):
        check_text("answer", "x" * 11, 10)
    with pytest.raises(InvalidInput, match="question must not be empty"):
        check_text("question", " ", 10, required=True)
    with pytest.raises(InvalidInput, match="surrogate"):
        check_text("report", "a\ud800b", 10)


def test_a_twenty_megabyte_question_is_refused() -> None:
    """A 20 MB question fails the question limit without being scanned further."""
    with pytest.raises(InvalidInput, match=f"question is longer than {MAX_QUESTION_CHARS:,}"):
        check_observation("q" * 20_000_000)


def test_observation_checks_study_id_and_tag() -> None:
    """An observation's study id follows the id rules; its tag is bounded."""
    check_observation("What is seen?", study_id="", visual_tag="PA")
    with pytest.raises(InvalidInput, match="study_id"):
        check_observation("What is seen?", study_id="s\n1")
    with pytest.raises(InvalidInput, match="visual_tag"):
        check_observation("What is seen?", visual_tag="t" * 300)


def test_paths_refuse_nul() -> None:
    """A path with a NUL byte would fail deep in the OS; it is refused up front."""
    with pytest.raises(InvalidInput, match="NUL"):
        check_path("image", "a\x00.png")


@pytest.mark.parametrize(
    ("value", "code"),
    [
        ("a\x00b", "U+0000"),
        ("a\x1b[31mred", "U+001B"),  # an ANSI escape: it would recolour a terminal
        ("a\x85b", "U+0085"),  # a C1 control
        ("a\rb", "U+000D"),  # a bare carriage return overwrites a terminal line
        ("abc\u202edcba", "U+202E"),  # a right-to-left override
        ("a\u2066b\u2069", "U+2066"),  # a left-to-right isolate
        ("no\u200bdule", "U+200B"),  # a zero-width space
        ("a\ufeffb", "U+FEFF"),
    ],
)
def test_free_text_refuses_controls_bidi_and_zero_width_naming_the_character(value: str, code: str) -> None:
    """A control (but tab and line breaks), bidi or zero-width character in free text is refused by code point."""
    with pytest.raises(InvalidInput, match=f"answer .*{re.escape(code)}"):
        check_text("answer", value, 100)


def test_free_text_keeps_tabs_and_line_breaks() -> None:
    """Tabs, newlines and CRLF line ends are free text's own controls and pass."""
    text = "Findings:\tnone\r\nImpression:\n- normal"
    assert check_text("report", text, 100) == text


def test_free_text_comes_back_in_nfc() -> None:
    """Decomposed text (e + combining acute) comes back composed."""
    assert check_text("question", "Is the re\u0301sume\u0301 clear?", 100) == "Is the r\u00e9sum\u00e9 clear?"


def test_observation_returns_its_text_in_nfc() -> None:
    """check_observation hands back the question and tag normalised, the study id as given."""
    assert check_observation("cafe\u0301?", study_id="S1", visual_tag="A\u030a") == ("caf\u00e9?", "S1", "\u00c5")


@pytest.mark.parametrize(("value", "code"), [("p\x1b1", "U+001B"), ("p\u202ex", "U+202E"), ("p\u200dx", "U+200D")])
def test_ids_name_the_refused_character(value: str, code: str) -> None:
    """An id's refused control or format character is named by its code point."""
    with pytest.raises(InvalidInput, match=f"patient_id .*{re.escape(code)}"):
        check_id("patient_id", value)


def test_an_id_not_in_nfc_is_refused_not_rewritten() -> None:
    """A decomposed id is refused, so two spellings never name two patients."""
    assert check_id("patient_id", "Jos\u00e9") == "Jos\u00e9"
    with pytest.raises(InvalidInput, match="patient_id is not in Unicode NFC"):
        check_id("patient_id", "Jose\u0301")


def test_paths_are_not_normalised() -> None:
    """A path names a file by its bytes: a decomposed name comes back unchanged."""
    assert check_path("image", "/data/e\u0301.png") == "/data/e\u0301.png"


def test_actor_ids_follow_the_token_grammar() -> None:
    """An actor id is a printable token; a space is refused naming the rule."""
    assert check_actor_id("actor", "dr.smith@ward-3") == "dr.smith@ward-3"
    with pytest.raises(InvalidInput, match="no spaces"):
        check_actor_id("actor", "evil one")


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("actor:evil one", "grantee actor:<id> must be an ASCII letter or digit"),
        ("actor:", "grantee actor:<id>"),
        ("actor:a\x1b", "grantee actor:<id>"),
        ("role:clinican", "unknown role 'clinican'"),
        ("team:x", "actor:<id> or role:<role>"),
    ],
)
def test_grantees_are_checked_by_their_grammar(value: str, match: str) -> None:
    """A grantee is actor:<actor id> or role:<known role>; anything else is refused naming the rule."""
    with pytest.raises(InvalidInput, match=match):
        check_grantee(value, roles=frozenset({"agent", "clinician"}))
    assert check_grantee("actor:a1", roles=frozenset()) == "actor:a1"
    assert check_grantee("role:agent", roles=frozenset({"agent"})) == "role:agent"

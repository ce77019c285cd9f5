"""Tests of msm_mem._limits: the id rules and the bounds on text from outside."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from msm_mem import InvalidInput
from msm_mem._limits import (
    MAX_ID_CHARS,
    MAX_QUESTION_CHARS,
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

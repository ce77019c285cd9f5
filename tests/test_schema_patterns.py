"""The schema patterns of msm_mem._limits are at least as strict as the checks the server runs:
whatever a pattern admits, check_id / check_text admit; and the published schema carries them."""

from __future__ import annotations

import json
import re
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from msm_mem._limits import (
    ID_SCHEMA_PATTERN,
    PATIENT_PATH_PATTERN,
    REQUIRED_TEXT_SCHEMA_PATTERN,
    TEXT_SCHEMA_PATTERN,
    check_id,
    check_text,
)

DOC = Path(__file__).resolve().parents[1] / "docs" / "openapi.json"
#: every character up to U+FFFF but surrogates, with the troublesome ones drawn often
BMP = st.characters(max_codepoint=0xFFFF, blacklist_categories=("Cs",))
TRICKY = st.sampled_from("\x00\x1b\t\n\r\x7f\x85\u00ad\u200b\u200e\u202e\u2066\u2028\ufeff\ue000 *,a\u00e9")
TEXTS = st.text(st.one_of(BMP, TRICKY), max_size=12)


@settings(max_examples=400, deadline=None)
@given(TEXTS)
def test_what_the_id_patterns_admit_check_id_admits(value: str) -> None:
    """An id the schema admits (and in NFC: a pattern cannot say it) passes check_id."""
    value = unicodedata.normalize("NFC", value)
    for pattern in (ID_SCHEMA_PATTERN, PATIENT_PATH_PATTERN):
        if re.fullmatch(pattern, value):
            assert check_id("id", value) == value


@settings(max_examples=400, deadline=None)
@given(TEXTS)
def test_what_the_text_patterns_admit_check_text_admits(value: str) -> None:
    """Free text the schema admits passes check_text; required text is not blank."""
    if re.fullmatch(TEXT_SCHEMA_PATTERN, value):
        check_text("text", value, 100)
    if re.fullmatch(REQUIRED_TEXT_SCHEMA_PATTERN, value):
        check_text("text", value, 100, required=True)


@pytest.mark.parametrize("value", ["*", "a*", " ", "", "a\x1bb", "a\u202eb", "a\u200bb", "a\x00", "a\u2028b"])
def test_the_id_pattern_refuses_what_the_server_refuses(value: str) -> None:
    assert not re.fullmatch(ID_SCHEMA_PATTERN, value)
    assert not re.fullmatch(PATIENT_PATH_PATTERN, value)


def test_the_published_schema_is_as_strict_as_the_server() -> None:
    """docs/openapi.json: every patient id (path or query) has the pattern, every form's question
    the required-text pattern, and an image part at least one byte."""
    doc = json.loads(DOC.read_text())
    patients = [
        p["schema"]
        for path in doc["paths"].values()
        for op in path.values()
        for p in op.get("parameters", [])
        if p["name"] == "patient_id"
    ]
    # an optional query parameter says it beside its anyOf (where it binds every string)
    said = [s.get("pattern") or next(o for o in s["anyOf"] if o.get("type") == "string")["pattern"] for s in patients]
    assert len(said) >= 10 and all(p == PATIENT_PATH_PATTERN for p in said)
    forms = [s for name, s in doc["components"]["schemas"].items() if name.startswith("Body_")]
    assert forms and all(s["properties"]["image"]["minLength"] == 1 for s in forms)
    asks = [s for s in forms if "question" in s["properties"]]
    assert asks and all(s["properties"]["question"]["pattern"] == REQUIRED_TEXT_SCHEMA_PATTERN for s in asks)

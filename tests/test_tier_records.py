"""Tests of the typed short-term payload (msm_mem._tier_records.StmPayload)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from msm_mem import InvalidInput, StmItem, StmPayload

text = st.text(max_size=40)


def test_reads_the_stored_form_of_before_the_typed_record() -> None:
    """A payload written as JSON by earlier versions (held with its answer) parses unchanged."""
    old = json.dumps(
        {
            "question": "Q?",
            "timestamp": 1.5,
            "media_path": "a.png",
            "visual_tag": "PA",
            "study_id": "S1",
            "media_description": "",
            "answer": "Effusion.",
            "decision": "drain",
        }
    )
    p = StmPayload.from_json(old)
    assert (p.question, p.timestamp, p.study_id, p.answer, p.decision) == ("Q?", 1.5, "S1", "Effusion.", "drain")
    assert p.to_json() == old


@given(text, st.floats(allow_nan=False, allow_infinity=False), text, text, text, st.none() | text, text)
def test_round_trip(question: str, t: float, media: str, tag: str, study: str, answer: str | None, dec: str) -> None:
    """to_json and from_json are inverse for every payload (an unanswered one has no answer key)."""
    p = StmPayload(
        question,
        t,
        media_path=media,
        visual_tag=tag,
        study_id=study,
        answer=answer,
        decision=dec if answer is not None else "",
    )
    assert StmPayload.from_json(p.to_json()) == p
    assert ("answer" in json.loads(p.to_json())) == (answer is not None)


@pytest.mark.parametrize(
    "stored",
    [
        "not json",
        "[]",
        '{"timestamp": 1}',
        '{"question": "q"}',
        '{"question": "q", "timestamp": 1, "x": 1}',
        '{"question": 3, "timestamp": 1}',
        '{"question": "q", "timestamp": "now"}',
        '{"question": "q", "timestamp": true}',
        '{"question": "q", "timestamp": 1, "answer": 5}',
    ],
)
def test_malformed_stored_forms_are_refused(stored: str) -> None:
    """Anything that is not a payload is InvalidInput naming what is wrong, never a raw error."""
    with pytest.raises(InvalidInput, match="short-term payload"):
        StmPayload.from_json(stored)


def test_answered_keeps_the_rest() -> None:
    """answered() sets the answer and decision and nothing else."""
    p = StmPayload("Q?", 2.0, study_id="S2")
    assert p.answered("A.", "d") == StmPayload("Q?", 2.0, study_id="S2", answer="A.", decision="d")


def test_an_item_takes_only_a_typed_payload_or_none() -> None:
    """StmItem refuses raw text where the typed payload belongs; None means forgotten."""
    with pytest.raises(InvalidInput, match="StmPayload"):
        StmItem("M-1", "P1", "interaction", '{"question": "q"}', 1.0, 2.0)  # type: ignore[arg-type]
    assert StmItem("M-1", "P1", "interaction", None, 1.0, 2.0).payload is None

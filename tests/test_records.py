"""Tests of msm_mem._records: vector validation, record validation, semantic summaries."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from msm_mem import (
    EpisodicRecord,
    Impression,
    InvalidInput,
    InvalidVector,
    SemanticState,
    State,
    VisualRecord,
    unit_vector,
)
from msm_mem._records import ManifestRow, new_id

Z = np.ones(4, dtype=np.float32) / 2.0
T2020 = datetime(2020, 1, 2, tzinfo=UTC).timestamp()


# unit_vector ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("z", "match"),
    [
        ([1.0, 2.0, 3.0], "dimension 4"),
        ([1.0, 2.0, 3.0, 4.0, 5.0], "dimension 4"),
        ([1.0, float("nan"), 0.0, 0.0], "NaN"),
        ([1.0, float("inf"), 0.0, 0.0], "infinite"),
        ([0.0, 0.0, 0.0, 0.0], "zero norm"),
        ([[1.0, 0.0, 0.0, 0.0]], "1-d"),
        (np.ones((2, 4)), "1-d"),
        (3.0, "1-d"),
        (["a", "b", "c", "d"], "numeric"),
        ([1j, 0, 0, 0], "numeric"),
    ],
)
def test_unit_vector_rejects_bad_vectors(z: object, match: str) -> None:
    """Wrong dimension, NaN, inf, zero, 2-D, scalars and non-numbers raise InvalidVector."""
    with pytest.raises(InvalidVector, match=match):
        unit_vector(z, 4)


def test_invalid_vector_is_invalid_input_and_value_error() -> None:
    """InvalidVector can be caught as InvalidInput and as ValueError."""
    with pytest.raises(InvalidInput):
        unit_vector([0.0, 0.0], 2)
    with pytest.raises(ValueError):
        unit_vector([0.0, 0.0], 2)


def test_unit_vector_normalises_to_contiguous_float32() -> None:
    """The result has unit L2 norm, the input's direction, dtype float32 and is contiguous."""
    out = unit_vector([3.0, 4.0], 2)
    assert out.dtype == np.float32
    assert out.flags["C_CONTIGUOUS"]
    np.testing.assert_allclose(out, [0.6, 0.8], rtol=1e-6)


def test_unit_vector_accepts_non_contiguous_and_integer_input() -> None:
    """A strided view or an integer array is accepted and normalised."""
    strided = np.arange(8, dtype=np.float64)[::2] + 1.0  # [1, 3, 5, 7]
    out = unit_vector(strided, 4)
    assert out.flags["C_CONTIGUOUS"]
    np.testing.assert_allclose(out, strided / np.linalg.norm(strided), rtol=1e-6)
    np.testing.assert_allclose(unit_vector(np.array([0, 5]), 2), [0.0, 1.0])


@pytest.mark.parametrize(
    ("z", "match"),
    [
        (np.array([1.0, np.nan, 0.0, 0.0], dtype=np.float32), "NaN"),
        (np.array([1.0, -np.inf, 0.0, 0.0], dtype=np.float32), "infinite"),
        (np.zeros(4, dtype=np.float32), "zero norm"),
        (np.ones(3, dtype=np.float32), "dimension 4"),
        (np.ones((1, 4), dtype=np.float32), "1-d"),
    ],
)
def test_float32_input_is_checked_like_any_other(z: np.ndarray, match: str) -> None:
    """The float32 path (an encoder's output) refuses NaN, inf, zero and wrong shapes too."""
    with pytest.raises(InvalidVector, match=match):
        unit_vector(z, 4)


@pytest.mark.parametrize("scale", [3e38, 1e-44, 1.0])
def test_float32_input_of_any_magnitude_normalises_as_float64_does(scale: float) -> None:
    """Largest and subnormal float32 entries neither overflow nor underflow; the result matches
    the float64 path to float32 precision and does not alias the input."""
    rng = np.random.default_rng(3)
    z = (rng.uniform(-1.0, 1.0, 64) * scale).astype(np.float32)
    out = unit_vector(z, 64)
    assert out.dtype == np.float32 and out is not z
    np.testing.assert_allclose(out, unit_vector(z.astype(np.float64), 64), rtol=1e-6, atol=1e-7)
    assert abs(float(np.linalg.norm(out.astype(np.float64))) - 1.0) < 1e-6


@pytest.mark.parametrize("scale", [1e300, 1e-310])
def test_unit_vector_handles_extreme_magnitudes(scale: float) -> None:
    """Huge or subnormal finite entries still give the right unit vector (no overflow)."""
    out = unit_vector([3.0 * scale, 4.0 * scale], 2)
    np.testing.assert_allclose(out, [0.6, 0.8], rtol=1e-5)


@given(
    st.lists(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), min_size=3, max_size=3).filter(
        lambda v: any(abs(x) > 1e-3 for x in v)
    )
)
def test_unit_vector_always_has_unit_norm(values: list[float]) -> None:
    """For any non-zero finite vector the result has norm 1 (float32 precision)."""
    out = unit_vector(values, 3)
    assert abs(float(np.linalg.norm(out.astype(np.float64))) - 1.0) < 1e-5


def test_unit_vector_does_not_modify_its_input() -> None:
    """The caller's array is left unchanged."""
    z = np.array([3.0, 4.0])
    unit_vector(z, 2)
    np.testing.assert_array_equal(z, [3.0, 4.0])


# ids ------------------------------------------------------------------------------------------


def test_new_id_is_prefixed_and_unique() -> None:
    """new_id gives PREFIX-<32 hex> and never repeats."""
    ids = {new_id("E") for _ in range(100)}
    assert len(ids) == 100
    assert all(i.startswith("E-") and len(i) == 34 for i in ids)


# records --------------------------------------------------------------------------------------


def _episode(**changes: Any) -> EpisodicRecord:
    base: dict[str, Any] = dict(episode_id="E-1", patient_id="p1", timestamp=T2020, z=Z, question="Q?", answer="A.")
    base.update(changes)
    return EpisodicRecord(**base)


def _visual(**changes: Any) -> VisualRecord:
    base: dict[str, Any] = dict(visual_id="V-1", patient_id="p1", timestamp=T2020, z=Z)
    base.update(changes)
    return VisualRecord(**base)


def test_valid_records_keep_defaults() -> None:
    """Valid records build with the governance defaults (active, confidence 1, agent tier)."""
    e, v = _episode(), _visual()
    assert (e.state, e.confidence, e.evidence_tier, e.decay_at) == (State.ACTIVE, 1.0, "agent", None)
    assert (v.state, v.confidence, v.evidence_tier, v.supersedes) == (
        State.ACTIVE,
        1.0,
        "agent",
        None,
    )


@pytest.mark.parametrize(
    "changes",
    [
        {"episode_id": ""},
        {"episode_id": "   "},
        {"episode_id": 5},
        {"patient_id": None},
        {"timestamp": float("nan")},
        {"timestamp": float("inf")},
        {"timestamp": "2020-01-01"},
        {"timestamp": True},
        {"timestamp": 1e20},
        {"question": None},
        {"answer": 3},
        {"decision": b"bytes"},
        {"media_path": None},
        {"confidence": 1.5},
        {"confidence": -0.1},
        {"confidence": float("nan")},
        {"confidence": "0.5"},
    ],
)
def test_episodic_record_rejects_bad_fields(changes: dict[str, Any]) -> None:
    """Empty ids, non-text fields, bad times and confidences outside [0, 1] raise InvalidInput."""
    with pytest.raises(InvalidInput):
        _episode(**changes)


@pytest.mark.parametrize(
    "changes",
    [
        {"visual_id": ""},
        {"patient_id": 1},
        {"timestamp": float("nan")},
        {"timestamp": -1e20},
        {"visual_tag": None},
        {"source_episode_id": 7},
        {"confidence": 2.0},
    ],
)
def test_visual_record_rejects_bad_fields(changes: dict[str, Any]) -> None:
    """A visual record validates its id, text fields, time and confidence."""
    with pytest.raises(InvalidInput):
        _visual(**changes)


def test_records_are_frozen() -> None:
    """Long-term records cannot be changed in place (supersession makes a new record)."""
    e = _episode()
    with pytest.raises(AttributeError):
        e.answer = "changed"  # type: ignore[misc]


def test_record_equality_ignores_the_vector() -> None:
    """Two records differing only in z compare equal (z is excluded from comparison)."""
    assert _episode() == _episode(z=np.zeros(4, dtype=np.float32))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"timestamp": float("nan"), "text": "x"},
        {"timestamp": 1.0, "text": None},
        {"timestamp": 1.0, "text": "x", "decision": 3},
    ],
)
def test_impression_rejects_bad_fields(kwargs: dict[str, Any]) -> None:
    """An impression needs a finite time and text fields."""
    with pytest.raises(InvalidInput):
        Impression(**kwargs)


# semantic state -------------------------------------------------------------------------------


def _state(*imps: Impression, **changes: Any) -> SemanticState:
    base: dict[str, Any] = dict(state_id="S-1", patient_id="p1", category="impression")
    base.update(changes)
    return SemanticState(impressions=tuple(imps), **base)


def test_summary_format_is_one_dated_line_per_impression_oldest_first() -> None:
    """summary() prints '[YYYY-MM-DD] text (decision: d)' per impression, oldest first."""
    s = _state(
        Impression(T2020, "small left effusion", "follow up"),
        Impression(T2020 + 86400 * 31, "effusion resolved"),
    )
    assert s.summary() == ("[2020-01-02] small left effusion (decision: follow up)\n[2020-02-02] effusion resolved")


def test_summary_is_deterministic_and_empty_for_no_history() -> None:
    """The same state always gives the same summary; an empty history gives ''."""
    s = _state(Impression(T2020, "a"), Impression(T2020 + 1, "b"))
    assert s.summary() == _state(Impression(T2020, "a"), Impression(T2020 + 1, "b")).summary()
    assert _state().summary() == ""


def test_summary_uses_utc_dates() -> None:
    """A time just before midnight UTC is shown on its UTC day."""
    late = datetime(2020, 1, 2, 23, 59, 59, tzinfo=UTC).timestamp()
    assert _state(Impression(late, "x")).summary() == "[2020-01-02] x"


def test_summary_keeps_one_line_per_impression_for_multiline_text() -> None:
    """Newlines inside an impression or decision do not add lines to the summary."""
    s = _state(Impression(T2020, "line one\nline two", "a\nb"), Impression(T2020 + 1, "c"))
    lines = s.summary().splitlines()
    assert lines == ["[2020-01-02] line one line two (decision: a b)", "[2020-01-02] c"]


def test_last_is_the_newest_impression_or_none() -> None:
    """last returns the final impression, or None when the history is empty."""
    a, b = Impression(T2020, "a"), Impression(T2020 + 1, "b")
    assert _state(a, b).last == b
    assert _state().last is None


@pytest.mark.parametrize(
    "changes",
    [
        {"state_id": ""},
        {"patient_id": None},
        {"category": 3},
        {"version": 0},
        {"version": True},
        {"impressions": [Impression(1.0, "x")]},
        {"impressions": ("not an impression",)},
    ],
)
def test_semantic_state_rejects_bad_fields(changes: dict[str, Any]) -> None:
    """A semantic state needs an id, text fields, a tuple of impressions and version >= 1."""
    base: dict[str, Any] = dict(state_id="S-1", patient_id="p1", category="c", impressions=())
    base.update(changes)
    with pytest.raises(InvalidInput):
        SemanticState(**base)


def test_state_values_are_the_seed_lifecycle() -> None:
    """State has exactly the four lifecycle values, stored as lower-case strings."""
    assert [s.value for s in State] == ["active", "superseded", "anonymized", "retracted"]
    assert State("active") is State.ACTIVE


def _row(**changes: Any) -> ManifestRow:
    base: dict[str, Any] = {
        "patient_id": "P1",
        "study_id": "S1",
        "timestamp": 0.0,
        "image": "/data/a.png",
        "question": "What is seen?",
        "answer": "clear",
    }
    return ManifestRow(**{**base, **changes})


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"patient_id": "*"}, "patient_id must not contain '\\*'"),
        ({"patient_id": "\x00retired"}, "patient_id must not contain control"),
        ({"study_id": "S\n1"}, "study_id must not contain control"),
        ({"study_id": ""}, "study_id must not be blank"),
        ({"question": "q" * 20_000_000}, "question is longer"),
        ({"question": " "}, "question must not be empty"),
        ({"report": "r" * 200_000}, "report is longer"),
        ({"image": "a\x00.png"}, "image must not contain a NUL"),
        ({"image": ""}, "image must not be empty"),
        ({"timestamp": float("nan")}, "timestamp"),
        ({"view": "v" * 300}, "view is longer"),
        ({"line": -1}, "line"),
    ],
)
def test_manifest_row_checks_every_field(changes: dict[str, Any], match: str) -> None:
    """A ManifestRow cannot be built with a bad id, oversized text or an unusable path."""
    with pytest.raises(InvalidInput, match=match):
        _row(**changes)
    assert _row().patient_id == "P1"

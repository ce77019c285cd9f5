"""Tests of the principal (msm_mem._principal): closed roles and purposes, validated ids, frozen."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from msm_mem import InvalidInput, Principal, Purpose, Role


def test_strings_become_enums() -> None:
    """Role and purpose given as text are stored as the enums."""
    p = Principal("dr-1", "clinician", "research")  # type: ignore[arg-type]
    assert p.role is Role.CLINICIAN and p.purpose is Purpose.RESEARCH


def test_purpose_defaults_to_treatment() -> None:
    """Without a purpose the principal acts for treatment."""
    assert Principal("a-1", Role.AGENT).purpose is Purpose.TREATMENT


@pytest.mark.parametrize("purpose", ["reserch", "Treatment", "", "*", 3, None])
def test_unknown_purpose_is_refused_naming_the_allowed(purpose: object) -> None:
    """A purpose outside the closed set (a typo, another case, the wildcard, not text) is refused."""
    with pytest.raises(InvalidInput, match="use one of treatment"):
        Principal("a-1", Role.AGENT, purpose)  # type: ignore[arg-type]


@pytest.mark.parametrize("role", ["doctor", "ADMIN", "", None])
def test_unknown_role_is_refused(role: object) -> None:
    """A role outside the transition table's roles is refused."""
    with pytest.raises(InvalidInput, match="unknown role"):
        Principal("a-1", role)  # type: ignore[arg-type]


@pytest.mark.parametrize("pid", ["", " ", "*", "a b", "a\nb", "a\x00", "-lead", "x" * 129, 7])
def test_bad_ids_are_refused(pid: object) -> None:
    """Ids are short printable tokens: no blanks, wildcard, control characters or newlines."""
    with pytest.raises(InvalidInput, match="principal id"):
        Principal(pid, Role.AGENT)  # type: ignore[arg-type]


@given(st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._@:+-]{0,127}\Z"))
def test_every_token_id_is_accepted(pid: str) -> None:
    """Any id of the documented alphabet and length is accepted unchanged."""
    assert Principal(pid, Role.AUDITOR).id == pid


def test_principal_is_frozen() -> None:
    """A principal cannot be changed after it is made (no widening a role mid-call)."""
    p = Principal("a-1", Role.AGENT)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.role = Role.ADMIN  # type: ignore[misc]


def test_acting_for_keeps_id_and_role() -> None:
    """acting_for changes only the purpose, and validates it."""
    p = Principal("a-1", Role.AGENT).acting_for("research")
    assert (p.id, p.role, p.purpose) == ("a-1", Role.AGENT, Purpose.RESEARCH)
    with pytest.raises(InvalidInput):
        p.acting_for("reserch")

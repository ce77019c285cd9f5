"""Tests of msm_mem._governance.audit.fhir: the audit tier as FHIR R5 AuditEvent resources (IHE BALP),
event by event (the export of a whole store, its verification and the command line are in
``tests/test_fhir_export.py``)."""

from __future__ import annotations

from typing import Any

import pytest
from fhir.resources.auditevent import AuditEvent as FhirAuditEvent
from hypothesis import given
from hypothesis import strategies as st

from msm_mem import InvalidInput
from msm_mem._governance.audit.chain import ChainBuilder
from msm_mem._governance.audit.event import AuditEvent
from msm_mem._governance.audit.fhir import to_fhir

OUTCOME_SYSTEM = "http://terminology.hl7.org/CodeSystem/audit-event-outcome"
DCM = "http://dicom.nema.org/resources/ontology/DCM"


def codes(concept: dict[str, Any]) -> dict[str, str]:
    """``{system: code}`` of a CodeableConcept."""
    return {c["system"]: c["code"] for c in concept.get("coding", [])}


def _event(
    action: str = "write",
    *,
    outcome: str = "success",
    role: str = "agent",
    purpose: str = "treatment",
    time: float = 1_700_000_000.0,
    reason: str = "",
    patient: str = "pt-abc",
    consent_id: str = "",
    record_ids: tuple[str, ...] = ("E-1",),
    actor: str = "a1",
    tier: str = "stm",
) -> AuditEvent:
    """One chained event with the given fields."""
    return ChainBuilder().next(
        time=time,
        actor=actor,
        role=role,
        action=action,
        source_tier=tier,
        target_tier="ltm",
        purpose=purpose,
        outcome=outcome,
        record_ids=record_ids,
        patient=patient,
        consent_id=consent_id,
        reason=reason,
    )


# the mapping, event by event ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "verb", "category"),
    [
        ("write", "C", "110110"),
        ("consolidate", "C", "110110"),
        ("critic_promote", "C", "110110"),
        ("semantic_update", "U", "110110"),
        ("supersede", "U", "110110"),
        ("decay", "U", "110110"),
        ("expire", "D", "110110"),
        ("retract", "D", "110110"),
        ("discard", "D", "110110"),
        ("hold", "E", "110110"),
        ("consent_grant", "C", "110113"),
        ("consent_revoke", "U", "110113"),
        ("key_rotate", "E", "110113"),
        ("export", "R", "110106"),
        ("import", "C", "110107"),
        ("turn", "E", "110100"),
        ("no_such_action", "E", "110100"),
    ],
)
def test_action_mapping(action: str, verb: str, category: str) -> None:
    """Each stored action maps to its documented AuditEvent.action and DICOM category; the action stays."""
    resource = to_fhir(_event(action))
    FhirAuditEvent.model_validate(resource)
    assert resource["action"] == verb
    assert codes(resource["category"][0]) == {DCM: category}
    assert codes(resource["code"])["urn:msm-mem:audit-action"] == action and resource["code"]["text"] == action


def test_error_outcome_is_serious_failure_kept_apart_from_denied() -> None:
    """outcome error -> code 8, severity error, local code 'error' and the reason as detail text."""
    resource = to_fhir(_event("turn", outcome="error", reason="BackendError"))
    assert resource["outcome"]["code"]["code"] == "8" and resource["severity"] == "error"
    (detail,) = resource["outcome"]["detail"]
    assert codes(detail) == {"urn:msm-mem:audit-outcome": "error"} and detail["text"] == "BackendError"


@pytest.mark.parametrize(
    ("purpose", "code"),
    [
        ("treatment", "TREAT"),
        ("operations", "HOPERAT"),
        ("research", "HRESCH"),
        ("export", "RECORDMGT"),
        ("erasure", "RECORDMGT"),
        ("*", None),
        ("teaching file", None),
    ],
)
def test_purpose_becomes_authorization(purpose: str, code: str | None) -> None:
    """The purpose maps to its v3-ActReason code (when one is documented) and keeps its own text."""
    (concept,) = to_fhir(_event(purpose=purpose))["authorization"]
    assert codes(concept).get("http://terminology.hl7.org/CodeSystem/v3-ActReason") == code
    assert concept["text"] == purpose


def test_role_types_and_consent_entities() -> None:
    """Role -> agent.type; consent_grant record ids become Consent entities, not duplicated."""
    grant = to_fhir(_event("consent_grant", role="admin", patient="*", consent_id="C-1", record_ids=("C-1",)))
    FhirAuditEvent.model_validate(grant)
    assert "patient" not in grant  # a grant for every patient names none
    assert [e["what"]["identifier"] for e in grant["entity"]] == [{"system": "urn:msm-mem:consent", "value": "C-1"}]
    assert codes(grant["agent"][0]["type"]) == {
        "http://terminology.hl7.org/CodeSystem/extra-security-role-type": "humanuser"
    }
    assert codes(to_fhir(_event(role="agent"))["agent"][0]["type"]) == {DCM: "110150"}


def test_recorded_is_a_utc_instant() -> None:
    """Times become UTC instants with their fraction; times FHIR cannot hold are refused."""
    assert to_fhir(_event(time=1_700_000_000.25))["recorded"] == "2023-11-14T22:13:20.25Z"
    assert to_fhir(_event(time=-86400.0))["recorded"] == "1969-12-31T00:00:00Z"
    with pytest.raises(InvalidInput):
        to_fhir(_event(time=1e15))


def test_strings_fhir_cannot_hold_are_escaped() -> None:
    """Control characters and whitespace-only values are written JSON-escaped, and still validate."""
    resource = to_fhir(_event(actor="a\x00b", reason="\x0c", purpose=" ", role="agent"))
    FhirAuditEvent.model_validate(resource)
    assert resource["agent"][0]["who"]["identifier"]["value"] == '"a\\u0000b"'
    assert resource["outcome"]["detail"][0]["text"] == '"\\f"'
    assert resource["authorization"] == [{"text": '" "'}]  # no local coding: " " is not a FHIR code


@given(
    text=st.fixed_dictionaries(
        {
            "action": st.text(min_size=1, max_size=12),
            "actor": st.text(min_size=1, max_size=8),
            "role": st.text(max_size=8),
            "purpose": st.text(max_size=12),
            "reason": st.text(max_size=20),
            "patient": st.text(max_size=8),
            "consent_id": st.text(max_size=8),
            "tier": st.text(max_size=6),
        }
    ),
    ids=st.lists(st.text(max_size=8), max_size=3),
    outcome=st.sampled_from(["success", "denied", "error"]),
)
def test_any_event_maps_to_a_valid_resource(text: dict[str, str], ids: list[str], outcome: str) -> None:
    """For any stored field values, the resource validates, has no empty value, and re-verifies."""
    try:
        event = _event(
            text["action"],
            actor=text["actor"],
            role=text["role"],
            purpose=text["purpose"],
            reason=text["reason"],
            patient=text["patient"],
            consent_id=text["consent_id"],
            tier=text["tier"],
            record_ids=tuple(ids),
            outcome=outcome,
        )
    except InvalidInput:  # a lone surrogate cannot be stored at all
        return
    resource = to_fhir(event)
    FhirAuditEvent.model_validate(resource)
    assert not _has_empty(resource)
    assert to_fhir(AuditEvent.from_row(*event.row())) == resource


def _has_empty(value: Any) -> bool:
    """Whether a JSON value holds an empty string, array or object anywhere (FHIR JSON forbids them)."""
    if isinstance(value, dict):
        return not value or any(_has_empty(v) for v in value.values())
    if isinstance(value, list):
        return not value or any(_has_empty(v) for v in value)
    return isinstance(value, str) and not value

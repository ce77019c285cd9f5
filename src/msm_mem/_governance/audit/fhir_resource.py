"""One stored audit event as a FHIR R5 ``AuditEvent`` resource shaped like IHE BALP.

IHE Basic Audit Log Patterns (BALP) are written against FHIR R4; this module writes R5, where
``type``/``subtype`` became ``category``/``code``, ``outcome``/``outcomeDesc`` became
``outcome.code``/``outcome.detail``, and ``purposeOfEvent`` became ``authorization`` (R5 has no
``purposeOfUse`` element). One stored audit event gives one resource; nothing is looked up.

Event mapping (``action`` of the stored event -> resource; BALP names are R4 profiles
``IHE.BasicAudit.<name>``; "DCM" is the DICOM code system, "rest" is restful-interaction)::

    stored action                    BALP           category (DCM)        code                 action
    read, context (a fused prompt    PatientRead    110110 Patient Record rest read            R
      handed out)
    write, cross_scope_copy,         PatientCreate  110110 Patient Record rest create          C
      consolidate, age_threshold,
      critic_promote
    refresh, semantic_update,        PatientUpdate  110110 Patient Record rest update          U
      supersede, critic_reject,
      decay
    discard, expire, retract         PatientDelete  110110 Patient Record rest delete          D
    hold (gate kept it in STM)       -              110110 Patient Record local only           E
    consent (an access decision)     AuthZconsent   110113 Security Alert BALP AuthZsubType    E
                                                                          AuthZ-Consent
    consent_grant, consent_revoke    -              110113 Security Alert DCM 110135 Object    C, U
                                                                          Security Attributes
                                                                          Changed
    key_rotate                       -              110113 Security Alert DCM 110129 Security  E
                                                                          Configuration
    export, import                   - (DICOM)      110106 Export,        local only           R, C
                                                    110107 Import
    purge_expired                    -              110100 Application    local only           D
                                                    Activity
    answer (a model's answer, as     -              110100 Application    local only           E
      ask gives it or as an agent                   Activity
      records it), turn (a failed
      turn) and any action not listed

``code`` always also carries the stored action verbatim as a coding of the local CodeSystem
``urn:msm-mem:audit-action`` (and as ``code.text``), so the original is never lost.

Other elements:

* ``id`` = ``audit-<seq>``; ``recorded`` = the event time as a FHIR instant in UTC (``Z``).
* ``outcome.code`` (``http://terminology.hl7.org/CodeSystem/audit-event-outcome``, R5 codes
  0/4/8/12): ``success`` -> ``0`` Success; ``denied`` -> ``8`` Serious failure (what BALP's
  consent-deny example uses); ``error`` -> ``8`` Serious failure (R5: "unexpected error, often
  equivalent to an HTTP 500"; ``4`` is for HTTP-400-like request faults and ``12`` for a system
  no longer available, neither fits). ``outcome.detail`` carries the stored outcome as a local
  coding (``urn:msm-mem:audit-outcome``, so denied and error stay apart) and the stored reason
  as text; it is present for every non-success and for a success with a reason.
* ``severity``: success -> ``informational``, denied -> ``warning``, error -> ``error``.
* ``patient`` = a Reference whose only content is the identifier
  ``{system: urn:msm-mem:pseudonym, value: <pseudonym>}`` (the stored random pseudonym, never a
  patient id); BALP's patient entity (object-role ``1`` Patient) repeats it. Events about every
  patient (``*``) or none have no patient element.
* ``agent`` = the actor: ``who.identifier {system: urn:msm-mem:actor}``, ``requestor`` true,
  ``role`` = the stored role (local ``urn:msm-mem:role``), ``type`` from the role: agent and
  system -> DCM ``110150`` Application; clinician, admin, auditor -> extra-security-role-type
  ``humanuser``; critic -> v3-ParticipationType ``VRF`` verifier.
* a record id ``model:<backbone>[/<model>][@<version>]`` (the model that produced an answer)
  is a second ``agent``: ``who.identifier {system: urn:msm-mem:model, value: <the id without
  "model:">}``, ``type`` DCM ``110150`` Application, ``requestor`` false.
* ``entity``: one per other non-empty record id, ``what.identifier {system: urn:msm-mem:record}``
  and object-role ``4`` Domain Resource (consent ids of consent_grant/revoke use
  ``urn:msm-mem:consent``, ``what.type`` Consent and object-role ``13`` Security Resource); the
  deciding consent of the event (``consent_id``) is such a Consent entity as well.
* ``authorization`` (R5's purpose of use) from the purpose, v3-ActReason: treatment -> TREAT,
  operations -> HOPERAT, research -> HRESCH, export and erasure -> RECORDMGT, emergency ->
  ETREAT, payment -> HPAYMT, public_health -> PUBHLTH; always with the stored purpose as a
  ``urn:msm-mem:purpose`` coding and as text (``*`` and unknown purposes get only those).
* ``source.observer`` = Reference with display ``msm-mem``; ``source.type``
  security-source-type ``4`` Application Server (``6`` Security Server for consent decisions).
* ``extension`` ``urn:msm-mem:audit-chain`` holds ``seq`` (valueInteger64), ``prevHash``,
  ``eventHash``, ``sourceTier``, ``targetTier`` (valueString) and ``payload``
  (valueBase64Binary: the exact hashed bytes). :func:`.fhir.verify_fhir` re-verifies the chain from
  an export alone and checks that every resource is exactly what its payload maps to.

A stored string that FHIR cannot hold (control characters, or whitespace only) is written
JSON-escaped with its quotes (``"\\f"``); a value that is not a valid FHIR code gets no local
coding, only text. The payload keeps every original byte.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from ..._errors import InvalidInput
from .event import AuditEvent

__all__ = ["CHAIN_EXTENSION", "to_fhir"]

CHAIN_EXTENSION = "urn:msm-mem:audit-chain"
"""URL of the extension holding seq, prevHash, eventHash, tiers and the hashed payload."""

_DCM = "http://dicom.nema.org/resources/ontology/DCM"
_REST = "http://hl7.org/fhir/restful-interaction"
_AUTHZ = "https://profiles.ihe.net/ITI/BALP/CodeSystem/AuthZsubType"
_OUTCOME = "http://terminology.hl7.org/CodeSystem/audit-event-outcome"
_ACT_REASON = "http://terminology.hl7.org/CodeSystem/v3-ActReason"
_OBJECT_ROLE = "http://terminology.hl7.org/CodeSystem/object-role"
_SOURCE_TYPE = "http://terminology.hl7.org/CodeSystem/security-source-type"
_EXTRA_ROLE = "http://terminology.hl7.org/CodeSystem/extra-security-role-type"
_PARTICIPATION = "http://terminology.hl7.org/CodeSystem/v3-ParticipationType"
_LOCAL_ACTION = "urn:msm-mem:audit-action"
_LOCAL_OUTCOME = "urn:msm-mem:audit-outcome"
_LOCAL_PURPOSE = "urn:msm-mem:purpose"
_LOCAL_ROLE = "urn:msm-mem:role"
_PSEUDONYM = "urn:msm-mem:pseudonym"
_ACTOR = "urn:msm-mem:actor"
_RECORD = "urn:msm-mem:record"
_CONSENT = "urn:msm-mem:consent"
_MODEL = "urn:msm-mem:model"
_MODEL_PREFIX = "model:"

Code = tuple[str, str, str]  # (system, code, display)

_PATIENT_RECORD: Code = (_DCM, "110110", "Patient Record")
_SECURITY_ALERT: Code = (_DCM, "110113", "Security Alert")
_APP_ACTIVITY: Code = (_DCM, "110100", "Application Activity")
_REST_CODES = {c: (_REST, c, c) for c in ("read", "create", "update", "delete")}


@dataclass(frozen=True, slots=True)
class _Pattern:
    category: Code
    code: Code | None  # the standard coding of ``code``; the local action coding is always added
    action: str  # R5 AuditEvent.action: C R U D E


def _patient(rest: str, action: str) -> _Pattern:
    return _Pattern(_PATIENT_RECORD, _REST_CODES[rest], action)


_AUTHZ_CONSENT: Code = (_AUTHZ, "AuthZ-Consent", "Authorization Decision using Roles and Consent")
_ATTRS_CHANGED: Code = (_DCM, "110135", "Object Security Attributes Changed")
_PATTERNS: dict[str, _Pattern] = {
    **{a: _patient("read", "R") for a in ("read", "context")},
    **{
        a: _patient("create", "C")
        for a in ("write", "cross_scope_copy", "consolidate", "age_threshold", "critic_promote")
    },
    **{a: _patient("update", "U") for a in ("refresh", "semantic_update", "supersede", "critic_reject", "decay")},
    **{a: _patient("delete", "D") for a in ("discard", "expire", "retract")},
    "hold": _Pattern(_PATIENT_RECORD, None, "E"),
    "consent": _Pattern(_SECURITY_ALERT, _AUTHZ_CONSENT, "E"),
    "consent_grant": _Pattern(_SECURITY_ALERT, _ATTRS_CHANGED, "C"),
    "consent_revoke": _Pattern(_SECURITY_ALERT, _ATTRS_CHANGED, "U"),
    "key_rotate": _Pattern(_SECURITY_ALERT, (_DCM, "110129", "Security Configuration"), "E"),
    "export": _Pattern((_DCM, "110106", "Export"), None, "R"),
    "import": _Pattern((_DCM, "110107", "Import"), None, "C"),
    "purge_expired": _Pattern(_APP_ACTIVITY, None, "D"),
}
_DEFAULT = _Pattern(_APP_ACTIVITY, None, "E")

_OUTCOMES = {"success": ("0", "Success"), "denied": ("8", "Serious failure"), "error": ("8", "Serious failure")}
_SEVERITY = {"success": "informational", "denied": "warning", "error": "error"}
_APPLICATION: Code = (_DCM, "110150", "Application")
_HUMAN: Code = (_EXTRA_ROLE, "humanuser", "human user")
_ROLE_TYPES: dict[str, Code] = {
    "agent": _APPLICATION,
    "system": _APPLICATION,
    "clinician": _HUMAN,
    "admin": _HUMAN,
    "auditor": _HUMAN,
    "critic": (_PARTICIPATION, "VRF", "verifier"),
}
_PURPOSES: dict[str, Code] = {
    "treatment": (_ACT_REASON, "TREAT", "treatment"),
    "operations": (_ACT_REASON, "HOPERAT", "healthcare operations"),
    "research": (_ACT_REASON, "HRESCH", "healthcare research"),
    "export": (_ACT_REASON, "RECORDMGT", "records management"),
    "erasure": (_ACT_REASON, "RECORDMGT", "records management"),
    "emergency": (_ACT_REASON, "ETREAT", "emergency treatment"),
    "payment": (_ACT_REASON, "HPAYMT", "healthcare payment"),
    "public_health": (_ACT_REASON, "PUBHLTH", "public health"),
}
_CONSENT_ACTIONS = frozenset({"consent_grant", "consent_revoke"})


_FHIR_CODE = re.compile(r"[^\s]+(\s[^\s]+)*")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _string(value: str) -> str:
    """``value`` as a FHIR string: as is, unless it holds control characters or only whitespace
    (FHIR strings must not), then JSON-escaped in ASCII with its quotes, so still readable."""
    if _CONTROL.search(value) or not value.strip():
        return json.dumps(value)
    return value


def _local(system: str, value: str) -> tuple[Code, ...]:
    """A local coding of ``value``, or none when it is not a valid FHIR code (then text keeps it)."""
    return ((system, value, value),) if _FHIR_CODE.fullmatch(value) and not _CONTROL.search(value) else ()


def _coding(code: Code) -> dict[str, str]:
    return {"system": code[0], "code": code[1], "display": code[2]}


def _concept(*codes: Code, text: str = "") -> dict[str, Any]:
    d: dict[str, Any] = {"coding": [_coding(c) for c in codes]} if codes else {}
    if text:  # FHIR JSON has no empty strings or arrays
        d["text"] = _string(text)
    return d


def _instant(seconds: float) -> str:
    """UTC seconds as a FHIR instant (``YYYY-MM-DDThh:mm:ss[.ffffff]Z``), microsecond precision."""
    try:
        t = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(seconds=seconds)
    except OverflowError:
        raise InvalidInput(f"audit time {seconds!r} is outside the years 1-9999") from None
    frac = f".{t.microsecond:06d}".rstrip("0") if t.microsecond else ""
    return f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:{t.second:02d}{frac}Z"


def _identifier(system: str, value: str) -> dict[str, str]:
    return {"system": system, "value": _string(value)}


def _consent_entity(consent_id: str) -> dict[str, Any]:
    return {
        "what": {"type": "Consent", "identifier": _identifier(_CONSENT, consent_id)},
        "role": _concept((_OBJECT_ROLE, "13", "Security Resource")),
    }


def _entities(event: AuditEvent, patient_ref: dict[str, Any] | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if patient_ref is not None:
        out.append({"what": patient_ref, "role": _concept((_OBJECT_ROLE, "1", "Patient"))})
    consents: set[str] = set()
    for rid in dict.fromkeys(event.record_ids):  # unique, in order; "" marks "none" in a slot
        if not rid or rid.startswith(_MODEL_PREFIX):
            continue
        if event.action in _CONSENT_ACTIONS:
            out.append(_consent_entity(rid))
            consents.add(rid)
        else:
            out.append(
                {
                    "what": {"identifier": _identifier(_RECORD, rid)},
                    "role": _concept((_OBJECT_ROLE, "4", "Domain Resource")),
                }
            )
    if event.consent_id and event.consent_id not in consents:
        out.append(_consent_entity(event.consent_id))
    return out


def _chain_extension(event: AuditEvent) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [
        {"url": "seq", "valueInteger64": str(event.seq)},  # R5 JSON writes integer64 as a string
        {"url": "prevHash", "valueString": event.prev_hash},
        {"url": "eventHash", "valueString": event.event_hash},
    ]
    parts += [
        {"url": url, "valueString": _string(v)}
        for url, v in (("sourceTier", event.source_tier), ("targetTier", event.target_tier))
        if v
    ]
    parts.append({"url": "payload", "valueBase64Binary": base64.b64encode(event.payload()).decode("ascii")})
    return {"url": CHAIN_EXTENSION, "extension": parts}


def to_fhir(event: AuditEvent) -> dict[str, Any]:
    """The FHIR R5 AuditEvent (as a JSON-ready dict) for one audit event; see the module table.

    Pure and deterministic: the same event always maps to the same dict. Raises
    :class:`InvalidInput` only for a time outside the years 1-9999 (FHIR instants cannot
    hold it).
    """
    pattern = _PATTERNS.get(event.action, _DEFAULT)
    standard = (pattern.code,) if pattern.code else ()
    code = _concept(*standard, *_local(_LOCAL_ACTION, event.action), text=event.action)
    outcome_code, outcome_display = _OUTCOMES[event.outcome]
    outcome: dict[str, Any] = {"code": _coding((_OUTCOME, outcome_code, outcome_display))}
    if event.outcome != "success" or event.reason:
        outcome["detail"] = [_concept((_LOCAL_OUTCOME, event.outcome, event.outcome), text=event.reason)]
    agent: dict[str, Any] = {"who": {"identifier": _identifier(_ACTOR, event.actor)}, "requestor": True}
    if event.role:
        role_type = _ROLE_TYPES.get(event.role)
        if role_type is not None:
            agent["type"] = _concept(role_type)
        agent["role"] = [_concept(*_local(_LOCAL_ROLE, event.role), text=event.role)]
    resource: dict[str, Any] = {
        "resourceType": "AuditEvent",
        "id": f"audit-{event.seq}",
        "extension": [_chain_extension(event)],
        "category": [_concept(pattern.category)],
        "code": code,
        "action": pattern.action,
        "severity": _SEVERITY[event.outcome],
        "recorded": _instant(event.time),
        "outcome": outcome,
    }
    if event.purpose:
        mapped = _PURPOSES.get(event.purpose)
        codes = ((mapped,) if mapped else ()) + _local(_LOCAL_PURPOSE, event.purpose)
        resource["authorization"] = [_concept(*codes, text=event.purpose)]
    patient_ref = None
    if event.patient and event.patient != "*":
        patient_ref = {"type": "Patient", "identifier": _identifier(_PSEUDONYM, event.patient)}
        resource["patient"] = patient_ref
    models = [
        {
            "type": _concept(_APPLICATION),
            "who": {"identifier": _identifier(_MODEL, rid[len(_MODEL_PREFIX) :])},
            "requestor": False,
        }
        for rid in dict.fromkeys(event.record_ids)
        if rid.startswith(_MODEL_PREFIX)
    ]
    resource["agent"] = [agent, *models]
    source_type = ("6", "Security Server") if event.action == "consent" else ("4", "Application Server")
    resource["source"] = {"observer": {"display": "msm-mem"}, "type": [_concept((_SOURCE_TYPE, *source_type))]}
    entities = _entities(event, patient_ref)
    if entities:
        resource["entity"] = entities
    return resource

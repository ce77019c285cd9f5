"""Consent: FHIR-like records checked on every access; no matching permit means denied.

A request names the patient, the actor and role, the purpose of use and the data classes it
touches (``episodic``, ``visual``, ``semantic``, ``stm``, ``claims``). It is permitted when a
consent in force at that time matches the patient (or ``*``), the grantee (``actor:<id>`` or
``role:<role>``), the purpose (or ``*``) and covers every requested class (or ``*``), and no
matching ``deny`` covers any requested class. Deny wins; silence denies (fail closed).

One more class, ``population``, is never part of a turn on the patient: it is the use of the
patient's records, de-identified, as population experience in *other* patients' answers. A
hit of another patient reaches an answer only when that patient's consents permit the asking
actor and purpose the class ``population`` (``*`` covers it); a patient opts out with a
``deny`` of ``population``. Anonymised (decayed) records belong to no patient any more and need
no consent.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .._errors import InvalidInput
from .._limits import check_grantee, check_id
from .._principal import as_purpose
from .._records import new_id
from .._tier_records import ConsentRecord
from .._transitions import ROLES

__all__ = ["DATA_CLASSES", "POPULATION", "ConsentDecision", "check_record", "default_policy", "evaluate"]

#: the classes of a patient's own data that a turn on the patient touches
DATA_CLASSES = ("episodic", "visual", "semantic", "stm", "claims")
#: use of a patient's records, de-identified, as population experience for other patients
POPULATION = "population"


@dataclass(frozen=True, slots=True)
class ConsentDecision:
    """The outcome: ``consent_id`` is the deciding record ("" when nothing matched)."""

    permitted: bool
    consent_id: str
    reason: str


def _matches(c: ConsentRecord, patient: str, actor: str, role: str, purpose: str, when: float) -> bool:
    return (
        c.patient_id in (patient, "*")
        and c.grantee in (f"actor:{actor}", f"role:{role}")
        and c.purpose in (purpose, "*")
        and c.active_at(when)
    )


def evaluate(
    consents: Iterable[ConsentRecord],
    *,
    patient: str,
    actor: str,
    role: str,
    purpose: str,
    classes: Sequence[str],
    when: float,
) -> ConsentDecision:
    """Decide one access request against the consent records (see module docstring)."""
    wanted = set(classes)
    permit: ConsentRecord | None = None
    for c in consents:
        if not _matches(c, patient, actor, role, purpose, when):
            continue
        covered = "*" in c.data_classes or wanted <= set(c.data_classes)
        touches = "*" in c.data_classes or bool(wanted & set(c.data_classes))
        if c.decision == "deny" and touches:
            return ConsentDecision(False, c.consent_id, "denied by consent")
        if c.decision == "permit" and covered and permit is None:
            permit = c
    if permit is None:
        return ConsentDecision(False, "", "no matching permit")
    return ConsentDecision(True, permit.consent_id, "permitted")


def check_record(c: ConsentRecord) -> None:
    """Refuse a consent that could never match what it names: an invalid patient id (other
    than the wildcard ``*``), an unknown data class, role or purpose.

    A typo (``episodc``, ``role:clinican``) would otherwise be stored and silently grant or
    deny nothing.
    """
    check_id("consent_id", c.consent_id)
    if c.patient_id != "*":  # the wildcard, or one valid patient id
        check_id("consent patient_id", c.patient_id)
    unknown = sorted(set(c.data_classes) - {*DATA_CLASSES, POPULATION, "*"})
    if unknown:
        raise InvalidInput(f"unknown data class(es) {unknown}: use {', '.join((*DATA_CLASSES, POPULATION))} or *")
    check_grantee(c.grantee, roles=frozenset(ROLES))
    if c.purpose != "*":
        as_purpose(c.purpose)


def default_policy(now: float, *, population: bool = True) -> list[ConsentRecord]:
    """The policy ``msm-mem init`` writes (``--population permit|deny``).

    Treatment by the care team: agents, clinicians and critics may read and write every data
    class of every patient for purpose ``treatment``; with ``population`` (the default) that
    includes ``population`` (every patient's records, de-identified, may inform another
    patient's answer for treatment by the care team, until the patient's ``deny`` of
    ``population`` says otherwise); without it the grants name the patient's own classes only,
    so no patient's records inform another's answer until a consent permits ``population``
    for that patient (an opt-in). The system role may run maintenance (``operations``) on every
    class. Nothing else is permitted (research, export...) until a consent grants it. A real
    deployment replaces this with the hospital's consent records.
    """
    grants = [
        ("role:agent", "treatment"),
        ("role:clinician", "treatment"),
        ("role:critic", "treatment"),
        ("role:system", "operations"),
        ("role:clinician", "export"),
    ]
    return [
        ConsentRecord(
            consent_id=new_id("C"),
            patient_id="*",
            grantee=g,
            purpose=p,
            decision="permit",
            data_classes=("*",) if population or g == "role:system" else DATA_CLASSES,
            start=0.0,
            created_at=now,
        )
        for g, p in grants
    ]

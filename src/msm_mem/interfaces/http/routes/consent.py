"""Consent: grant, list and revoke (admin; the auditor lists, with patients as pseudonyms)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi import Path as PathParam

from .... import ConsentRecord
from ...._limits import ID_SCHEMA_PATTERN, PATIENT_PATH_PATTERN
from ...auth.apikeys import ALL_PATIENTS
from ..models import ConsentOut, GrantIn, Page
from ..state import CallerDep, Paging, authorize, paging, require_json, server
from . import PROBLEM_RESPONSES

__all__ = ["router"]

router = APIRouter(prefix="/v1/consents", tags=["consent"], responses=PROBLEM_RESPONSES)


@router.post("", response_model=list[ConsentOut], status_code=201, dependencies=[Depends(require_json)])
def grant(request: Request, who: CallerDep, body: GrantIn) -> list[ConsentOut]:
    """Store consent records (admin); each patient (``*``: every patient) must lie in the
    credential's scope. All are validated first; nothing is stored when one is refused."""
    state = server(request)
    for patient in sorted({c.patient_id for c in body.consents}):
        authorize(request, who, "consent_grant", patient)
    import secrets

    now = state.mem.now()
    records = [
        ConsentRecord(
            consent_id="C-" + secrets.token_hex(16),
            patient_id=c.patient_id,
            grantee=c.grantee,
            purpose=c.purpose,
            decision=c.decision,
            data_classes=tuple(c.data_classes),
            start=now if c.start is None else c.start,
            end=c.end,
            created_at=now,
        )
        for c in body.consents
    ]
    state.call(state.mem.grant, who.principal, records)
    return [ConsentOut.model_validate(c) for c in records]


@router.get("", response_model=Page[ConsentOut])
def consents(
    request: Request,
    who: CallerDep,
    pg: Annotated[Paging, Depends(paging)],
    patient_id: Annotated[
        str | None,
        Query(min_length=1, max_length=128, pattern=r"^[^\s,*]+$", json_schema_extra={"pattern": PATIENT_PATH_PATTERN}),
    ] = None,
) -> Page[ConsentOut]:
    """The consent records (of one patient, or all in the credential's scope). The auditor sees
    each patient as its audit pseudonym, never the patient id."""
    state = server(request)
    if patient_id is not None:
        authorize(request, who, "consent_list", patient_id)
    # a caller without every patient in scope lists only its patients' consents (and those of
    # every patient); the read pages the list, so its audit event names the page's consents
    scoped = patient_id is None and who.principal.role.value != "auditor" and not who.covers(ALL_PATIENTS)
    within = who.patients if scoped else None
    read = state.mem.consents
    records = state.call(read, who.principal, patient_id, within=within, offset=pg.offset, limit=pg.limit)
    items = [ConsentOut.model_validate(c) for c in records]
    nxt = records.next_offset
    return Page[ConsentOut](items=items, total=records.total, offset=records.offset, limit=pg.limit, next_offset=nxt)


@router.delete("/{consent_id}", status_code=204, response_class=Response)
def revoke(
    request: Request,
    who: CallerDep,
    consent_id: Annotated[
        str, PathParam(min_length=1, max_length=200, json_schema_extra={"pattern": ID_SCHEMA_PATTERN})
    ],
) -> Response:
    """Revoke a consent from now on (admin with every patient in scope, or break-glass)."""
    state = server(request)
    authorize(request, who, "consent_revoke", ALL_PATIENTS)
    state.call(state.mem.revoke, who.principal, consent_id)
    return Response(status_code=204)

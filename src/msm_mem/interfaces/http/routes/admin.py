"""Keys (rotation, shredding), the audit tier (verify, checkpoint, FHIR export) and maintenance."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response

from .... import ErasureReceipt
from ..models import CheckpointOut, CountOut, ErasureOut, MaintenanceOut, ReasonIn, ReceiptBody, VerifyOut
from ..state import CallerDep, authorize, require_json, server
from . import PROBLEM_RESPONSES, PatientId

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["admin"], responses=PROBLEM_RESPONSES)

FHIR_NDJSON = "application/fhir+ndjson"


@router.post("/keys/rotate", response_model=CountOut, dependencies=[Depends(require_json)])
def rotate_keys(request: Request, who: CallerDep, body: ReasonIn) -> CountOut:
    """A new key-encryption key; every data key rewrapped under it (admin). The count rewrapped."""
    state = server(request)
    return CountOut(count=state.call(state.mem.rotate_keys, who.principal, body.reason))


@router.post("/patients/{patient_id}/shred", response_model=ErasureOut, dependencies=[Depends(require_json)])
def shred(request: Request, who: CallerDep, patient_id: PatientId, body: ReasonIn) -> ErasureOut:
    """Erase one patient (admin, with a reason): the rows destroyed and the signed erasure receipt."""
    state = server(request)
    authorize(request, who, "shred", patient_id)
    receipt = state.call(state.mem.shred, who.principal, patient_id, body.reason)
    return ErasureOut(count=receipt.records, receipt=ReceiptBody.model_validate(receipt.to_dict()))


@router.post("/audit/verify-erasure", response_model=VerifyOut, dependencies=[Depends(require_json)])
def verify_erasure(request: Request, who: CallerDep, body: ReceiptBody) -> VerifyOut:
    """Verify the audit chain and an erasure receipt against it (auditor or admin); writes nothing."""
    state = server(request)
    receipt = ErasureReceipt.from_dict(body.model_dump())
    return VerifyOut.model_validate(state.call(state.mem.verify_audit, who.principal, receipt=receipt))


@router.get("/audit/verify", response_model=VerifyOut)
def verify_audit(request: Request, who: CallerDep, full: Annotated[bool, Query()] = True) -> VerifyOut:
    """Verify the hash chain and the signed checkpoints (auditor or admin); writes nothing."""
    state = server(request)
    return VerifyOut.model_validate(state.call(state.mem.verify_audit, who.principal, full=full))


@router.post("/audit/checkpoint", response_model=CheckpointOut)
def checkpoint(request: Request, who: CallerDep) -> CheckpointOut:
    """Sign the current head of the audit chain (auditor, admin or system)."""
    state = server(request)
    size, head = state.call(state.mem.checkpoint, who.principal)
    return CheckpointOut(size=size, head=head)


@router.get(
    "/audit/fhir",
    response_class=Response,
    responses={200: {"content": {FHIR_NDJSON: {"schema": {"type": "string"}}}, "description": "NDJSON"}},
)
def export_fhir(request: Request, who: CallerDep) -> Response:
    """Every audit event as a FHIR R5 AuditEvent, one JSON object a line (auditor or admin)."""
    state = server(request)
    with tempfile.TemporaryDirectory(prefix="msm-mem-fhir-") as tmp:
        out = Path(tmp) / "audit.ndjson"
        count = state.call(state.mem.export_fhir, who.principal, out)
        body = out.read_bytes()
    return Response(body, media_type=FHIR_NDJSON, headers={"X-Resource-Count": str(count)})


@router.post("/maintain", response_model=MaintenanceOut)
def maintain(request: Request, who: CallerDep) -> MaintenanceOut:
    """Expire STM, consolidate aged STM, decay LTM, checkpoint the audit chain (system)."""
    state = server(request)
    return MaintenanceOut.model_validate(state.call(state.mem.maintain, who.principal))

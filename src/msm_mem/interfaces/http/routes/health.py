"""Liveness, readiness and the caller's own identity."""

from __future__ import annotations

from fastapi import APIRouter, Request

from ..models import StatusOut, WhoAmIOut
from ..state import CallerDep, server
from . import PROBLEM_RESPONSES

__all__ = ["router"]

router = APIRouter(tags=["health"], responses=PROBLEM_RESPONSES)

#: what the schema says of an operation that takes no credential (it overrides the global bearer)
NO_CREDENTIAL: dict[str, object] = {"security": []}


@router.get("/health", response_model=StatusOut, openapi_extra=NO_CREDENTIAL)
def health() -> StatusOut:
    """Liveness: the process answers (no credential needed, nothing read)."""
    return StatusOut(status="ok")


@router.get("/ready", response_model=StatusOut, openapi_extra=NO_CREDENTIAL)
def ready(request: Request) -> StatusOut:
    """Readiness: the store is open and its directory is there (no credential, no patient data)."""
    state = server(request)
    if not state.mem.exists(state.mem.directory):
        from ..problems import HttpProblem

        raise HttpProblem("internal-error", "the store directory is gone")
    return StatusOut(status="ready")


@router.get("/v1/whoami", response_model=WhoAmIOut)
def whoami(who: CallerDep) -> WhoAmIOut:
    """The principal (id, role, purpose) and the patient scope of the caller's credential."""
    p = who.principal
    return WhoAmIOut(
        id=p.id, role=p.role.value, purpose=p.purpose.value, patients=list(who.patients), credential=who.credential
    )

"""Reads of one patient's memory, one page at a time (paged in the read, so its audit event
names the page's records only): semantic state and its history, episodes, visual records,
claims and a claim's history, short-term items."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Query, Request

from .... import RecordPage, StmState
from ...._limits import ID_SCHEMA_PATTERN
from ...auth.credentials import Caller
from ..models import ClaimOut, EpisodeOut, Page, SemanticOut, StmItemOut, VisualOut
from ..state import CallerDep, Paging, authorize, paging, server
from . import PROBLEM_RESPONSES, PatientId

__all__ = ["router"]

router = APIRouter(prefix="/v1/patients/{patient_id}", tags=["reads"], responses=PROBLEM_RESPONSES)

PagingDep = Annotated[Paging, Depends(paging)]
#: a claim key: ``study:<study id>|q:<question key>`` (a study id of up to 256 characters)
Key = Annotated[str, Query(min_length=1, max_length=400, json_schema_extra={"pattern": ID_SCHEMA_PATTERN})]
Category = Annotated[str, Query(min_length=1, max_length=100, json_schema_extra={"pattern": ID_SCHEMA_PATTERN})]
R = TypeVar("R")
Out = TypeVar("Out")


def _read(
    request: Request,
    who: Caller,
    patient_id: str,
    pg: Paging,
    fn: Callable[..., RecordPage[R]],
    out: Callable[[R], Out],
    *args: Any,
) -> Page[Out]:
    state = server(request)
    authorize(request, who, "read", patient_id)
    records = state.read(fn, who.principal, patient_id, *args, offset=pg.offset, limit=pg.limit)
    items = [out(r) for r in records]
    return Page[Out](
        items=items, total=records.total, offset=records.offset, limit=pg.limit, next_offset=records.next_offset
    )


@router.get("/semantic", response_model=Page[SemanticOut])
def semantic_state(
    request: Request, who: CallerDep, patient_id: PatientId, pg: PagingDep, category: Category | None = None
) -> Page[SemanticOut]:
    """The patient's active semantic state (one version per category, or just ``category``)."""
    mem = server(request).mem
    return _read(request, who, patient_id, pg, mem.semantic_state, SemanticOut.model_validate, category)


@router.get("/semantic/history", response_model=Page[SemanticOut])
def semantic_history(
    request: Request, who: CallerDep, patient_id: PatientId, pg: PagingDep, category: Category = "impression"
) -> Page[SemanticOut]:
    """Every version of the patient's semantic state in ``category``, oldest first."""
    mem = server(request).mem
    return _read(request, who, patient_id, pg, mem.semantic_history, SemanticOut.model_validate, category)


@router.get("/episodes", response_model=Page[EpisodeOut])
def episodes(request: Request, who: CallerDep, patient_id: PatientId, pg: PagingDep) -> Page[EpisodeOut]:
    """The patient's episodic records (every state)."""
    return _read(request, who, patient_id, pg, server(request).mem.episodes, EpisodeOut.model_validate)


@router.get("/visuals", response_model=Page[VisualOut])
def visuals(request: Request, who: CallerDep, patient_id: PatientId, pg: PagingDep) -> Page[VisualOut]:
    """The patient's visual records."""
    return _read(request, who, patient_id, pg, server(request).mem.visuals, VisualOut.model_validate)


@router.get("/claims", response_model=Page[ClaimOut])
def claims(
    request: Request, who: CallerDep, patient_id: PatientId, pg: PagingDep, key: Key | None = None
) -> Page[ClaimOut]:
    """The patient's active claims (or those under ``key``, e.g. ``study:S1|q:any-effusion``)."""
    return _read(request, who, patient_id, pg, server(request).mem.claims, ClaimOut.model_validate, key)


@router.get("/claims/history", response_model=Page[ClaimOut])
def claim_history(request: Request, who: CallerDep, patient_id: PatientId, pg: PagingDep, key: Key) -> Page[ClaimOut]:
    """The supersession chain of one claim key, oldest first."""
    return _read(request, who, patient_id, pg, server(request).mem.claim_history, ClaimOut.model_validate, key)


@router.get("/stm", response_model=Page[StmItemOut])
def stm_items(
    request: Request, who: CallerDep, patient_id: PatientId, pg: PagingDep, state: StmState | None = None
) -> Page[StmItemOut]:
    """The patient's short-term items (every state, or just ``state``)."""
    return _read(request, who, patient_id, pg, server(request).mem.stm_items, StmItemOut.model_validate, state)

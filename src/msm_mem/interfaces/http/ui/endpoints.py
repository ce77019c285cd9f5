"""The JSON and image endpoints the memory explorer needs beyond the service's own: the audit
events, study thumbnails, and the two tier walkthroughs (frames and animated GIF). Each checks
the credential's patient scope and calls one MsmMem operation as the caller's principal."""

from __future__ import annotations

import base64
import io
from typing import Annotated, Literal

import numpy as np
from fastapi import APIRouter, Query, Request, Response
from PIL import Image
from pydantic import BaseModel

from .... import AuditTrail, ImageError, InvalidInput
from ...._limits import PATIENT_PATH_PATTERN
from ...._media import resolve_media
from ....plugins.images import load_image
from ...auth.credentials import Caller
from ..answers import FromRecord
from ..routes import PROBLEM_RESPONSES, PatientId
from ..state import CallerDep, authorize, server
from .gif import SPEEDS, render_gif
from .walkthrough import NAMES, EventOut, WalkthroughOut, build

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["explorer"], responses=PROBLEM_RESPONSES)

_AUDIT_ROLES = ("auditor", "admin")
#: events a walkthrough is built from (the latest ones)
_WINDOW = 5000
#: most studies one thumbnails call draws
_MAX_THUMBNAILS = 100

PatientQuery = Annotated[
    str | None,
    Query(min_length=1, max_length=128, pattern=r"^[^\s,*]+$", json_schema_extra={"pattern": PATIENT_PATH_PATTERN}),
]
Name = Literal["question", "movement"]


class CheckpointItemOut(FromRecord):
    """A signed checkpoint: ``size`` events with last hash ``head_hash``, signed at ``time``."""

    origin: str
    size: int
    head_hash: str
    time: float
    signature: str


class AuditTrailOut(FromRecord):
    """A page of audit events (ids and pseudonyms only), the chain's head seq, the first event
    that could not be read (None when all could) and the latest signed checkpoints."""

    events: list[EventOut]
    head_seq: int
    next_after: int | None
    unreadable_seq: int | None
    checkpoints: list[CheckpointItemOut]


class ThumbnailOut(BaseModel):
    """A study's image, shrunk to a PNG (base64) at most ``size`` pixels a side."""

    study_id: str
    episode_id: str
    timestamp: float
    png_base64: str | None
    problem: str = ""


class ThumbnailsOut(BaseModel):
    patient_id: str
    items: list[ThumbnailOut]


def _trail(request: Request, who: Caller, patient_id: str | None, **kwargs: object) -> AuditTrail:
    """The audit trail as ``who``: the whole chain for the audit roles, else the events of
    ``patient_id`` (inside the credential's scope)."""
    state = server(request)
    if who.principal.role.value in _AUDIT_ROLES:
        patient_id = None
    elif patient_id is not None:
        authorize(request, who, "audit_read", patient_id)
    return state.call(state.mem.audit_trail, who.principal, patient_id, **kwargs)


@router.get("/audit/events", response_model=AuditTrailOut)
def audit_events(
    request: Request,
    who: CallerDep,
    patient_id: PatientQuery = None,
    after_seq: Annotated[int, Query(ge=0, le=9_007_199_254_740_991)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
    tail: bool = False,
) -> AuditTrailOut:
    """Audit events after ``after_seq`` (or the last ``limit`` with ``tail``) and the latest
    checkpoints. Auditor or admin: the whole chain (``patient_id`` is ignored). Agent,
    clinician or critic: the events of ``patient_id`` only. Audited."""
    return AuditTrailOut.model_validate(_trail(request, who, patient_id, after_seq=after_seq, limit=limit, tail=tail))


def _thumbnail(path: str, size: int) -> str:
    img = load_image(path)
    pil = Image.fromarray(np.clip(img * 255.0, 0, 255).astype(np.uint8), mode="L")
    pil.thumbnail((size, size))
    out = io.BytesIO()
    pil.save(out, "PNG", optimize=True)
    return base64.b64encode(out.getvalue()).decode("ascii")


@router.get("/patients/{patient_id}/thumbnails", response_model=ThumbnailsOut)
def thumbnails(
    request: Request, who: CallerDep, patient_id: PatientId, size: Annotated[int, Query(ge=32, le=256)] = 128
) -> ThumbnailsOut:
    """Each study's stored image as a small PNG (the newest episode of a study with an image
    file). A governed read: the patient's episodes are read through the audited API, then each
    image file they name is read (bounded, regular files only) and shrunk in memory; nothing
    is stored. A study whose image cannot be read says so without its path."""
    state = server(request)
    authorize(request, who, "read", patient_id)
    episodes = state.call(state.mem.episodes, who.principal, patient_id)
    newest: dict[str, tuple[float, str, str]] = {}
    for e in episodes:
        if e.study_id and e.media_path and (e.study_id not in newest or e.created_at >= newest[e.study_id][0]):
            newest[e.study_id] = (e.created_at, e.episode_id, e.media_path)
    by_time = {e.episode_id: e.timestamp for e in episodes}
    items = []
    for study, (_, episode_id, path) in sorted(newest.items(), key=lambda kv: by_time[kv[1][1]])[:_MAX_THUMBNAILS]:
        try:
            data, problem = _thumbnail(str(resolve_media(path, state.mem.directory).path), size), ""
        except ImageError:
            data, problem = None, "the stored image cannot be read"
        items.append(
            ThumbnailOut(
                study_id=study, episode_id=episode_id, timestamp=by_time[episode_id], png_base64=data, problem=problem
            )
        )
    return ThumbnailsOut(patient_id=patient_id, items=items)


def _walkthrough(request: Request, who: Caller, name: str, patient_id: str | None) -> WalkthroughOut:
    audit_role = who.principal.role.value in _AUDIT_ROLES
    if not audit_role and patient_id is None:
        raise InvalidInput(f"role {who.principal.role.value!r} replays the events of one patient: give patient_id")
    trail = _trail(request, who, patient_id, limit=_WINDOW, tail=True)
    ttl = server(request).mem.settings.stm_ttl_s
    return build(name, trail.events, ttl, decay_visible=audit_role)


@router.get("/walkthroughs/{name}", response_model=WalkthroughOut)
def walkthrough(request: Request, who: CallerDep, name: Name, patient_id: PatientQuery = None) -> WalkthroughOut:
    """A tier walkthrough (``question``: one question touching STM, LTM and the audit tier;
    ``movement``: write, consolidate, supersede, decay), five frames built from the latest
    matching audit events of this store (of ``patient_id`` for a care role). Audited."""
    assert name in NAMES
    return _walkthrough(request, who, name, patient_id)


@router.get(
    "/walkthroughs/{name}/gif",
    response_class=Response,
    responses={200: {"content": {"image/gif": {"schema": {"type": "string", "format": "binary"}}}}},
)
def walkthrough_gif(
    request: Request,
    who: CallerDep,
    name: Name,
    patient_id: PatientQuery = None,
    seconds: Annotated[float, Query(ge=SPEEDS[0], le=SPEEDS[-1])] = SPEEDS[0],
) -> Response:
    """The walkthrough as a looping animated GIF, each frame shown ``seconds`` (3.5 to 6)."""
    data = render_gif(_walkthrough(request, who, name, patient_id), seconds)
    headers = {
        "Content-Disposition": f'attachment; filename="msm-mem-walkthrough-{name}.gif"',
        "Cache-Control": "no-store",
    }
    return Response(data, media_type="image/gif", headers=headers)

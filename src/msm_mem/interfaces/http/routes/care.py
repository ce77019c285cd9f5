"""The clinical operations: ask, retrieve and observe (an image upload, or a stored study of the
patient, with the question), consolidate and feedback."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Literal, TypeVar

from fastapi import APIRouter, Depends, File, Form, Request, UploadFile
from fastapi import Path as PathParam

from .... import ImageError, InvalidInput, NotFound
from ..auth import Caller
from ..models import AnswerOut, ClaimOut, ConsolidateIn, FeedbackIn, RetrievedOut, StmItemOut, WriteResultOut
from ..problems import HttpProblem
from ..state import CallerDep, authorize, check_text, decode_upload, require_form, require_json, server
from . import PROBLEM_RESPONSES, PatientId

__all__ = ["router"]

R = TypeVar("R")

router = APIRouter(prefix="/v1/patients/{patient_id}", tags=["care"], responses=PROBLEM_RESPONSES)

Upload = Annotated[UploadFile | None, File(description="PNG, JPEG or DICOM; or give image_study instead")]
StudyRef = Annotated[
    str | None,
    Form(min_length=1, max_length=200, description="a stored study of the patient with an image file (ingested)"),
]
Question = Annotated[str, Form(min_length=1, max_length=20_000)]
Short = Annotated[str, Form(max_length=200)]
Time = Annotated[float | None, Form(allow_inf_nan=False, ge=-62_135_596_800.0, le=253_402_300_799.0)]
Flag = Annotated[bool, Form()]
ItemId = Annotated[str, PathParam(min_length=1, max_length=200)]


def _image(request: Request, who: Caller, patient_id: str, image: UploadFile | None, study: str | None) -> object:
    """The image of a request: the decoded upload, or the stored image of one of the
    patient's studies (found by an audited read of the patient's episodes)."""
    state = server(request)
    if (image is None) == (study is None):
        raise InvalidInput("send exactly one of image (a file) and image_study (a stored study id)")
    if image is not None:
        data = image.file.read(state.config.max_upload_bytes + 1)
        if len(data) > state.config.max_upload_bytes:
            raise HttpProblem("payload-too-large", f"the image is over {state.config.max_upload_bytes} bytes")
        return decode_upload(data, state.config)
    episodes = state.read(state.mem.episodes, who.principal, patient_id)
    found = sorted((e for e in episodes if e.study_id == study and e.media_path), key=lambda e: e.state != "active")
    if not found:
        raise NotFound("no stored image for that study of this patient")
    return found[0].media_path


def _stored(image: object, fn: Callable[[], R]) -> R:
    """Run ``fn``; an unreadable stored image is reported without its path."""
    try:
        return fn()
    except ImageError:
        if isinstance(image, str):
            raise ImageError("the stored study's image cannot be read") from None
        raise


@router.post("/ask", response_model=AnswerOut, dependencies=[Depends(require_form)])
def ask(
    request: Request,
    who: CallerDep,
    patient_id: PatientId,
    question: Question,
    image: Upload = None,
    image_study: StudyRef = None,
    study_id: Short = "",
    timestamp: Time = None,
    visual_tag: Short = "",
    write_back: Flag = True,
    use_sem: Flag = True,
    use_epi: Flag = True,
    use_vis: Flag = True,
) -> AnswerOut:
    """Answer a question about an image with the patient's memory (the governed online loop)."""
    state = server(request)
    authorize(request, who, "ask", patient_id)
    check_text("question", question, state.config.max_question_chars)
    img = _image(request, who, patient_id, image, image_study)
    answer = _stored(
        img,
        lambda: state.call(
            state.mem.ask,
            who.principal,
            patient_id,
            img,
            question,
            timestamp=timestamp,
            study_id=study_id,
            visual_tag=visual_tag,
            write_back=write_back,
            use_sem=use_sem,
            use_epi=use_epi,
            use_vis=use_vis,
        ),
    )
    return AnswerOut.of(answer)


@router.post("/retrieve", response_model=RetrievedOut, dependencies=[Depends(require_form)])
def retrieve(
    request: Request,
    who: CallerDep,
    patient_id: PatientId,
    image: Upload = None,
    image_study: StudyRef = None,
    scope: Annotated[Literal["patient", "population"], Form()] = "patient",
    at: Time = None,
    k: Annotated[int, Form(ge=1, le=100)] = 10,
    use_sem: Flag = True,
    use_epi: Flag = True,
    use_vis: Flag = True,
) -> RetrievedOut:
    """The ranked evidence for an image, without an answer: the first ``k`` items."""
    state = server(request)
    authorize(request, who, "retrieve", patient_id)
    img = _image(request, who, patient_id, image, image_study)
    found = _stored(
        img,
        lambda: state.read(
            state.mem.retrieve,
            who.principal,
            patient_id,
            img,
            scope=scope,
            at=at,
            use_sem=use_sem,
            use_epi=use_epi,
            use_vis=use_vis,
        ),
    )
    return RetrievedOut.of(found, min(k, state.config.max_k))


@router.post("/observe", response_model=StmItemOut, status_code=201, dependencies=[Depends(require_form)])
def observe(
    request: Request,
    who: CallerDep,
    patient_id: PatientId,
    question: Question,
    image: Upload = None,
    image_study: StudyRef = None,
    study_id: Short = "",
    timestamp: Time = None,
    visual_tag: Short = "",
) -> StmItemOut:
    """Write a working observation (image and question) into the patient's short-term memory."""
    state = server(request)
    authorize(request, who, "observe", patient_id)
    check_text("question", question, state.config.max_question_chars)
    img = _image(request, who, patient_id, image, image_study)
    item = _stored(
        img,
        lambda: state.call(
            state.mem.observe,
            who.principal,
            patient_id,
            img,
            question,
            timestamp=timestamp,
            study_id=study_id,
            visual_tag=visual_tag,
        ),
    )
    return StmItemOut.of(item)


@router.post(
    "/stm/{item_id}/consolidate",
    response_model=WriteResultOut,
    dependencies=[Depends(require_json)],
)
def consolidate(
    request: Request, who: CallerDep, patient_id: PatientId, item_id: ItemId, body: ConsolidateIn
) -> WriteResultOut:
    """Move an active short-term item into long-term memory with its answer, through the gate."""
    state = server(request)
    authorize(request, who, "consolidate", patient_id)
    result = state.call(state.mem.consolidate, who.principal, patient_id, item_id, body.answer, decision=body.decision)
    return WriteResultOut.of(result)


@router.post(
    "/studies/{study_id}/feedback",
    response_model=ClaimOut,
    dependencies=[Depends(require_json)],
)
def feedback(request: Request, who: CallerDep, patient_id: PatientId, study_id: ItemId, body: FeedbackIn) -> ClaimOut:
    """A critic's verdict on the agent's impression of one study: accept, or correct."""
    state = server(request)
    authorize(request, who, "feedback", patient_id)
    claim = state.call(
        state.mem.feedback,
        who.principal,
        patient_id,
        study_id,
        accept=body.accept,
        correction=body.correction,
        decision=body.decision,
    )
    return ClaimOut.of(claim)

"""The clinical operations: ask, retrieve and observe (an image upload, or a stored study of the
patient, with the question), consolidate and feedback.

Ask, retrieve and observe share their image and observation fields (one dependency each) and
run their blocking part (decode, store) in one worker thread, answering pre-serialised JSON:
a request crosses to a thread once."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Literal, TypeVar

from fastapi import APIRouter, Depends, File, Form, Request, Response, UploadFile
from fastapi import Path as PathParam
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

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


# the form fields ask, retrieve and observe share (async: parsed on the event loop) --------------


@dataclass(frozen=True, slots=True)
class ImageIn:
    """The image of a request: an upload, or a stored study of the patient (exactly one)."""

    upload: UploadFile | None
    study: str | None


async def image_in(image: Upload = None, image_study: StudyRef = None) -> ImageIn:
    return ImageIn(image, image_study)


@dataclass(frozen=True, slots=True)
class ObservationIn:
    """What a new observation records beside its image: study id, time (UTC seconds), tag."""

    study_id: str
    timestamp: float | None
    visual_tag: str


async def observation_in(study_id: Short = "", timestamp: Time = None, visual_tag: Short = "") -> ObservationIn:
    return ObservationIn(study_id, timestamp, visual_tag)


async def memories_in(use_sem: Flag = True, use_epi: Flag = True, use_vis: Flag = True) -> dict[str, bool]:
    """Which memories a read uses (semantic, episodic, visual)."""
    return {"use_sem": use_sem, "use_epi": use_epi, "use_vis": use_vis}


ImageDep = Annotated[ImageIn, Depends(image_in)]
ObservationDep = Annotated[ObservationIn, Depends(observation_in)]
MemoriesDep = Annotated[dict[str, bool], Depends(memories_in)]


_ONE_IMAGE = "send exactly one of image (a file) and image_study (a stored study id)"


def _image(request: Request, who: Caller, patient_id: str, given: ImageIn) -> object:
    """The image of a request: the decoded upload, or the stored image of one of the
    patient's studies (found by an audited read of the patient's episodes)."""
    state = server(request)
    image, study = given.upload, given.study
    if (image is None) == (study is None):
        raise InvalidInput(_ONE_IMAGE)
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


async def _off_loop(fn: Callable[[], BaseModel], status_code: int = 200) -> Response:
    """Run a request's blocking part (image decode, the store) in one worker thread and answer
    its model as JSON (the model validated its fields when it was built)."""
    out = await run_in_threadpool(fn)
    return Response(out.model_dump_json(), status_code=status_code, media_type="application/json")


@router.post("/ask", response_model=AnswerOut, dependencies=[Depends(require_form)])
async def ask(
    request: Request,
    who: CallerDep,
    patient_id: PatientId,
    question: Question,
    given: ImageDep,
    seen: ObservationDep,
    memories: MemoriesDep,
    write_back: Flag = True,
) -> Response:
    """Answer a question about an image with the patient's memory (the governed online loop)."""
    state = server(request)

    def work() -> AnswerOut:
        authorize(request, who, "ask", patient_id)
        check_text("question", question, state.config.max_question_chars)
        img = _image(request, who, patient_id, given)
        answer = _stored(
            img,
            lambda: state.call(
                state.mem.ask,
                who.principal,
                patient_id,
                img,
                question,
                timestamp=seen.timestamp,
                study_id=seen.study_id,
                visual_tag=seen.visual_tag,
                write_back=write_back,
                **memories,
            ),
        )
        return AnswerOut.of(answer)

    return await _off_loop(work)


@router.post("/retrieve", response_model=RetrievedOut, dependencies=[Depends(require_form)])
async def retrieve(
    request: Request,
    who: CallerDep,
    patient_id: PatientId,
    given: ImageDep,
    memories: MemoriesDep,
    scope: Annotated[Literal["patient", "population"], Form()] = "patient",
    at: Time = None,
    k: Annotated[int, Form(ge=1, le=100)] = 10,
) -> Response:
    """The ranked evidence for an image, without an answer: the first ``k`` items. A stored
    study (``image_study``) is queried by the embedding stored with it."""
    state = server(request)

    def work() -> RetrievedOut:
        authorize(request, who, "retrieve", patient_id)
        if given.study is None:
            img = _image(request, who, patient_id, given)
            found = state.read(state.mem.retrieve, who.principal, patient_id, img, scope=scope, at=at, **memories)
        else:  # a stored study: its stored embedding, read in the same governed call (one audit event)
            if given.upload is not None:
                raise InvalidInput(_ONE_IMAGE)
            found = state.read(
                state.mem.retrieve, who.principal, patient_id, study=given.study, scope=scope, at=at, **memories
            )
        return RetrievedOut.of(found, min(k, state.config.max_k))

    return await _off_loop(work)


@router.post("/observe", response_model=StmItemOut, status_code=201, dependencies=[Depends(require_form)])
async def observe(
    request: Request, who: CallerDep, patient_id: PatientId, question: Question, given: ImageDep, seen: ObservationDep
) -> Response:
    """Write a working observation (image and question) into the patient's short-term memory."""
    state = server(request)

    def work() -> StmItemOut:
        authorize(request, who, "observe", patient_id)
        check_text("question", question, state.config.max_question_chars)
        img = _image(request, who, patient_id, given)
        item = _stored(
            img,
            lambda: state.call(
                state.mem.observe,
                who.principal,
                patient_id,
                img,
                question,
                timestamp=seen.timestamp,
                study_id=seen.study_id,
                visual_tag=seen.visual_tag,
            ),
        )
        return StmItemOut.of(item)

    return await _off_loop(work, 201)


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

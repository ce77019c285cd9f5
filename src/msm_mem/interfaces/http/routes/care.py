"""The clinical operations: ask, retrieve and observe (an image upload, or a stored study of the
patient, with the question), consolidate and feedback.

Ask, retrieve and observe read their form once (:mod:`..forms`: one model per body) and run
their blocking part (decode, store) in one worker thread, answering pre-serialised JSON: a
request crosses to a thread once."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Annotated, TypeVar

from fastapi import APIRouter, Depends, Request, Response
from fastapi import Path as PathParam
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from .... import InvalidInput
from ...._limits import ID_SCHEMA_PATTERN
from ..forms import AskForm, ObserveForm, RetrieveForm, form_body, read_form
from ..models import AnswerOut, ClaimOut, ConsolidateIn, FeedbackIn, RetrievedOut, StmItemOut, WriteResultOut
from ..problems import HttpProblem
from ..state import CallerDep, authorize, check_text, decode_upload, require_json, server
from . import PROBLEM_RESPONSES, PatientId

__all__ = ["router"]

R = TypeVar("R")

router = APIRouter(prefix="/v1/patients/{patient_id}", tags=["care"], responses=PROBLEM_RESPONSES)

ItemId = Annotated[str, PathParam(min_length=1, max_length=200, json_schema_extra={"pattern": ID_SCHEMA_PATTERN})]


def _image(request: Request, upload: UploadFile | None, study: str | None) -> object:
    """The decoded upload, or None for a stored study (the operation reads it itself);
    InvalidInput unless exactly one is given."""
    if (upload is None) == (study is None):
        raise InvalidInput("send exactly one of image (a file) and image_study (a stored study id)")
    if upload is None:
        return None
    state = server(request)
    config = state.config
    try:
        data = upload.file.read(config.max_upload_bytes + 1)
    finally:
        upload.file.close()  # read once; closed here whatever this request's answer turns out to be
    if len(data) > config.max_upload_bytes:
        raise HttpProblem("payload-too-large", f"the image is over {config.max_upload_bytes} bytes")
    # at most max_decodes decodes at once in this process: their memory is bounded together
    if not state.throttle.decodes.acquire(timeout=state.throttle.decode_wait_s):
        raise HttpProblem(
            "server-busy", f"every image decoder of this process is busy ({config.max_decodes} at once)", retry_after=1
        )
    try:
        return decode_upload(data, config)
    finally:
        state.throttle.decodes.release()


async def _off_loop(fn: Callable[[], BaseModel], status_code: int = 200) -> Response:
    """Run a request's blocking part (image decode, the store) in one worker thread and answer
    its model as JSON (the model validated its fields when it was built)."""
    out = await run_in_threadpool(fn)
    return Response(out.model_dump_json(), status_code=status_code, media_type="application/json")


@router.post("/ask", response_model=AnswerOut, openapi_extra=form_body(AskForm))
async def ask(request: Request, who: CallerDep, patient_id: PatientId) -> Response:
    """Answer a question about an image with the patient's memory (the governed online loop)."""
    state = server(request)
    form, upload = await read_form(request, AskForm)

    def work() -> AnswerOut:
        authorize(request, who, "ask", patient_id)
        check_text("question", form.question, state.config.max_question_chars)
        answer = state.call(
            state.mem.ask,
            who.principal,
            patient_id,
            _image(request, upload, form.image_study),
            form.question,
            write_back=form.write_back,
            **form.observation(),
            **form.memories(),
        )
        return AnswerOut.model_validate(answer)

    return await _off_loop(work)


@router.post("/retrieve", response_model=RetrievedOut, openapi_extra=form_body(RetrieveForm))
async def retrieve(request: Request, who: CallerDep, patient_id: PatientId) -> Response:
    """The ranked evidence for an image, without an answer: the first ``k`` items. A stored
    study (``image_study``) is queried by the embedding stored with it."""
    state = server(request)
    form, upload = await read_form(request, RetrieveForm)
    flags = {"scope": form.scope, "at": form.at, **form.memories()}

    def work() -> RetrievedOut:
        authorize(request, who, "retrieve", patient_id)
        img = _image(request, upload, form.image_study)
        # a stored study: its stored embedding, read in the same governed call (one audit event)
        found = state.read(state.mem.retrieve, who.principal, patient_id, img, image_study=form.image_study, **flags)
        return RetrievedOut.model_validate(replace(found, items=found.items[: min(form.k, state.config.max_k)]))

    return await _off_loop(work)


@router.post("/observe", response_model=StmItemOut, status_code=201, openapi_extra=form_body(ObserveForm))
async def observe(request: Request, who: CallerDep, patient_id: PatientId) -> Response:
    """Write a working observation (image and question) into the patient's short-term memory."""
    state = server(request)
    form, upload = await read_form(request, ObserveForm)

    def work() -> StmItemOut:
        authorize(request, who, "observe", patient_id)
        check_text("question", form.question, state.config.max_question_chars)
        item = state.call(
            state.mem.observe,
            who.principal,
            patient_id,
            _image(request, upload, form.image_study),
            form.question,
            **form.observation(),
        )
        return StmItemOut.model_validate(item)

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
    return WriteResultOut.model_validate(result)


@router.post(
    "/studies/{study_id}/feedback",
    response_model=ClaimOut,
    dependencies=[Depends(require_json)],
)
def feedback(request: Request, who: CallerDep, patient_id: PatientId, study_id: ItemId, body: FeedbackIn) -> ClaimOut:
    """A critic's verdict on the agent's answer to one question about one study: accept, or
    correct. Name the question when the study holds answers to several (else 422)."""
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
        question=body.question,
    )
    return ClaimOut.model_validate(claim)

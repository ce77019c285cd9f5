"""The memory for a caller's own model: the fused context of a question (an image upload, or a
stored study of the patient), and the write-back of the answer that model gave."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response

from ....plugins.backbones.openai_http import image_data_url
from ..forms import ContextForm, form_body, read_form
from ..models import ContextOut, EvidenceOut, RecordAnswerIn, RecordedAnswerOut
from ..state import CallerDep, authorize, check_text, require_json, server
from . import PROBLEM_RESPONSES, PatientId
from .care import ItemId, _image, _off_loop

__all__ = ["router"]

router = APIRouter(prefix="/v1/patients/{patient_id}", tags=["care"], responses=PROBLEM_RESPONSES)


@router.post("/context", response_model=ContextOut, status_code=201, openapi_extra=form_body(ContextForm))
async def context(request: Request, who: CallerDep, patient_id: PatientId) -> Response:
    """The fused context of a question about an image for the caller's own model: ``ask`` up to
    the model (consent, a short-term item, the audited reads, the fused prompt). Answer it with
    ``POST .../context/{context_id}/answer``; ``include_image`` adds the image as a PNG data URL."""
    state = server(request)
    form, upload = await read_form(request, ContextForm)

    def work() -> ContextOut:
        authorize(request, who, "context", patient_id)
        check_text("question", form.question, state.config.max_question_chars)
        found = state.call(
            state.mem.context,
            who.principal,
            patient_id,
            _image(request, upload, form.image_study),
            form.question,
            **form.observation(),
            **form.memories(),
        )
        image = image_data_url(found.image) if form.include_image and found.image is not None else None
        evidence = [EvidenceOut.model_validate(e) for e in found.evidence]
        return ContextOut.model_validate({**found.to_json(), "evidence": evidence, "image": image})

    return await _off_loop(work, 201)


@router.post(
    "/context/{context_id}/answer",
    response_model=RecordedAnswerOut,
    dependencies=[Depends(require_json)],
)
def record_answer(
    request: Request, who: CallerDep, patient_id: PatientId, context_id: ItemId, body: RecordAnswerIn
) -> RecordedAnswerOut:
    """Write back the answer the caller's own model gave to a context: through the write-back
    gate, superseding the semantic state and the question's claim as ``ask`` does; one audit
    event names the model and the evidence used."""
    state = server(request)
    authorize(request, who, "record_answer", patient_id)
    result = state.call(
        state.mem.record_answer,
        who.principal,
        patient_id,
        context_id,
        body.answer,
        model=body.model.model_dump(),
        evidence=body.evidence,
        outcome=body.outcome,
    )
    return RecordedAnswerOut.model_validate(result)

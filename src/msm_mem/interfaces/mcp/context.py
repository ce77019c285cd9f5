"""The tools for an agent that calls its own model: ``context`` (the fused prompt and the image,
ready to put into the model's conversation) and ``record_answer`` (the model's answer written
back through the write-back gate)."""

from __future__ import annotations

import json
from typing import Annotated

from mcp.server.mcpserver import MCPServer
from mcp_types import CallToolResult, ImageContent, TextContent, ToolAnnotations
from pydantic import BaseModel, Field

from ...plugins.backbones.openai_http import image_data_url
from ..auth.credentials import Caller
from ..http.models import ContextOut, EvidenceOut, RecordedAnswerOut
from ..http.uploads import check_text
from .images import image_of
from .state import McpState
from .tools import ImageB64, ImagePath, PatientId, StudyRef

__all__ = ["register", "rendered"]

_PNG_PREFIX = "data:image/png;base64,"
_WRITES = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False)

Question = Annotated[str, Field(min_length=1, max_length=20_000, description="the clinical question")]
Short = Annotated[str, Field(max_length=200)]
Time = Annotated[
    float | None,
    Field(allow_inf_nan=False, ge=-62_135_596_800.0, le=253_402_300_799.0, description="UTC seconds (default now)"),
]
Flag = Annotated[bool, Field(description="ablation switch: use this memory")]
Id = Annotated[str, Field(min_length=1, max_length=200)]
ModelPart = Annotated[str, Field(max_length=128, pattern=r"^([A-Za-z0-9][A-Za-z0-9._:+/-]*)?$")]


def rendered(model: BaseModel) -> CallToolResult:
    """A context as a model's conversation takes it: the prompt, then a line naming the
    context id and the evidence ids, as text; the image as an image content; the rest (without
    the image) as structured content."""
    assert isinstance(model, ContextOut)
    doc = model.model_dump(mode="json", exclude={"image"})
    ids = ", ".join(model.included) or "none"
    text = f"{model.prompt}\n\n(context_id {model.context_id}; evidence ids in the prompt: {ids})"
    content: list[TextContent | ImageContent] = [TextContent(type="text", text=text)]
    if model.image and model.image.startswith(_PNG_PREFIX):
        content.append(ImageContent(type="image", data=model.image[len(_PNG_PREFIX) :], mime_type="image/png"))
    content.append(TextContent(type="text", text=json.dumps(doc)))
    return CallToolResult(content=list(content), structured_content=doc)


def register(server: MCPServer[object], state: McpState) -> None:
    """Add the context and record_answer tools to ``server``."""

    @server.tool(annotations=_WRITES, structured_output=True)
    def context(
        patient_id: PatientId,
        question: Question,
        image_base64: ImageB64 = None,
        image_path: ImagePath = None,
        image_study: StudyRef = None,
        study_id: Short = "",
        timestamp: Time = None,
        visual_tag: Short = "",
        include_image: bool = True,
        use_sem: Flag = True,
        use_epi: Flag = True,
        use_vis: Flag = True,
    ) -> Annotated[CallToolResult, ContextOut]:
        """The patient's memory fused into a prompt for your own model, with the image.

        Give the image as exactly one of image_base64, image_path or image_study. The result's
        text is the structured prompt (patient history, study claims, similar prior encounters
        and images; each evidence line starts with its memory id in brackets, then the
        question): put it and the image into your model's conversation, then write the answer
        back with record_answer, naming context_id and the evidence ids the answer used.
        Consent-checked and audited; the query waits in short-term memory until expires_at."""

        def body(who: Caller) -> ContextOut:
            check_text("question", question, state.config.server.max_question_chars)
            found = state.call(
                state.mem.context,
                who.principal,
                patient_id,
                image_of(state, image_base64, image_path, image_study),
                question,
                image_study=image_study,
                timestamp=timestamp,
                study_id=study_id,
                visual_tag=visual_tag,
                use_sem=use_sem,
                use_epi=use_epi,
                use_vis=use_vis,
            )
            image = image_data_url(found.image) if include_image and found.image is not None else None
            evidence = [EvidenceOut.model_validate(e) for e in found.evidence]
            return ContextOut.model_validate({**found.to_json(), "evidence": evidence, "image": image})

        return state.tool("context", "context", patient_id, body, rendered)

    @server.tool(annotations=_WRITES, structured_output=True)
    def record_answer(
        patient_id: PatientId,
        context_id: Annotated[str, Field(min_length=1, max_length=200, description="the context answered")],
        answer: Annotated[str, Field(min_length=1, max_length=20_000, description="your model's answer")],
        backbone: Annotated[
            str,
            Field(min_length=1, max_length=128, description="what served your model, e.g. openai, vllm or ollama"),
        ],
        model: Annotated[ModelPart, Field(description="your model's id, e.g. llava-hf/llava-1.5-7b-hf")] = "",
        version: Annotated[ModelPart, Field(description="its version, where known")] = "",
        evidence: Annotated[list[Id], Field(max_length=256, description="the memory ids the answer used")] = [],  # noqa: B006 (a schema default, never mutated)
        outcome: Annotated[str, Field(max_length=20_000, description="the decision taken")] = "",
    ) -> Annotated[CallToolResult, RecordedAnswerOut]:
        """Write back the answer your own model gave to a context (from the context tool).

        The answer goes through the write-back gate into long-term memory (or stays held in
        short-term memory); the patient's semantic state and the question's claim are
        superseded, as for ask. The audit trail names your model (backbone, model, version)
        and the evidence ids the answer used."""

        def body(who: Caller) -> RecordedAnswerOut:
            ref = {"backbone": backbone, "model": model, "version": version}
            result = state.call(
                state.mem.record_answer,
                who.principal,
                patient_id,
                context_id,
                answer,
                model=ref,
                evidence=evidence,
                outcome=outcome,
            )
            return RecordedAnswerOut.model_validate(result)

        return state.tool("record_answer", "record_answer", patient_id, body)

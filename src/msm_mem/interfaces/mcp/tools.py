"""The care tools: ask with memory, retrieve, observe, consolidate and give feedback. Each is a
few lines: check its text, find its image, call one MsmMem operation as the caller's principal,
render the result with the HTTP service's model. What the arguments mean is in each docstring
(the tool's description an agent reads) and in the argument schema."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Literal

from mcp.server.mcpserver import MCPServer
from mcp_types import CallToolResult, ToolAnnotations
from pydantic import Field

from ..._limits import PATIENT_PATH_PATTERN
from ..auth.credentials import Caller
from ..http.models import AnswerOut, ClaimOut, RetrievedOut, StmItemOut, WriteResultOut
from ..http.uploads import check_text
from .images import image_of
from .state import McpState

__all__ = ["ImageB64", "ImagePath", "PatientId", "StudyRef", "register"]

PatientId = Annotated[
    str,
    Field(
        min_length=1,
        max_length=128,
        pattern=r"^[^\s,*]+$",
        json_schema_extra={"pattern": PATIENT_PATH_PATTERN},
        description="the patient (inside your patient scope)",
    ),
]
Question = Annotated[str, Field(min_length=1, max_length=20_000, description="the clinical question")]
Short = Annotated[str, Field(max_length=200)]
Time = Annotated[
    float | None,
    Field(allow_inf_nan=False, ge=-62_135_596_800.0, le=253_402_300_799.0, description="UTC seconds (default now)"),
]
ImageB64 = Annotated[
    str | None, Field(min_length=1, description="a PNG, JPEG or DICOM file, base64 (a data: URL prefix is allowed)")
]
ImagePath = Annotated[
    str | None,
    Field(min_length=1, max_length=4096, description="an image file inside the server's --image-root folders"),
]
StudyRef = Annotated[
    str | None, Field(min_length=1, max_length=200, description="a stored (ingested) study of the patient")
]
Flag = Annotated[bool, Field(description="ablation switch: use this memory")]
K = Annotated[int, Field(ge=1, le=100, description="how many ranked items to return")]

_WRITES = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False)
_READS = ToolAnnotations(read_only_hint=True, open_world_hint=False)


def register(server: MCPServer[object], state: McpState) -> None:
    """Add the care tools to ``server``."""

    def question_ok(question: str) -> None:
        check_text("question", question, state.config.server.max_question_chars)

    @server.tool(annotations=_WRITES, structured_output=True)
    def ask(
        patient_id: PatientId,
        question: Question,
        image_base64: ImageB64 = None,
        image_path: ImagePath = None,
        image_study: StudyRef = None,
        study_id: Short = "",
        timestamp: Time = None,
        visual_tag: Short = "",
        write_back: bool = True,
        use_sem: Flag = True,
        use_epi: Flag = True,
        use_vis: Flag = True,
    ) -> Annotated[CallToolResult, AnswerOut]:
        """Answer a question about a patient's image with their memory (consent-checked, audited).

        Give the image as exactly one of image_base64, image_path or image_study. The answer
        comes with its evidence trail: each memory used, its kind and score = cosine x
        confidence x freshness x evidence-tier weight. With write_back the turn goes through
        short-term memory and the write-back gate into long-term memory (the gate's decision is
        returned); study_id names the study for later feedback."""

        def body(who: Caller) -> AnswerOut:
            question_ok(question)
            answer = state.call(
                state.mem.ask,
                who.principal,
                patient_id,
                image_of(state, image_base64, image_path, image_study),
                question,
                image_study=image_study,
                timestamp=timestamp,
                study_id=study_id,
                visual_tag=visual_tag,
                write_back=write_back,
                use_sem=use_sem,
                use_epi=use_epi,
                use_vis=use_vis,
            )
            return AnswerOut.model_validate(answer)

        return state.tool("ask", "ask", patient_id, body)

    @server.tool(annotations=_READS, structured_output=True)
    def retrieve(
        patient_id: PatientId,
        image_base64: ImageB64 = None,
        image_path: ImagePath = None,
        image_study: StudyRef = None,
        scope: Literal["patient", "population"] = "patient",
        at: Time = None,
        k: K = 10,
        use_sem: Flag = True,
        use_epi: Flag = True,
        use_vis: Flag = True,
    ) -> Annotated[CallToolResult, RetrievedOut]:
        """The ranked evidence for a patient's image, without an answer: the first k items.

        Give the image as exactly one of image_base64, image_path or image_study (a stored
        study is queried by the embedding stored with it). Scope
        "patient" ranks the patient's own semantic state, episodic and visual records;
        "population" also other patients' consented and anonymised records, whose content is
        withheld (record is null). Audited as a read; writes no memory."""

        def body(who: Caller) -> RetrievedOut:
            flags = {"scope": scope, "at": at, "use_sem": use_sem, "use_epi": use_epi, "use_vis": use_vis}
            img = image_of(state, image_base64, image_path, image_study)
            # a stored study: its stored embedding, read in the same governed call (one audit event)
            found = state.call(state.mem.retrieve, who.principal, patient_id, img, image_study=image_study, **flags)
            return RetrievedOut.model_validate(replace(found, items=found.items[: min(k, state.config.server.max_k)]))

        return state.tool("retrieve", "retrieve", patient_id, body)

    @server.tool(annotations=_WRITES, structured_output=True)
    def observe(
        patient_id: PatientId,
        question: Question,
        image_base64: ImageB64 = None,
        image_path: ImagePath = None,
        image_study: StudyRef = None,
        study_id: Short = "",
        timestamp: Time = None,
        visual_tag: Short = "",
    ) -> Annotated[CallToolResult, StmItemOut]:
        """Write a working observation (an image and a question) into the patient's short-term memory.

        Give the image as exactly one of image_base64, image_path or image_study. The item
        lives until its expiry (expires_at, UTC seconds); consolidate moves it into long-term
        memory with its answer. Audited."""

        def body(who: Caller) -> StmItemOut:
            question_ok(question)
            item = state.call(
                state.mem.observe,
                who.principal,
                patient_id,
                image_of(state, image_base64, image_path, image_study),
                question,
                image_study=image_study,
                timestamp=timestamp,
                study_id=study_id,
                visual_tag=visual_tag,
            )
            return StmItemOut.model_validate(item)

        return state.tool("observe", "observe", patient_id, body)

    @server.tool(annotations=_WRITES, structured_output=True)
    def consolidate(
        patient_id: PatientId,
        item_id: Annotated[str, Field(min_length=1, max_length=200, description="an active short-term item")],
        answer: Annotated[str, Field(min_length=1, max_length=20_000, description="the answer to its question")],
        decision: Annotated[str, Field(max_length=20_000)] = "",
    ) -> Annotated[CallToolResult, WriteResultOut]:
        """Move an active short-term item into long-term memory with its answer, through the write-back gate.

        The gate (novelty, answer length, a clinical keyword) decides; a held item stays in
        short-term memory. The patient's semantic state and the study's claim are superseded,
        never rewritten. Audited."""

        def body(who: Caller) -> WriteResultOut:
            result = state.call(state.mem.consolidate, who.principal, patient_id, item_id, answer, decision=decision)
            return WriteResultOut.model_validate(result)

        return state.tool("consolidate", "consolidate", patient_id, body)

    @server.tool(annotations=_WRITES, structured_output=True)
    def feedback(
        patient_id: PatientId,
        study_id: Annotated[str, Field(min_length=1, max_length=200, description="the study the verdict is on")],
        accept: bool,
        correction: Annotated[str, Field(max_length=20_000, description="the corrected finding (to reject)")] = "",
        decision: Annotated[str, Field(max_length=20_000)] = "",
        question: Annotated[
            str | None,
            Field(
                min_length=1, max_length=16_384, description="the question judged (needed when the study has several)"
            ),
        ] = None,
    ) -> Annotated[CallToolResult, ClaimOut]:
        """A critic's verdict on the agent's answer to a question about a study: accept, or reject with a correction.

        The question's claim and the answer's impression in the semantic state are superseded
        at the critic's evidence tier (a critic or clinician credential); answers to the
        study's other questions stay; the old versions stay, superseded (see the resource
        msm-mem://patients/{patient_id}/claims/{key}/chain). Returns the new claim."""

        def body(who: Caller) -> ClaimOut:
            claim = state.call(
                state.mem.feedback,
                who.principal,
                patient_id,
                study_id,
                accept=accept,
                correction=correction,
                decision=decision,
                question=question,
            )
            return ClaimOut.model_validate(claim)

        return state.tool("feedback", "feedback", patient_id, body)

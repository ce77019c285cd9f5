"""The form bodies of ask, retrieve and observe: an image (a file part) or a stored study, and
the operation's fields, parsed once and validated by one model.

A route reads its form with :func:`read_form`, which checks the content type (415), parses the
body (starlette's multipart or urlencoded parser) and validates every field in one call of
the body's model: a field left out or sent empty takes its default, fields the body does not
name are ignored, and every error is a 422 problem naming the fields (``body.<name>``), never
their values. The models are also what the OpenAPI document says of these bodies
(:func:`form_schemas`). Declaring each field as a FastAPI form parameter instead made the
framework resolve and validate them one by one on every request."""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.datastructures import UploadFile

from ..._limits import ID_SCHEMA_PATTERN, REQUIRED_TEXT_SCHEMA_PATTERN, TEXT_SCHEMA_PATTERN
from .problems import HttpProblem

__all__ = ["FORMS", "AskForm", "ContextForm", "ObserveForm", "RetrieveForm", "form_body", "form_schemas", "read_form"]

F = TypeVar("F", bound="_ImageForm")

Question = Annotated[
    str, Field(min_length=1, max_length=20_000, json_schema_extra={"pattern": REQUIRED_TEXT_SCHEMA_PATTERN})
]
StudyId = Annotated[str, Field(max_length=200, json_schema_extra={"pattern": ID_SCHEMA_PATTERN})]
Tag = Annotated[str, Field(max_length=200, json_schema_extra={"pattern": TEXT_SCHEMA_PATTERN})]
Time = Annotated[float, Field(allow_inf_nan=False, ge=-62_135_596_800.0, le=253_402_300_799.0)]
StudyRef = Annotated[
    str,
    Field(
        min_length=1,
        max_length=200,
        json_schema_extra={"pattern": ID_SCHEMA_PATTERN},
        description="a stored (ingested) study of the patient instead of an image",
    ),
]
_IMAGE = {
    "contentMediaType": "application/octet-stream",
    "description": "PNG, JPEG or DICOM; or give image_study instead",
    "minLength": 1,
    "title": "Image",
    "type": "string",
}
_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")


class _ImageForm(BaseModel):
    """The image of a request: a file part ``image`` (outside the model) or ``image_study``."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    image_study: StudyRef | None = None


class _Memories(BaseModel):
    """Which memories the operation uses (semantic, episodic, visual)."""

    use_sem: bool = True
    use_epi: bool = True
    use_vis: bool = True

    def memories(self) -> dict[str, bool]:
        return {"use_sem": self.use_sem, "use_epi": self.use_epi, "use_vis": self.use_vis}


class RetrieveForm(_ImageForm, _Memories):
    model_config = ConfigDict(title="Body_retrieve_v1_patients__patient_id__retrieve_post")

    scope: Literal["patient", "population"] = "patient"
    at: Time | None = None
    k: Annotated[int, Field(ge=1, le=100)] = 10


class ObserveForm(_ImageForm):
    model_config = ConfigDict(title="Body_observe_v1_patients__patient_id__observe_post")

    question: Question
    study_id: StudyId = ""
    timestamp: Time | None = None
    visual_tag: Tag = ""

    def observation(self) -> dict[str, Any]:
        """The keyword arguments of ``MsmMem.ask`` and ``observe`` besides image and question."""
        return {
            "image_study": self.image_study,
            "timestamp": self.timestamp,
            "study_id": self.study_id,
            "visual_tag": self.visual_tag,
        }


class AskForm(ObserveForm, _Memories):
    model_config = ConfigDict(title="Body_ask_v1_patients__patient_id__ask_post")

    write_back: bool = True


class ContextForm(ObserveForm, _Memories):
    model_config = ConfigDict(title="Body_context_v1_patients__patient_id__context_post")
    include_image: bool = False


FORMS: tuple[type[_ImageForm], ...] = (AskForm, ContextForm, ObserveForm, RetrieveForm)


async def read_form(request: Request, body: type[F]) -> tuple[F, UploadFile | None]:
    """The request's form as ``body`` and its image file part (None without one): 415 unless
    the body is a form, 422 for a field ``body`` refuses or an ``image`` that is not a file."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind not in _TYPES:
        raise HttpProblem("unsupported-media-type", "send the image and its fields as multipart/form-data")
    form = await request.form()
    fields: dict[str, Any] = {}
    upload: UploadFile | None = None
    errors: list[dict[str, Any]] = []
    for name, value in form.multi_items():
        if name == "image":
            if isinstance(value, UploadFile):
                upload = value
            elif value != "":
                errors.append({"type": "value_error", "loc": ("body", "image"), "msg": "expected a file part"})
        elif value != "":  # a form field sent empty is left out, as FastAPI's form parameters are
            fields[name] = value
    try:
        parsed = body.model_validate(fields)
    except ValidationError as exc:
        errors += [{"type": e["type"], "loc": ("body", *e["loc"]), "msg": e["msg"]} for e in exc.errors()]
    if errors:
        raise RequestValidationError(errors)
    return parsed, upload


def form_schemas() -> dict[str, dict[str, Any]]:
    """The OpenAPI component of each form body (by its title), the image as a file part."""
    out = {}
    for model in FORMS:
        schema = model.model_json_schema()
        for prop in schema["properties"].values():
            if "default" in prop and prop["default"] is None:
                del prop["default"]  # a form field left out is absent, never null
        schema["properties"] = {"image": dict(_IMAGE), **schema["properties"]}
        out[schema["title"]] = schema
    return out


def form_body(model: type[_ImageForm]) -> dict[str, Any]:
    """The ``openapi_extra`` of a route taking ``model`` as its multipart body."""
    ref = {"$ref": f"#/components/schemas/{model.model_config['title']}"}
    body: dict[str, Any] = {"content": {"multipart/form-data": {"schema": ref}}}
    if any(f.is_required() for f in model.model_fields.values()):
        body["required"] = True
    return {"requestBody": body}

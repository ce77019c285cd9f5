"""The endpoints, one module per group: health, care, reads, consent, admin (keys, audit,
maintenance). Each endpoint is a few lines: check the patient scope, call one MsmMem operation
as the caller's principal, render the result."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path

from ...._limits import PATIENT_PATH_PATTERN
from ..models import ProblemOut

__all__ = ["PROBLEM_RESPONSES", "PatientId"]

#: the problem answers every endpoint may give (documented in the OpenAPI schema)
PROBLEM_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ProblemOut, "description": text}
    for status, text in {
        400: "Malformed request",
        401: "No valid credential",
        403: "Refused: role, patient scope or consent (audited)",
        404: "Unknown patient, record or consent",
        409: "A move the transition table refuses, or a broken audit chain",
        413: "Request body too large",
        415: "Unsupported content type",
        422: "Invalid input",
        429: "Too many requests from this address or with this credential, or too many failed logins",
        500: "Internal error",
        502: "The model backend failed",
        503: "The store cannot be used, the model server is unavailable, or every image decoder is busy",
    }.items()
}

#: a patient id as the server takes it: no blank, comma, ``*``, control or format character
PatientId = Annotated[
    str, Path(min_length=1, max_length=128, pattern=r"^[^\s,*]+$", json_schema_extra={"pattern": PATIENT_PATH_PATTERN})
]

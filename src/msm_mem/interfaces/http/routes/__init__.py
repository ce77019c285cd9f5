"""The endpoints, one module per group: health, care, reads, consent, admin (keys, audit,
maintenance). Each endpoint is a few lines: check the patient scope, call one MsmMem operation
as the caller's principal, render the result."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path

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
        500: "Internal error",
        502: "The model backend failed",
        503: "The store cannot be used, or the model server is unavailable",
    }.items()
}

PatientId = Annotated[str, Path(min_length=1, max_length=128, pattern=r"^[^\s,*]+$")]

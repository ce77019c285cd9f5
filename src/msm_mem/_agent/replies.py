"""What the agent does with a backbone's reply before using it: check its shape, and
de-identify an answer derived from other patients' experience."""

from __future__ import annotations

from dataclasses import replace

from .._errors import BackendError
from .._memory.population import deidentified_text
from ..plugins.backbones.base import BackboneReply

__all__ = ["checked", "scrubbed"]


def checked(reply: object, name: str) -> BackboneReply:
    if not isinstance(reply, BackboneReply):
        raise BackendError(f"backbone {name!r} returned {type(reply).__name__}, not a BackboneReply")
    if not isinstance(reply.answer, str) or not reply.answer.strip():
        raise BackendError(f"backbone {name!r} returned a malformed reply: the answer must be non-empty text")
    if not isinstance(reply.decision, str) or not isinstance(reply.source, str):
        raise BackendError(f"backbone {name!r} returned a malformed reply: decision and source must be text")
    return reply


def scrubbed(reply: BackboneReply) -> BackboneReply:
    answer, decision = deidentified_text(reply.answer), deidentified_text(reply.decision)
    if answer is None or decision is None or not answer.strip():
        raise BackendError("the answer derived from population experience could not be de-identified")
    return replace(reply, answer=answer, decision=decision)

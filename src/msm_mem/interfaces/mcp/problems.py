"""Tool results and errors: a result is the HTTP service's response model as structured content
(and as JSON text for clients that read text only); an error is the RFC 9457 problem document of
its class (:data:`msm_mem._problems.PROBLEMS`, the table the HTTP service and the client read),
sent as a tool error (``isError``) for a tool and as a JSON-RPC error (with the problem as its
``data``) for a resource.

As in the HTTP service, the detail is the error's message with the call's patient id taken out,
an unexpected error says nothing but "internal error" (the log names its class and the tool),
and an argument the SDK refuses is reported by its location and message, never its value.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, CallToolResult, TextContent
from pydantic import BaseModel
from pydantic_core import ErrorDetails

from ... import AuditChainBroken, InvalidInput, MissingExtra, MsmMemError
from ..._problems import Problem, problem_for, slug
from ..auth.credentials import Unauthenticated

__all__ = ["arguments_problem", "ok", "problem", "resource_error", "tool_error"]

log = logging.getLogger("msm_mem.mcp")


def ok(model: BaseModel) -> CallToolResult:
    """A tool's result: ``model`` as structured content and as its JSON text."""
    doc = model.model_dump(mode="json")
    return CallToolResult(content=[TextContent(type="text", text=json.dumps(doc))], structured_content=doc)


def _scrub(text: str, patient_id: str) -> str:
    text = " ".join(text.split())[:500]
    return text.replace(patient_id, "<patient>") if patient_id else text


def problem(exc: BaseException, where: str, patient_id: str = "") -> dict[str, Any]:
    """The problem document of ``exc`` raised by tool or resource ``where``."""
    extra: dict[str, Any] = {}
    if isinstance(exc, Unauthenticated):
        p, detail = slug("unauthenticated"), str(exc)
    elif isinstance(exc, MsmMemError):
        p, detail = problem_for(exc), str(exc)
        if isinstance(exc, AuditChainBroken):
            extra["seq"] = exc.seq
        elif isinstance(exc, MissingExtra):
            extra.update(package=exc.package, extra=exc.extra)
        if p.status >= 500:
            log.error("%s in %s", type(exc).__name__, where)
    else:
        log.error("unexpected %s in %s", type(exc).__name__, where)
        p, detail = slug("internal-error"), "internal error"
    return _document(p, _scrub(detail, patient_id), where, extra)


def _document(p: Problem, detail: str, where: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": p.type, "title": p.title, "status": p.status, "detail": detail, "instance": where, **(extra or {})}


def _error(doc: dict[str, Any]) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=json.dumps(doc))], structured_content=doc, is_error=True
    )


def tool_error(exc: BaseException, tool: str, patient_id: str = "") -> CallToolResult:
    """The tool error answering ``exc``."""
    return _error(problem(exc, tool, patient_id))


def arguments_problem(tool: str, errors: Sequence[ErrorDetails] = (), unknown: Sequence[str] = ()) -> CallToolResult:
    """The ``invalid-input`` tool error for arguments the schema refuses (locations and messages
    only: the rejected values may be PHI) or that the tool does not take."""
    parts = [f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in errors[:10]]
    if unknown:
        parts.append(f"unknown argument(s) {sorted(unknown)}: the principal is the credential's, never an argument")
    doc = _document(problem_for(InvalidInput()), "; ".join(parts), tool)
    doc["errors"] = [{"loc": [str(x) for x in e["loc"]], "msg": str(e["msg"])} for e in errors]
    return _error(doc)


def resource_error(exc: BaseException, uri: str, patient_id: str = "") -> MCPError:
    """The JSON-RPC error answering ``exc`` on reading resource ``uri``; ``data`` is the problem
    (invalid params for a refusal or bad input, internal error for a failure of the server)."""
    doc = problem(exc, uri.replace(patient_id, "<patient>") if patient_id else uri, patient_id)
    code = INVALID_PARAMS if doc["status"] < 500 else INTERNAL_ERROR
    return MCPError(code=code, message=f"{doc['title']}: {doc['detail']}", data=doc)

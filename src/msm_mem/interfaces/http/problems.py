"""Every error as an RFC 9457 problem (``application/problem+json``), in one place.

The library's exceptions map through :data:`msm_mem._problems.PROBLEMS` (a stable ``type`` URI
and status per class); the HTTP layer's own refusals (no credential, a malformed, oversized or
wrongly typed request, an unknown route) have types there too. The ``detail`` is the error's
message with the request's patient id taken out; an unexpected error answers 500 with no
detail at all, and the log names only its class, the route and the request id: no PHI in an
error body or a log line.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from ... import AuditChainBroken, InvalidInput, ManifestError, MissingExtra, MsmMemError
from ..._problems import Problem, problem_for, slug
from ..auth.credentials import Unauthenticated

__all__ = ["MEDIA_TYPE", "HttpProblem", "install", "problem_response"]

MEDIA_TYPE = "application/problem+json"
_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")
log = logging.getLogger("msm_mem.http")


class HttpProblem(Exception):
    """A refusal of the HTTP layer itself: the slug of its problem type and a detail."""

    def __init__(self, slug_: str, detail: str, *, retry_after: float | None = None) -> None:
        super().__init__(detail)
        self.slug = slug_
        self.detail = detail
        #: seconds a client waits before it tries again (the ``Retry-After`` header), if any
        self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        return {} if self.retry_after is None else {"Retry-After": str(max(1, math.ceil(self.retry_after)))}


def _scrub(text: str, request: Request) -> str:
    text = " ".join(text.split())[:500]
    patient = request.path_params.get("patient_id")
    if isinstance(patient, str) and patient:
        text = text.replace(patient, "<patient>")
    return text


def problem_response(
    request: Request,
    problem: Problem,
    detail: str,
    extra: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """The problem document of ``problem`` for this request, with ``headers`` besides."""
    body: dict[str, Any] = {
        "type": problem.type,
        "title": problem.title,
        "status": problem.status,
        "detail": _scrub(detail, request),
        "instance": request.url.path if "patient_id" not in request.path_params else None,
    }
    body = {k: v for k, v in body.items() if v is not None}
    body.update(extra or {})
    headers = dict(headers or {})
    if problem.status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="msm-mem"'
    return JSONResponse(body, status_code=problem.status, media_type=MEDIA_TYPE, headers=headers)


def _library(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, MsmMemError)
    problem = problem_for(exc)
    extra: dict[str, Any] = {}
    if isinstance(exc, AuditChainBroken):
        extra["seq"] = exc.seq
    elif isinstance(exc, ManifestError):
        extra["line"] = exc.line
    elif isinstance(exc, MissingExtra):
        extra.update(package=exc.package, extra=exc.extra)
    if problem.status >= 500:
        log.error("%s on %s (request %s)", type(exc).__name__, _route(request), _request_id(request))
    return problem_response(request, problem, str(exc), extra)


def _unauthenticated(request: Request, exc: Exception) -> JSONResponse:
    log.warning("refused credential on %s: %s", _route(request), exc)
    return problem_response(request, slug("unauthenticated"), str(exc))


def _http_problem(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HttpProblem)
    return problem_response(request, slug(exc.slug), exc.detail, headers=exc.headers())


def _validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    if any(e.get("type") == "json_invalid" for e in errors):
        return problem_response(request, slug("malformed-request"), "the body is not valid JSON")
    # locations and messages only: the rejected values themselves may be PHI
    parts = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}" for e in errors[:10]]
    extra = {"errors": [{"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", ""))} for e in errors]}
    return problem_response(request, problem_for(InvalidInput()), "; ".join(parts), extra)


def _starlette(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 404:
        return problem_response(request, slug("no-route"), "no such endpoint")
    if exc.status_code == 405:
        allowed = _allowed_methods(request)
        return problem_response(
            request,
            slug("method-not-allowed"),
            f"method not allowed here (allowed: {allowed})",
            headers={"Allow": allowed},
        )
    if exc.status_code == 413:
        return problem_response(request, slug("payload-too-large"), str(exc.detail))
    if exc.status_code == 415:
        return problem_response(request, slug("unsupported-media-type"), str(exc.detail))
    if exc.status_code == 401:
        return problem_response(request, slug("unauthenticated"), str(exc.detail))
    return problem_response(request, slug("malformed-request"), str(exc.detail))


def _allowed_methods(request: Request) -> str:
    """The methods some route answers at the request's path (RFC 9110: a 405 answer lists them
    in ``Allow``); starlette would name the first matching route's only, or none."""
    scope = {k: v for k, v in request.scope.items() if k not in ("route", "endpoint", "path_params")}
    routes = request.app.router.routes
    allowed = [m for m in _METHODS if any(r.matches({**scope, "method": m})[0] is Match.FULL for r in routes)]
    return ", ".join(allowed)


def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.error("unexpected %s on %s (request %s)", type(exc).__name__, _route(request), _request_id(request))
    return problem_response(request, slug("internal-error"), "internal error")


def _route(request: Request) -> str:
    route = request.scope.get("route")
    return str(getattr(route, "path", "?"))


def _request_id(request: Request) -> str:
    return str(getattr(request.state, "request_id", "-"))


def install(app: FastAPI) -> None:
    """Answer every error of ``app`` as a problem."""
    app.add_exception_handler(MsmMemError, _library)
    app.add_exception_handler(Unauthenticated, _unauthenticated)
    app.add_exception_handler(HttpProblem, _http_problem)
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(StarletteHTTPException, _starlette)
    app.add_exception_handler(Exception, _unexpected)

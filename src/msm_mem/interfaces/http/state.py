"""What the endpoints share: the open store and its lock, the caller of a request, the patient
scope check, uploaded images and pages.

Every call into :class:`~msm_mem.MsmMem` that writes memory (ask, observe, consolidate, ...)
runs under one lock per process: a turn is staged against the store as it is, so two turns of
one process never interleave. Governed reads (retrieve, the patient reads) write nothing but
their audit events and run outside it: the store serialises its own connection, and the audit
events of reads finishing together share one transaction (group commit). Several worker
processes scale either store.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, TypeVar

from fastapi import Depends, Header, Query, Request
from starlette.concurrency import run_in_threadpool

from ... import MsmMem, MsmMemError
from ..auth.apikeys import ALL_PATIENTS
from ..auth.credentials import Caller, Unauthenticated, Verifier
from .config import ServeConfig
from .problems import HttpProblem
from .throttle import Throttle
from .uploads import check_text, decode_upload

__all__ = [
    "BREAK_GLASS_HEADER",
    "CallerDep",
    "Paging",
    "ServerState",
    "authorize",
    "caller",
    "client_address",
    "check_text",
    "decode_upload",
    "paging",
    "require_json",
    "server",
]

R = TypeVar("R")
log = logging.getLogger("msm_mem.http")

#: the header that carries an admin's reason to act outside its credential's patient scope
BREAK_GLASS_HEADER = "X-Break-Glass-Reason"


@dataclass
class ServerState:
    """One process's server: its settings, the open store, the lock, the token verifier and
    the request limits."""

    config: ServeConfig
    mem: MsmMem
    verifier: Verifier
    lock: threading.Lock
    throttle: Throttle

    def call(self, fn: Callable[..., R], *args: object, **kwargs: object) -> R:
        """``fn(*args, **kwargs)`` (an MsmMem operation) under the store's lock."""
        with self.lock:
            return fn(*args, **kwargs)

    def read(self, fn: Callable[..., R], *args: object, **kwargs: object) -> R:
        """``fn(*args, **kwargs)`` (a governed MsmMem read, which writes only its audit events)
        outside the lock, so reads of several threads overlap and share their audit commits."""
        return fn(*args, **kwargs)


def server(request: Request) -> ServerState:
    state = request.app.state.server
    assert isinstance(state, ServerState)
    return state


def client_address(request: Request) -> str:
    """The address the request came from (the proxy's, behind a proxy)."""
    return request.client.host if request.client is not None else "-"


def _credential_kind(authorization: str | None) -> str:
    """What a refused ``Authorization`` header presented, for the audit event (never the token)."""
    scheme, _, token = (authorization or "").partition(" ")
    token = token.strip()
    if not authorization:
        return "none"
    if scheme.lower() == "bearer" and token.startswith("msmk_"):
        return "api-key"
    if scheme.lower() == "bearer" and token.count(".") == 2:
        return "jwt"
    return "other"


async def caller(request: Request, authorization: Annotated[str | None, Header()] = None) -> Caller:
    """The verified caller of the request (401 otherwise); its actor id goes to the access log.

    A key verified before is found on the event loop; a new token's hash or signature is
    checked in a worker thread, so a flood of unknown tokens never stalls the loop. A failed
    login is audited (``MsmMem.refuse_login``) and counted against the client's address; an
    address with ``max_login_failures`` in the window is answered 429 without its token being
    checked. A caller past its credential's request rate is answered 429."""
    state = server(request)
    verifier, throttle = state.verifier, state.throttle
    who = verifier.known(authorization)
    if who is None:
        address = client_address(request)
        wait = throttle.logins.blocked(address)
        if wait > 0:
            raise HttpProblem("too-many-requests", "too many failed logins from this address", retry_after=wait)
        try:
            who = await run_in_threadpool(verifier.caller, authorization)
        except Unauthenticated:
            throttle.logins.fail(address)
            await run_in_threadpool(_audit_login, state, _credential_kind(authorization))
            raise
    wait = throttle.per_credential.take(f"{who.credential}:{who.credential_id or who.principal.id}")
    if wait > 0:
        raise HttpProblem("too-many-requests", "too many requests with this credential", retry_after=wait)
    request.state.actor = who.principal.id
    return who


def _audit_login(state: ServerState, credential: str) -> None:
    """Record a failed login; a store that cannot take the event is logged, and the request
    is still answered 401."""
    try:
        state.call(state.mem.refuse_login, credential)
    except MsmMemError as exc:
        log.warning("a failed login could not be audited (%s)", type(exc).__name__)


CallerDep = Annotated[Caller, Depends(caller)]


def authorize(request: Request, who: Caller, operation: str, patient_id: str) -> None:
    """Let ``who`` act on ``patient_id`` ("*": every patient) when it lies inside the scope of
    the credential; an admin outside it only with a reason in the break-glass header (audited
    as break-glass); any other refusal is audited as a denial and answered 403."""
    if who.covers(patient_id):
        return
    state = server(request)
    reason = (request.headers.get(BREAK_GLASS_HEADER) or "").strip()
    if reason and who.principal.role.value == "admin":
        state.call(
            state.mem.break_glass, who.principal, operation, "" if patient_id == ALL_PATIENTS else patient_id, reason
        )
        return
    state.call(state.mem.refuse, who.principal, operation, "" if patient_id == ALL_PATIENTS else patient_id)


@dataclass(frozen=True, slots=True)
class Paging:
    offset: int
    limit: int


async def paging(
    request: Request,
    offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> Paging:
    """The page a list endpoint returns (at most the server's page size)."""
    return Paging(offset, min(limit, server(request).config.max_page))


def _content_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


async def require_json(request: Request, _: CallerDep) -> None:
    """415 unless the body is declared JSON (checked after the credential)."""
    if _content_type(request) != "application/json":
        raise HttpProblem("unsupported-media-type", "send the body as application/json")

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

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, TypeVar

from fastapi import Depends, Header, Query, Request
from starlette.concurrency import run_in_threadpool

from ... import MsmMem
from ..auth.apikeys import ALL_PATIENTS
from ..auth.credentials import Caller, Verifier
from .config import ServeConfig
from .problems import HttpProblem
from .uploads import check_text, decode_upload

__all__ = [
    "BREAK_GLASS_HEADER",
    "CallerDep",
    "Paging",
    "ServerState",
    "authorize",
    "caller",
    "check_text",
    "decode_upload",
    "paging",
    "require_json",
    "server",
]

R = TypeVar("R")

#: the header that carries an admin's reason to act outside its credential's patient scope
BREAK_GLASS_HEADER = "X-Break-Glass-Reason"


@dataclass
class ServerState:
    """One process's server: its settings, the open store, the lock and the token verifier."""

    config: ServeConfig
    mem: MsmMem
    verifier: Verifier
    lock: threading.Lock

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


async def caller(request: Request, authorization: Annotated[str | None, Header()] = None) -> Caller:
    """The verified caller of the request (401 otherwise); its actor id goes to the access log.

    A key verified before is found on the event loop; a new token's hash or signature is
    checked in a worker thread, so a flood of unknown tokens never stalls the loop."""
    verifier = server(request).verifier
    who = verifier.known(authorization)
    if who is None:
        who = await run_in_threadpool(verifier.caller, authorization)
    request.state.actor = who.principal.id
    return who


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

"""What the tools and resources share: the open store and its lock, the caller of a call, the
patient scope check, and one governed call from the credential to its result or problem.

Every call into :class:`~msm_mem.MsmMem` runs under one lock (the store's operations are not
meant to interleave; the SDK runs each tool on a worker thread). A patient outside the caller's
scope is refused through ``MsmMem.refuse``, so the denial is in the audit trail with the actor,
before the operation runs; the operation itself checks the role, consent and the transition
table, and audits, as for every other door.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from mcp_types import CallToolResult
from pydantic import BaseModel

from ... import InvalidInput, MsmMem
from ..._limits import check_id
from ..auth.credentials import Caller
from ..http.throttle import Throttle
from .config import McpConfig
from .identity import Identity
from .problems import ok, resource_error, tool_error

__all__ = ["McpState"]

R = TypeVar("R")
log = logging.getLogger("msm_mem.mcp")


@dataclass
class McpState:
    """One server's store, settings, identity source and lock."""

    mem: MsmMem
    config: McpConfig
    identity: Identity
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: this process's limits (failed logins per address, image decodes at once), as `serve`'s
    throttle: Throttle = field(init=False)

    def __post_init__(self) -> None:
        self.throttle = self.config.server.throttle()

    def call(self, fn: Callable[..., R], *args: object, **kwargs: object) -> R:
        """``fn(*args, **kwargs)`` (an MsmMem operation) under the store's lock."""
        with self.lock:
            return fn(*args, **kwargs)

    def authorize(self, who: Caller, operation: str, patient_id: str) -> None:
        """Let ``who`` act on ``patient_id`` inside its credential's scope; any other patient is
        refused, audited as a denial naming the actor (AccessDenied). There is no break-glass
        over MCP: its tools are care and reads, which an admin's role does not run anyway.
        A malformed id is InvalidInput before anything is recorded (the HTTP path's rules)."""
        check_id("patient_id", patient_id)
        if len(patient_id) > 128 or any(c in patient_id for c in " ,*"):
            raise InvalidInput("patient_id must be 1 to 128 characters without spaces, commas or '*'")
        if not who.covers(patient_id):
            self.call(self.mem.refuse, who.principal, operation, patient_id)

    def tool(
        self,
        tool: str,
        operation: str | None,
        patient_id: str,
        body: Callable[[Caller], BaseModel],
        render: Callable[[BaseModel], CallToolResult] = ok,
    ) -> CallToolResult:
        """Run one tool call: the caller, the scope check for ``operation`` on ``patient_id``
        (None: the call names no patient), then ``body``, its result as ``render`` makes it
        (default: structured content and its JSON text); any error as its problem."""
        actor = "-"
        try:
            who = self.identity.caller()
            actor = who.principal.id
            if operation is not None:
                self.authorize(who, operation, patient_id)
            result = render(body(who))
        except Exception as exc:  # every error is answered as a problem; unexpected ones say no more
            error = tool_error(exc, tool, patient_id)
            log.info("tool %s actor=%s %s", tool, actor, (error.structured_content or {}).get("type", "error"))
            return error
        log.info("tool %s actor=%s ok", tool, actor)
        return result

    def resource(self, uri: str, patient_id: str, body: Callable[[Caller], BaseModel]) -> str:
        """Read one resource as JSON text: the caller, the scope check (a read of ``patient_id``),
        then ``body``; any error raised as the JSON-RPC error carrying its problem."""
        actor = "-"
        try:
            who = self.identity.caller()
            actor = who.principal.id
            self.authorize(who, "read", patient_id)
            text = body(who).model_dump_json()
        except Exception as exc:  # answered as a JSON-RPC error with the problem as its data
            error = resource_error(exc, uri, patient_id)
            log.info("resource actor=%s %s", actor, error.data.get("type") if isinstance(error.data, dict) else "error")
            raise error from None
        log.info("resource actor=%s ok", actor)
        return text

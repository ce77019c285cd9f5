""":class:`MemoryClient`: the operations of :class:`~msm_mem.MsmMem`, call for call, over HTTP."""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Concatenate, ParamSpec, TypeVar

from .._errors import MissingExtra
from . import calls, operations
from .calls import Call
from .operations import Plan

if TYPE_CHECKING:
    import httpx

__all__ = ["MemoryClient"]

T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")


def _blocking(plan: Callable[P, Plan[R]]) -> Callable[Concatenate[MemoryClient, P], R]:
    """The method of :class:`MemoryClient` that runs ``plan``."""

    def run(self: MemoryClient, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._execute(plan(*args, **kwargs))

    return operations.method(run, plan, "MemoryClient")


class MemoryClient:
    """A client of ``msm-mem serve`` at ``base_url``, acting as the principal of ``token`` (an
    API key or a JWT): the server takes who is asking from the credential, never from a call.

    Each method mirrors the :class:`~msm_mem.MsmMem` operation of the same name without its
    principal argument, and returns the same frozen records (embeddings are not sent: a
    record's ``z`` is an empty vector). Lists are fetched page by page until the last.
    Refusals and errors raise the library's exceptions (``AccessDenied``, ``ConsentDenied``,
    ``NotFound``, ``InvalidInput``...), from the server's RFC 9457 problem documents.

    Only idempotent calls (the reads, audit verification and export) are retried, up to
    ``retries`` more times on a transport error or a 502/503/504, ``backoff_s`` apart and
    doubling. ``break_glass_reason`` (admins only) is sent with every call to act outside the
    credential's patient scope; the server audits it. ``verify`` is True (the system's CAs),
    a CA bundle path (a self-signed certificate, the hospital's CA) or an ``ssl.SSLContext``.
    ``transport`` replaces the network (an ``httpx`` transport, for tests).
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 30.0,
        retries: int = 2,
        backoff_s: float = 0.2,
        break_glass_reason: str | None = None,
        transport: httpx.BaseTransport | None = None,
        verify: bool | str | ssl.SSLContext = True,
    ) -> None:
        try:
            import httpx
        except ImportError:
            raise MissingExtra("httpx", "client") from None
        headers = calls.headers(token, retries, break_glass_reason)
        self._httpx = httpx
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers=headers,
            timeout=timeout,
            transport=transport,
            verify=calls.tls(verify),
        )
        self._retries = retries
        self._backoff = backoff_s

    # plumbing --------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> MemoryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, call: Call[T]) -> T:
        attempts = 1 + (self._retries if call.idempotent else 0)
        for attempt in range(attempts):
            last = attempt == attempts - 1
            try:
                response = self._http.request(call.method, call.path, **call.send_kwargs())
            except self._httpx.TransportError as exc:
                if last:
                    raise calls.unreachable(call, exc) from exc
            else:
                if last or not calls.retryable(response):
                    return calls.answer(call, response)
            time.sleep(self._backoff * 2**attempt)
        raise AssertionError("unreachable")

    def _execute(self, plan: Plan[R]) -> R:
        """Run ``plan``: send each request it yields, hand it the answer or throw it the error."""
        try:
            call = next(plan)
            while True:
                try:
                    result = self._run(call)
                except Exception as exc:
                    call = plan.throw(exc)
                else:
                    call = plan.send(result)
        except StopIteration as done:
            value: R = done.value
            return value

    # each operation is a plan of :mod:`.operations` (its signature and docstring too), run here

    # what the service is ------------------------------------------------------------------------

    health = _blocking(operations.health)
    whoami = _blocking(operations.whoami)

    # clinical operations ------------------------------------------------------------------------

    ask = _blocking(operations.ask)
    retrieve = _blocking(operations.retrieve)
    observe = _blocking(operations.observe)
    context = _blocking(operations.context)
    record_answer = _blocking(operations.record_answer)
    consolidate = _blocking(operations.consolidate)
    feedback = _blocking(operations.feedback)

    # reads --------------------------------------------------------------------------------------

    semantic_state = _blocking(operations.semantic_state)
    semantic_history = _blocking(operations.semantic_history)
    episodes = _blocking(operations.episodes)
    visuals = _blocking(operations.visuals)
    claims = _blocking(operations.claims)
    claim_history = _blocking(operations.claim_history)
    stm_items = _blocking(operations.stm_items)

    # governance ---------------------------------------------------------------------------------

    grant = _blocking(operations.grant)
    revoke = _blocking(operations.revoke)
    consents = _blocking(operations.consents)
    rotate_keys = _blocking(operations.rotate_keys)
    shred = _blocking(operations.shred)
    verify_audit = _blocking(operations.verify_audit)
    checkpoint = _blocking(operations.checkpoint)
    export_fhir = _blocking(operations.export_fhir)
    audit_trail = _blocking(operations.audit_trail)
    maintain = _blocking(operations.maintain)

""":class:`AsyncMemoryClient`: :class:`~msm_mem.MemoryClient` for asyncio, call for call: the same
operations (:mod:`.operations`), the same records and exceptions, each request awaited."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from .._errors import MissingExtra
from . import calls, operations
from .calls import Call
from .operations import Plan

if TYPE_CHECKING:
    import httpx

__all__ = ["AsyncMemoryClient"]

T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")


def _awaited(plan: Callable[P, Plan[R]]) -> Callable[Concatenate[AsyncMemoryClient, P], Coroutine[Any, Any, R]]:
    """The coroutine method of :class:`AsyncMemoryClient` that runs ``plan``."""

    async def run(self: AsyncMemoryClient, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return await self._execute(plan(*args, **kwargs))

    return operations.method(run, plan, "AsyncMemoryClient")


class AsyncMemoryClient:
    """An asyncio client of ``msm-mem serve`` at ``base_url`` (``httpx.AsyncClient``), acting as
    the principal of ``token`` (an API key or a JWT): :class:`~msm_mem.MemoryClient`'s methods,
    each a coroutine (``await memory.ask(...)``; ``async with`` closes it).

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
        transport: httpx.AsyncBaseTransport | None = None,
        verify: bool | str | ssl.SSLContext = True,
    ) -> None:
        try:
            import httpx
        except ImportError:
            raise MissingExtra("httpx", "client") from None
        headers = calls.headers(token, retries, break_glass_reason)
        self._httpx = httpx
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers=headers,
            timeout=timeout,
            transport=transport,
            verify=calls.tls(verify),
        )
        self._retries = retries
        self._backoff = backoff_s

    # plumbing --------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncMemoryClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _run(self, call: Call[T]) -> T:
        attempts = 1 + (self._retries if call.idempotent else 0)
        for attempt in range(attempts):
            last = attempt == attempts - 1
            try:
                response = await self._http.request(call.method, call.path, **call.send_kwargs())
            except self._httpx.TransportError as exc:
                if last:
                    raise calls.unreachable(call, exc) from exc
            else:
                if last or not calls.retryable(response):
                    return calls.answer(call, response)
            await asyncio.sleep(self._backoff * 2**attempt)
        raise AssertionError("unreachable")

    async def _execute(self, plan: Plan[R]) -> R:
        """Run ``plan``: send each request it yields, hand it the answer or throw it the error."""
        try:
            call = next(plan)
            while True:
                try:
                    result = await self._run(call)
                except Exception as exc:
                    call = plan.throw(exc)
                else:
                    call = plan.send(result)
        except StopIteration as done:
            value: R = done.value
            return value

    # each operation is a plan of :mod:`.operations` (its signature and docstring too), run here

    # what the service is ------------------------------------------------------------------------

    health = _awaited(operations.health)
    whoami = _awaited(operations.whoami)

    # clinical operations ------------------------------------------------------------------------

    ask = _awaited(operations.ask)
    retrieve = _awaited(operations.retrieve)
    observe = _awaited(operations.observe)
    context = _awaited(operations.context)
    record_answer = _awaited(operations.record_answer)
    consolidate = _awaited(operations.consolidate)
    feedback = _awaited(operations.feedback)

    # reads --------------------------------------------------------------------------------------

    semantic_state = _awaited(operations.semantic_state)
    semantic_history = _awaited(operations.semantic_history)
    episodes = _awaited(operations.episodes)
    visuals = _awaited(operations.visuals)
    claims = _awaited(operations.claims)
    claim_history = _awaited(operations.claim_history)
    stm_items = _awaited(operations.stm_items)

    # governance ---------------------------------------------------------------------------------

    grant = _awaited(operations.grant)
    revoke = _awaited(operations.revoke)
    consents = _awaited(operations.consents)
    rotate_keys = _awaited(operations.rotate_keys)
    shred = _awaited(operations.shred)
    verify_audit = _awaited(operations.verify_audit)
    checkpoint = _awaited(operations.checkpoint)
    export_fhir = _awaited(operations.export_fhir)
    audit_trail = _awaited(operations.audit_trail)
    maintain = _awaited(operations.maintain)

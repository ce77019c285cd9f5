"""MemoryClient and AsyncMemoryClient without a server (a fake transport): retries only for
idempotent calls, pages followed to the end, problems raised as the library's exceptions, and
the async client mirroring the sync one."""

from __future__ import annotations

import asyncio
import inspect

import httpx
import pytest

from msm_mem import AccessDenied, AsyncMemoryClient, BackendError, InvalidInput, MemoryClient, RecordPage

_CLAIM = {
    "claim_id": "C-0",
    "patient_id": "P1",
    "key": "study:S1",
    "content": "c",
    "source": "s",
    "confidence": 0.5,
    "evidence_tier": "agent",
    "created_at": 1.0,
    "decay_at": None,
    "state": "active",
    "supersedes": None,
}
PROBLEM = {"type": "urn:msm-mem:problem:access-denied", "title": "t", "status": 403, "detail": "no"}


def _client(handler: object, **kwargs: object) -> MemoryClient:
    return MemoryClient("http://test", "msmk_x", transport=httpx.MockTransport(handler), backoff_s=0, **kwargs)  # type: ignore[arg-type]


def test_reads_are_retried_writes_are_not() -> None:
    """A 503 is retried for a GET (then succeeds) and not for a POST."""
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.method)
        if len(calls) == 1:
            return httpx.Response(503, json={"type": "urn:msm-mem:problem:store-error", "status": 503})
        return httpx.Response(200, json={"items": [], "total": 0, "offset": 0, "limit": 500, "next_offset": None})

    with _client(handler) as c:
        assert c.episodes("P1") == []
    assert calls == ["GET", "GET"]
    calls.clear()
    with _client(handler) as c, pytest.raises(Exception, match="HTTP 503|store"):
        c.consolidate("P1", "M-1", "answer")
    assert calls == ["POST"]


def test_transport_errors_end_as_backend_errors() -> None:
    """A server that never answers is a BackendError after the bounded retries."""

    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with _client(handler, retries=2) as c, pytest.raises(BackendError):
        c.verify_audit()


def test_pages_are_followed_and_problems_raised() -> None:
    """Two pages make one list; a 403 problem is AccessDenied; a bad id is refused locally."""

    def handler(request: httpx.Request) -> httpx.Response:
        if "visuals" in request.url.path:
            return httpx.Response(403, json=PROBLEM, headers={"content-type": "application/problem+json"})
        offset = int(request.url.params["offset"])
        claim = {**_CLAIM, "claim_id": f"C-{offset}"}
        return httpx.Response(
            200,
            json={
                "items": [claim],
                "total": 2,
                "offset": offset,
                "limit": 1,
                "next_offset": 1 if offset == 0 else None,
            },
        )

    with _client(handler) as c:
        assert [x.claim_id for x in c.claims("P1")] == ["C-0", "C-1"]
        with pytest.raises(AccessDenied, match="no"):
            c.visuals("P1")
        with pytest.raises(InvalidInput):
            c.episodes("..")


def test_a_page_asked_for_is_fetched_as_a_page() -> None:
    """offset and limit pass through as the page asked for: the items, offset and total of the
    server's answer come back as a RecordPage; a bad page is refused before any request."""
    asked: list[tuple[str, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        offset, limit = request.url.params["offset"], request.url.params["limit"]
        asked.append((offset, limit))
        items = [{**_CLAIM, "claim_id": f"C-{i}"} for i in range(int(offset), min(int(offset) + int(limit), 7))]
        nxt = int(offset) + len(items)
        return httpx.Response(
            200,
            json={"items": items, "total": 7, "offset": int(offset), "limit": int(limit), "next_offset": nxt},
        )

    with _client(handler) as c:
        page = c.claims("P1", offset=2, limit=3)
        assert isinstance(page, RecordPage) and [x.claim_id for x in page] == ["C-2", "C-3", "C-4"]
        assert (page.offset, page.total, page.next_offset) == (2, 7, 5)
        assert asked == [("2", "3")]
        with pytest.raises(InvalidInput, match="limit"):
            c.claims("P1", limit=0)
    assert len(asked) == 1


def _async_client(handler: object, **kwargs: object) -> AsyncMemoryClient:
    transport = httpx.MockTransport(handler)  # type: ignore[arg-type]
    return AsyncMemoryClient("http://test", "msmk_x", transport=transport, backoff_s=0, **kwargs)  # type: ignore[arg-type]


def test_the_async_client_mirrors_the_sync_one_call_for_call() -> None:
    """Every public method of MemoryClient is a coroutine of AsyncMemoryClient with the same
    signature (close is aclose)."""
    public = {n for n in dir(MemoryClient) if not n.startswith("_")} - {"close"}
    assert public == {n for n in dir(AsyncMemoryClient) if not n.startswith("_")} - {"aclose"}
    for name in public:
        sync, coro = getattr(MemoryClient, name), getattr(AsyncMemoryClient, name)
        assert inspect.iscoroutinefunction(coro), name
        assert inspect.signature(sync) == inspect.signature(coro), name
    assert inspect.signature(MemoryClient.__init__).parameters.keys() == (
        inspect.signature(AsyncMemoryClient.__init__).parameters.keys()
    )


def test_the_async_client_retries_reads_not_writes_and_raises_problems() -> None:
    """A 503 is retried for a GET and not for a POST; a transport error after the retries is a
    BackendError; a 403 problem is AccessDenied; pages are followed; a bad id is refused locally."""
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.method)
        if "visuals" in request.url.path:
            return httpx.Response(403, json=PROBLEM, headers={"content-type": "application/problem+json"})
        if "audit" in request.url.path:
            raise httpx.ConnectError("refused", request=request)
        if len(calls) == 1:
            return httpx.Response(503, json={"type": "urn:msm-mem:problem:store-error", "status": 503})
        offset = int(request.url.params.get("offset", "0"))
        return httpx.Response(200, json={"items": [], "total": 0, "offset": offset, "limit": 500, "next_offset": None})

    async def scenario() -> None:
        async with _async_client(handler) as c:
            assert await c.episodes("P1") == []
            assert calls == ["GET", "GET"]
            calls.clear()
            calls.append("-")  # the next answer is not the first: no 503
            with pytest.raises(AccessDenied, match="no"):
                await c.visuals("P1")
            with pytest.raises(BackendError):
                await c.verify_audit()
            with pytest.raises(InvalidInput):
                await c.episodes("..")
        calls.clear()
        async with _async_client(handler) as c:
            with pytest.raises(Exception, match="HTTP 503|store"):
                await c.consolidate("P1", "M-1", "answer")
        assert calls == ["POST"]

    asyncio.run(scenario())
    with pytest.raises(InvalidInput):
        AsyncMemoryClient("http://test", " ")

"""The app factory: one FastAPI app over one open store.

:func:`create_app` opens the store (``MsmMem.open``) and mounts the routes; the store is closed
when the app shuts down. Every request's body is bounded before it is parsed, every error is a
problem (:mod:`.problems`), and the access log names the route's template (never the patient
id of the path), the status, the caller's actor id and the request id.
"""

from __future__ import annotations

import gc
import json
import logging
import math
import threading
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

import anyio.to_thread
from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from ... import MsmMem, __version__
from ..._problems import slug
from ..._settings import Settings
from .config import ServeConfig
from .forms import form_schemas
from .problems import MEDIA_TYPE, install
from .routes import admin, care, consent, context, health, reads
from .state import ServerState
from .throttle import RateLimiter
from .ui import mount as mount_explorer

__all__ = ["configure_logging", "create_app", "create_app_from_env", "openapi_document", "openapi_schema"]

log = logging.getLogger("msm_mem.http")
access = logging.getLogger("msm_mem.http.access")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: room for the multipart framing and form fields around the largest image
_FORM_OVERHEAD = 256 * 1024


class _Guard:
    """Bounds every request body (413 past the limit, read before the app sees any of it) and
    the requests of each client address (429 past its rate, before anything is read), gives
    each request an id (``X-Request-Id``) and writes the access log line."""

    def __init__(self, app: ASGIApp, limit: int, per_address: RateLimiter | None = None) -> None:
        self.app = app
        self.limit = limit
        self.per_address = per_address

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = uuid.uuid4().hex[:16]
        scope.setdefault("state", {})["request_id"] = request_id
        start = time.perf_counter()
        status = [0]

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
                message.setdefault("headers", []).append((b"x-request-id", request_id.encode()))
            await send(message)

        try:
            client = scope.get("client")
            wait = self.per_address.take(str(client[0]) if client else "-") if self.per_address else 0.0
            if wait > 0:
                retry = str(max(1, math.ceil(wait)))
                await self._refuse(sending, 429, "too-many-requests", "too many requests from this address", retry)
                return
            if not _utf8_path(scope):
                await self._refuse(sending, 400, "malformed-request", "the URL path is not valid UTF-8")
                return
            body = await self._body(scope, receive)
            if body is None:
                await self._refuse(sending, 413, "payload-too-large", f"the body is over {self.limit} bytes")
                return
            chunks = [body]

            async def replay() -> Message:
                if chunks:
                    return {"type": "http.request", "body": chunks.pop(), "more_body": False}
                return await receive()

            await self.app(scope, replay, sending)
        finally:
            route = scope.get("route")
            state = scope.get("state", {})
            access.info(
                "%s %s %d %.1fms actor=%s request=%s",
                scope.get("method", "-"),
                getattr(route, "path", "-"),
                status[0],
                (time.perf_counter() - start) * 1000,
                state.get("actor", "-"),
                request_id,
            )

    async def _body(self, scope: Scope, receive: Receive) -> bytes | None:
        """The whole body, or None when it is over the limit (declared or sent)."""
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                if not value.isdigit() or int(value) > self.limit:
                    return None
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                return None
            parts.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(parts)

    async def _refuse(self, send: Send, status: int, slug_: str, detail: str, retry_after: str = "") -> None:
        """Answer the problem ``slug_`` before the app sees the request."""
        p = slug(slug_)
        body = json.dumps({"type": p.type, "title": p.title, "status": p.status, "detail": detail}).encode()
        headers = [(b"content-type", MEDIA_TYPE.encode()), (b"content-length", str(len(body)).encode())]
        if retry_after:
            headers.append((b"retry-after", retry_after.encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _utf8_path(scope: Scope) -> bool:
    """Whether the request's path, percent-escapes decoded, is UTF-8. The server decodes an
    invalid sequence to U+FFFD, so different byte strings would name one patient: such a path
    is refused before routing (the raw path is the one the client sent)."""
    raw = scope.get("raw_path")
    if not isinstance(raw, bytes):
        return True
    try:
        urllib.parse.unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def openapi_schema(app: FastAPI) -> dict[str, Any]:
    """The app's OpenAPI document, with every problem answer typed ``application/problem+json``
    and the bearer scheme declared."""
    if app.openapi_schema:
        return app.openapi_schema
    doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    doc.setdefault("components", {}).setdefault("schemas", {}).update(form_schemas())
    for path in doc.get("paths", {}).values():
        for op in path.values():
            for status, response in op.get("responses", {}).items():
                content = response.get("content", {})
                if status[:1] in ("4", "5") and "application/json" in content:
                    response["content"] = {MEDIA_TYPE: content["application/json"]}
    _form_bodies(doc)
    doc.setdefault("components", {})["securitySchemes"] = {
        "bearer": {"type": "http", "scheme": "bearer", "description": "an API key (msmk_...) or a JWT"}
    }
    doc["security"] = [{"bearer": []}]
    app.openapi_schema = doc
    return doc


def _form_bodies(doc: dict[str, Any]) -> None:
    """Say of each form body what the server takes: a form field is sent or left out, never
    null (the generated ``anyOf [X, null]`` becomes ``X``, so an image is a file part), and an
    upload takes exactly one of ``image`` and ``image_study``."""
    schemas = doc.get("components", {}).get("schemas", {})
    for path in doc.get("paths", {}).values():
        for op in path.values():
            content = op.get("requestBody", {}).get("content", {})
            ref = content.get("multipart/form-data", {}).get("schema", {}).get("$ref", "")
            body = schemas.get(ref.rsplit("/", 1)[-1])
            if body is None:
                continue
            for name, prop in body.get("properties", {}).items():
                options = prop.get("anyOf", [])
                kept = [o for o in options if o != {"type": "null"}]
                if len(options) == 2 and len(kept) == 1:
                    del prop["anyOf"]
                    body["properties"][name] = {**kept[0], **prop}
            if {"image", "image_study"} <= set(body.get("properties", {})):
                body["oneOf"] = [{"required": ["image"]}, {"required": ["image_study"]}]


def _app(lifespan: Callable[[FastAPI], Any] | None = None) -> FastAPI:
    app = FastAPI(
        title="msm-mem",
        version=__version__,
        description=(
            "A governed, multimodal memory for medical AI agents, as a service. Every call acts as "
            "the principal of its bearer credential; errors are RFC 9457 problem documents."
        ),
        lifespan=lifespan,
    )
    install(app)
    for module in (health, care, context, reads, consent, admin):
        app.include_router(module.router)
    mount_explorer(app)
    app.openapi = lambda: openapi_schema(app)  # type: ignore[method-assign]
    return app


def create_app(config: ServeConfig, *, mem: MsmMem | None = None) -> FastAPI:
    """The service over the store of ``config`` (or over ``mem``, already open: the app then
    leaves closing it to the caller)."""
    owned = mem is None
    if mem is None:
        mem = MsmMem.open(
            config.store,
            settings=Settings.from_env(),
            database_url=config.database_url,
            tenant=config.tenant,
            backbone=config.backbone.build(),
        )
    state = ServerState(config, mem, config.verifier(), threading.Lock(), config.throttle())

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # the pool that runs requests' blocking work (starlette's run_in_threadpool uses anyio's)
        anyio.to_thread.current_default_thread_limiter().total_tokens = config.max_threads
        yield
        if owned:
            with state.lock:
                state.mem.close()

    app = _app(lifespan)
    app.state.server = state
    app.add_middleware(_Guard, limit=config.max_upload_bytes + _FORM_OVERHEAD, per_address=state.throttle.per_address)
    return app


def openapi_document() -> dict[str, Any]:
    """The service's OpenAPI document, without a store (what ``docs/openapi.json`` holds)."""
    return openapi_schema(_app())


if __name__ == "__main__":  # python -m msm_mem.interfaces.http.app > docs/openapi.json
    print(json.dumps(openapi_document(), indent=2, sort_keys=True))


def configure_logging(level: str) -> None:
    """Log lines of the service (and uvicorn's own) to stderr at ``level``, once per process."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")


def create_app_from_env() -> FastAPI:
    """The app of a worker process: its settings from the environment the ``serve`` command set."""
    config = ServeConfig.from_env()
    configure_logging(config.log_level)
    app = create_app(config)
    # what the process holds by now (modules, the open store and its caches) lives as long as
    # it: frozen out of the collector's generations, the full collections that requests'
    # garbage triggers now and then no longer walk it
    gc.freeze()
    return app

"""The MCP server: the tools and resources on the SDK's ``MCPServer``, over stdio or streamable HTTP.

:class:`GovernedServer` adds two argument checks to the SDK's: a tool's unknown argument is
refused (a call cannot name a principal, any more than an HTTP body can), and an argument the
schema refuses is reported as the ``invalid-input`` problem by location and message only.

Over streamable HTTP the SDK's bearer middleware verifies every request's token
(:class:`~.identity.BearerVerifier`) before the MCP session sees it, and answers 401 otherwise;
a session belongs to the credential that opened it. ``/health`` needs no credential. The
request body is bounded (an image's base64 and some room); on a loopback address the SDK also
refuses requests whose Host or Origin header names another host (DNS rebinding).
"""

from __future__ import annotations

import logging
import math
from typing import Any, Literal

import anyio
import anyio.to_thread
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp_types import CallToolResult, InputRequiredResult
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ... import MsmMemError, __version__
from ..auth.credentials import Verifier
from . import context, reads, resources, tools
from .identity import BearerVerifier
from .problems import arguments_problem
from .state import McpState

__all__ = ["GovernedServer", "build_server", "run_http", "run_stdio"]

log = logging.getLogger("msm_mem.mcp")

INSTRUCTIONS = (
    "msm-mem: the governed memory of a medical AI agent. Every call acts as the principal of your "
    "credential, inside its patient scope; consent is checked and every access is audited. ask answers "
    "with the patient's memory and returns its evidence trail; context gives your own model the fused "
    "prompt and the image, and record_answer writes its answer back; retrieve returns the evidence only; "
    "observe and consolidate write short-term memory and move it to long-term memory; feedback "
    "supersedes an impression with a critic's verdict. Errors are RFC 9457 problem documents "
    "(type urn:msm-mem:problem:...)."
)

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]

#: room for the JSON-RPC framing and the other arguments around the largest image's base64
_BODY_OVERHEAD = 256 * 1024


class GovernedServer(MCPServer[Any]):
    """``MCPServer`` with msm-mem's argument checks (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._parameters: dict[str, frozenset[str]] | None = None

    async def _names(self, tool: str) -> frozenset[str] | None:
        if self._parameters is None:
            self._parameters = {
                t.name: frozenset((t.input_schema or {}).get("properties", {})) for t in await self.list_tools()
            }
        return self._parameters.get(tool)

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        known = await self._names(name)
        if known is not None and not set(arguments) <= known:
            return arguments_problem(name, unknown=sorted(set(arguments) - known))
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            if isinstance(exc.__cause__, ValidationError) and not isinstance(exc, UnexpectedToolError):
                log.info("tool %s refused its arguments", name)
                return arguments_problem(name, exc.__cause__.errors(include_input=False))
            raise


def build_server(
    state: McpState, *, verifier: Verifier | None = None, issuer_url: str = "", log_level: LogLevel = "INFO"
) -> GovernedServer:
    """The server over ``state``. With ``verifier`` it is the streamable HTTP server: every request's
    bearer token is verified by it (``issuer_url`` is only the SDK's name for whoever issues them)."""
    options: dict[str, Any] = {}
    if verifier is not None:
        options["token_verifier"] = BearerVerifier(verifier)
        options["auth"] = AuthSettings(issuer_url=issuer_url, resource_server_url=None)  # type: ignore[arg-type]
    server = GovernedServer(
        "msm-mem",
        title="msm-mem memory",
        version=__version__,
        instructions=INSTRUCTIONS,
        log_level=log_level,
        **options,
    )
    tools.register(server, state)
    context.register(server, state)
    reads.register(server, state)
    resources.register(server, state)
    return server


def run_stdio(state: McpState, *, log_level: str = "info") -> None:
    """Serve one client over stdin and stdout until it disconnects (logs go to stderr)."""
    anyio.run(build_server(state, log_level=_level(log_level)).run_stdio_async)


def _level(name: str) -> LogLevel:
    level = name.upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise ValueError(f"unknown log level {name!r}")
    return level  # type: ignore[return-value]


async def _health(_: Request) -> Response:
    return JSONResponse({"status": "ok"})


class _LoginGuard:
    """Failed logins over streamable HTTP, as `serve` treats them: each answer 401 to a request
    that presented a credential is audited (``MsmMem.refuse_login``) and counted against the
    client's address; an address with ``max_login_failures`` in the window is answered 429
    (with Retry-After) before its token is checked."""

    def __init__(self, app: Any, state: McpState) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("path") == "/health":
            await self.app(scope, receive, send)
            return
        logins = self.state.throttle.logins
        address = scope["client"][0] if scope.get("client") else "-"
        wait = logins.blocked(address)
        if wait > 0:
            answer = JSONResponse(
                {"type": "urn:msm-mem:problem:too-many-requests", "title": "too many failed logins from this address"},
                status_code=429,
                headers={"Retry-After": str(max(1, math.ceil(wait)))},
            )
            await answer(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        given = headers.get(b"authorization")
        kind = "none" if given is None else "api-key" if given.lower().startswith(b"bearer msmk_") else "other"

        async def sent(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start" and message["status"] == 401:
                logins.fail(address)  # counted and audited before the client hears the answer
                await anyio.to_thread.run_sync(self._audit, kind)
            await send(message)

        await self.app(scope, receive, sent)

    def _audit(self, credential: str) -> None:
        try:
            self.state.call(self.state.mem.refuse_login, credential)
        except MsmMemError as exc:  # the request is still answered 401
            log.warning("a failed login could not be audited (%s)", type(exc).__name__)


def run_http(
    state: McpState,
    verifier: Verifier,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    ssl_certfile: str | None = None,
    ssl_keyfile: str | None = None,
    log_level: str = "info",
) -> None:
    """Serve streamable HTTP at ``http://HOST:PORT/mcp`` (and ``/health``) until interrupted."""
    import uvicorn

    name = f"[{host}]" if ":" in host else host
    server = build_server(state, verifier=verifier, issuer_url=f"http://{name}:{port}", log_level=_level(log_level))
    server.custom_route("/health", methods=["GET"])(_health)
    app = server.streamable_http_app(
        streamable_http_path="/mcp",
        host=host,
        max_request_body_size=state.config.max_image_base64 + _BODY_OVERHEAD,
    )
    config = uvicorn.Config(
        _LoginGuard(app, state),
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        ssl_certfile=ssl_certfile,
        ssl_keyfile=ssl_keyfile,
    )
    uvicorn.Server(config).run()

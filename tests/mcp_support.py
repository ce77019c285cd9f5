"""Real ``msm-mem mcp`` processes for the MCP tests, driven by the SDK's own client: a streamable
HTTP server on a loopback port (started with ``python -m msm_mem mcp --transport http`` and
stopped by its own pid), and stdio servers the client spawns. The store and the keys are the
service tests' (:mod:`tests.http_support`)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult

from tests.helpers import raw_sql
from tests.http_support import JWT_AUDIENCE, JWT_ISSUER, JWT_SECRET, free_port, launch, make_keys, make_store, stop

SRC = Path(__file__).resolve().parents[1] / "src"

#: every tool the server offers
TOOLS = {
    "ask",
    "context",
    "record_answer",
    "retrieve",
    "observe",
    "consolidate",
    "feedback",
    "patient_state",
    "patient_history",
    "verify_audit",
    "whoami",
}


def server_args(root: Path, directory: Path) -> list[str]:
    """The options every test server runs with: images from ``root/images``, small limits, JWTs."""
    secret = root / "jwt.secret"
    secret.write_text(JWT_SECRET)
    return [
        str(directory),
        "--image-root",
        str(root / "images"),
        "--max-upload-mb",
        "1",
        "--max-image-side",
        "2048",
        "--jwt-key",
        str(secret),
        "--jwt-issuer",
        JWT_ISSUER,
        "--jwt-audience",
        JWT_AUDIENCE,
    ]


def environment(**extra: str) -> dict[str, str]:
    """The environment of a server process: this checkout's code first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MSM_MEM_")}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    return {**env, **extra}


@dataclass
class McpHttp:
    """A running streamable HTTP server: its endpoint, store, keys, log and process."""

    url: str
    directory: Path
    root: Path
    tokens: dict[str, str]
    log: Path
    process: subprocess.Popen[bytes]


def start_http(root: Path, directory: Path, tokens: dict[str, str]) -> McpHttp:
    """Start ``msm-mem mcp --transport http`` and wait (bounded) until /health answers."""
    port = free_port()
    log = root / "mcp-http.log"
    cmd = [sys.executable, "-m", "msm_mem", "mcp", *server_args(root, directory), "--transport", "http"]
    cmd += ["--port", str(port)]
    base = f"http://127.0.0.1:{port}"
    process = launch(cmd, log, environment(), base + "/health", "the MCP server")
    return McpHttp(base + "/mcp", directory, root, tokens, log, process)


@asynccontextmanager
async def http_client(url: str, token: str | None, mode: str = "auto") -> AsyncIterator[Client]:
    """The SDK's client on the streamable HTTP endpoint, sending ``token`` as its bearer credential
    (``mode="legacy"``: the handshake-era protocol, one stateful session)."""
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(headers=headers, timeout=60.0) as http:
        async with Client(streamable_http_client(url, http_client=http), mode=mode) as client:
            yield client


def stdio_parameters(root: Path, directory: Path, *args: str, **env: str) -> StdioServerParameters:
    """The SDK's parameters to spawn ``msm-mem mcp`` over stdio with ``args`` and ``env``."""
    cmd = ["-m", "msm_mem", "mcp", *server_args(root, directory), "--log-level", "warning", *args]
    return StdioServerParameters(command=sys.executable, args=cmd, env=environment(**env))


@asynccontextmanager
async def stdio_client(root: Path, directory: Path, *args: str, **env: str) -> AsyncIterator[Client]:
    """The SDK's client on a stdio server it spawns."""
    async with Client(stdio_parameters(root, directory, *args, **env), read_timeout_seconds=60.0) as client:
        yield client


def structured(result: CallToolResult) -> dict[str, Any]:
    """A tool result's structured content, checked to agree with its text."""
    assert result.structured_content is not None, result.content
    text = result.content[0]
    assert json.loads(getattr(text, "text", "")) == result.structured_content
    return result.structured_content


def ok(result: CallToolResult) -> dict[str, Any]:
    """The structured content of a successful call."""
    assert not result.is_error, result.content
    return structured(result)


def problem(result: CallToolResult) -> dict[str, Any]:
    """The problem document of a tool error."""
    assert result.is_error, result.content
    doc = structured(result)
    assert doc["type"].startswith("urn:msm-mem:problem:"), doc
    return doc


def png_base64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def counts(directory: Path) -> Mapping[str, int]:
    """How many rows the store holds, by table: nothing stored means none of these moved."""
    tables = ("audit", "stm", "episodic", "visual", "semantic", "claims")
    return {t: int(raw_sql(directory, f"SELECT count(*) FROM {t}")[0][0]) for t in tables}


# the servers of the conftest's fixtures (mcp_http, mcp_stdio_store) --------------------------


def http_server(root: Path, database_url: str | None = None, schema: str = "") -> Iterator[McpHttp]:
    """A store (on PostgreSQL with ``database_url``) with its keys and a streamable HTTP server
    over it, stopped when the generator ends."""
    directory = make_store(root) if database_url is None else make_store(root, database_url, schema)
    server = start_http(root, directory, make_keys(directory))
    try:
        yield server
    finally:
        stop(server)


def stdio_store(root: Path) -> tuple[Path, Path, dict[str, str]]:
    """A store of its own for the stdio servers: (root, store directory, keys)."""
    directory = make_store(root)
    return root, directory, make_keys(directory)


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    anyio.run(scenario)

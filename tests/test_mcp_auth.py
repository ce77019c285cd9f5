"""Credentials of ``msm-mem mcp``: a missing, malformed, unknown, revoked or expired bearer token
refused before any tool runs (and a key revoked while connected from its next call), JWTs, the
handshake-era protocol's sessions bound to their credential, and a stdio server that will not
start without a credential it accepts."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import httpx
import jwt
import pytest
from mcp.shared.exceptions import MCPError

from msm_mem import Principal
from msm_mem.interfaces.auth.apikeys import ApiKeyStore
from tests.http_support import JWT_AUDIENCE, JWT_ISSUER, JWT_SECRET, OTHER, OWN, events, free_port, head, launch
from tests.mcp_support import (
    McpHttp,
    environment,
    http_client,
    ok,
    problem,
    run,
    server_args,
)

pytestmark = pytest.mark.system


def _post(url: str, headers: dict[str, str]) -> httpx.Response:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    return httpx.post(url, json=body, headers={"Accept": "application/json, text/event-stream", **headers})


def test_a_missing_bad_revoked_or_expired_token_is_refused(mcp_http: McpHttp) -> None:
    """No token, a malformed, unknown or revoked key and an expired JWT are answered 401 before
    any tool runs; a valid JWT acts as its claims say; a key revoked while its client is
    connected is refused from the next call on."""
    now = int(time.time())
    claims = {"sub": "jwt-agent", "role": "agent", "purpose": "treatment", "patients": [OWN], "iss": JWT_ISSUER}
    claims["aud"] = JWT_AUDIENCE
    expired = jwt.encode({**claims, "exp": now - 60}, JWT_SECRET, algorithm="HS256")
    valid = jwt.encode({**claims, "exp": now + 600}, JWT_SECRET, algorithm="HS256")
    for headers in (
        {},
        {"Authorization": "Bearer msmk_0000000000000000_" + "x" * 43},
        {"Authorization": "Bearer nonsense"},
        {"Authorization": f"Bearer {mcp_http.tokens['revoked']}"},
        {"Authorization": f"Bearer {expired}"},
        {"Authorization": f"Basic {mcp_http.tokens['agent']}"},
    ):
        answer = _post(mcp_http.url, headers)
        assert answer.status_code == 401 and answer.headers["www-authenticate"].startswith("Bearer"), headers
    assert _post(mcp_http.url, {"Authorization": f"Bearer {mcp_http.tokens['agent']}"}).status_code != 401
    assert mcp_http.tokens["agent"] not in mcp_http.log.read_text()

    async def scenario() -> None:
        async def revoked() -> None:
            async with http_client(mcp_http.url, mcp_http.tokens["revoked"]) as client:
                await client.call_tool("whoami", {})

        await _refused(revoked)
        async with http_client(mcp_http.url, valid) as client:
            me = ok(await client.call_tool("whoami", {}))
            assert (me["id"], me["credential"]) == ("jwt-agent", "jwt")
        keys = ApiKeyStore.of_store(mcp_http.directory)
        token, record = keys.create(Principal("svc-brief", "agent", "treatment"), [OWN])

        async def revoked_while_connected() -> None:
            async with http_client(mcp_http.url, token) as client:
                assert ok(await client.call_tool("whoami", {}))["id"] == "svc-brief"
                keys.revoke(record.key_id)
                await client.call_tool("whoami", {})

        await _refused(revoked_while_connected)

    run(scenario)


def test_a_handshake_era_client_is_held_to_the_same_rules(mcp_http: McpHttp) -> None:
    """A client of the handshake-era protocol (one stateful session) acts as its key too, is
    refused another patient, and its session cannot be used with another credential (the SDK
    answers as if the session did not exist)."""

    async def scenario() -> None:
        async with http_client(mcp_http.url, mcp_http.tokens["agent"], mode="legacy") as agent:
            assert agent.protocol_version < "2026"
            assert ok(await agent.call_tool("whoami", {}))["id"] == "svc-agent"
            before = head(mcp_http.directory)
            doc = problem(await agent.call_tool("patient_state", {"patient_id": OTHER}))
            assert doc["type"] == "urn:msm-mem:problem:access-denied"
            assert [(e["outcome"], e["actor"]) for e in events(mcp_http.directory, before)] == [("denied", "svc-agent")]

    run(scenario)
    accept = {"Accept": "application/json, text/event-stream"}
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    agent = {**accept, "Authorization": f"Bearer {mcp_http.tokens['agent']}"}
    opened = httpx.post(mcp_http.url, json=init, headers=agent)
    session = opened.headers["mcp-session-id"]
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "whoami", "arguments": {}}}
    stolen = {**accept, "Authorization": f"Bearer {mcp_http.tokens['everyone']}", "Mcp-Session-Id": session}
    stolen["Mcp-Protocol-Version"] = "2025-11-25"
    assert httpx.post(mcp_http.url, json=call, headers=stolen).status_code == 404
    own = {**stolen, "Authorization": f"Bearer {mcp_http.tokens['agent']}"}
    assert httpx.post(mcp_http.url, json=call, headers=own).status_code == 200  # the session itself is live


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


async def _refused(call: Callable[[], Awaitable[None]]) -> MCPError:
    """The server's error that ``call`` ends with (the SDK raises it inside exception groups)."""
    try:
        await call()
    except BaseException as exc:  # the groups the SDK's task groups raise
        errors = [e for e in _leaves(exc) if isinstance(e, MCPError)]
        assert errors, list(_leaves(exc))
        return errors[0]
    raise AssertionError("the call was not refused")


def test_a_stdio_server_starts_only_with_a_credential(mcp_stdio_store: tuple[Path, Path, dict[str, str]]) -> None:
    """A refused MSM_MEM_API_KEY, or no key and no --patients, stops the stdio server at start
    with one error line (exit 1); a key together with identity flags is refused too."""
    root, directory, tokens = mcp_stdio_store
    cases = [
        ({"MSM_MEM_API_KEY": tokens["revoked"]}, [], "MSM_MEM_API_KEY is refused"),
        ({"MSM_MEM_API_KEY": "msmk_nonsense"}, [], "MSM_MEM_API_KEY is refused"),
        ({}, [], "stdio needs a credential"),
        ({"MSM_MEM_API_KEY": tokens["agent"]}, ["--patients", "*"], "drop --actor"),
    ]
    for env, extra, message in cases:
        cmd = [sys.executable, "-m", "msm_mem", "mcp", *server_args(root, directory), *extra]
        done = subprocess.run(
            cmd, env=environment(**env), capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL
        )
        assert done.returncode == 1, (env, done.stderr)
        assert done.stderr.startswith("error: ") and message in done.stderr, done.stderr
        assert tokens["revoked"] not in done.stderr and done.stdout == ""


def test_failed_logins_are_audited_and_throttled_per_address(mcp_http: McpHttp) -> None:
    """A second server on the store allowing 3 failed logins a minute: three wrong keys are
    answered 401 and each is audited as a refused login; the fourth request from the address,
    even with a valid key, is answered 429 with Retry-After before any token is checked."""
    port = free_port()
    log = mcp_http.root / "mcp-login.log"
    cmd = [sys.executable, "-m", "msm_mem", "mcp", *server_args(mcp_http.root, mcp_http.directory)]
    cmd += ["--transport", "http", "--port", str(port), "--max-login-failures", "3"]
    base = f"http://127.0.0.1:{port}"
    process = launch(cmd, log, environment(), base + "/health", "the MCP server")
    try:
        before = head(mcp_http.directory)
        for i in range(3):
            answer = _post(base + "/mcp", {"Authorization": f"Bearer msmk_{i:016x}_" + "x" * 43})
            assert answer.status_code == 401
        refused = [e for e in events(mcp_http.directory, before) if e["action"] == "authenticate"]
        assert len(refused) == 3 and all(e["outcome"] == "denied" for e in refused), refused
        answer = _post(base + "/mcp", {"Authorization": f"Bearer {mcp_http.tokens['agent']}"})
        assert answer.status_code == 429 and int(answer.headers["retry-after"]) >= 1
    finally:
        process.terminate()
        process.wait(timeout=30)

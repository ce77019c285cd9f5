"""``msm-mem mcp`` as real processes, driven by the official SDK's client: the streamable HTTP
server on a loopback port (over the embedded store and over a PostgreSQL server the tests
start) and stdio servers the client spawns. Each tool and resource for an allowed principal;
another patient's data refused by every tool and resource, with the denial audited; the role
table and consent still deciding inside the scope. Credentials: test_mcp_auth.py; bad input:
test_mcp_inputs.py."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.helpers import png
from tests.http_support import OTHER, OWN, QUESTION, events, head
from tests.mcp_support import (
    TOOLS,
    McpHttp,
    counts,
    http_client,
    ok,
    png_base64,
    problem,
    run,
    stdio_client,
    stdio_parameters,
)

pytestmark = pytest.mark.system


async def _every_tool(client: Client, images: Path, *, critic: Client | None, auditor: Client | None) -> None:
    """Each tool and resource once, as the agent (and the critic and auditor where given)."""
    listed = await client.list_tools()
    assert {t.name for t in listed.tools} == TOOLS
    assert all(t.output_schema for t in listed.tools)
    templates = {t.uri_template for t in (await client.list_resource_templates()).resource_templates}
    assert templates == {
        "msm-mem://patients/{patient_id}/timeline",
        "msm-mem://patients/{patient_id}/claims/{key}/chain",
    }
    me = ok(await client.call_tool("whoami", {}))
    assert (me["id"], me["role"], me["patients"]) == ("svc-agent", "agent", [OWN])

    by_bytes = ok(
        await client.call_tool(
            "ask",
            {"patient_id": OWN, "question": QUESTION, "image_base64": png_base64(png(images, 31)), "study_id": "S-mcp"},
        )
    )
    assert by_bytes["answer"] and by_bytes["evidence"] and by_bytes["gate"] is not None
    assert {"id", "kind", "score", "cosine", "confidence", "freshness", "tier_weight"} <= set(by_bytes["evidence"][0])
    by_path = ok(
        await client.call_tool(
            "ask", {"patient_id": OWN, "question": QUESTION, "image_path": str(png(images, 32)), "write_back": False}
        )
    )
    assert by_path["gate"] is None and by_path["evidence"]
    by_study = ok(await client.call_tool("ask", {"patient_id": OWN, "question": QUESTION, "image_study": "S0"}))
    assert by_study["evidence"]

    found = ok(await client.call_tool("retrieve", {"patient_id": OWN, "image_path": "img1.png", "k": 2}))
    assert found["patient_id"] == OWN and 0 < len(found["items"]) <= 2
    item = ok(
        await client.call_tool(
            "observe", {"patient_id": OWN, "question": "Any change?", "image_base64": png_base64(png(images, 33))}
        )
    )
    assert item["state"] == "active" and item["expires_at"] > item["created_at"]
    written = ok(
        await client.call_tool(
            "consolidate",
            {"patient_id": OWN, "item_id": item["item_id"], "answer": "Stable right lower lobe consolidation noted."},
        )
    )
    assert written["gate"]["reasons"]

    state = ok(await client.call_tool("patient_state", {"patient_id": OWN}))
    assert state["items"] and {s["patient_id"] for s in state["items"]} == {OWN}
    history = ok(await client.call_tool("patient_history", {"patient_id": OWN, "limit": 2}))
    assert len(history["items"]) == 2 and history["total"] > 2 and history["next_offset"] == 2

    if critic is not None:
        claim = ok(
            await critic.call_tool(
                "feedback", {"patient_id": OWN, "study_id": "S0", "accept": False, "correction": "Left basal effusion."}
            )
        )
        assert claim["content"] == "Left basal effusion." and claim["evidence_tier"] != "agent"
        chain = await client.read_resource(f"msm-mem://patients/{OWN}/claims/{claim['key']}/chain")
        doc = json.loads(chain.contents[0].text)  # type: ignore[union-attr]
        assert doc["key"] == claim["key"] and doc["key"].startswith("study:S0|q:") and len(doc["chain"]) >= 2
        assert doc["chain"][-1]["content"] == "Left basal effusion." and doc["chain"][-1]["state"] == "active"
        assert doc["chain"][-1]["supersedes"] == doc["chain"][-2]["claim_id"]
        assert doc["chain"][-2]["state"] == "superseded"

    timeline = await client.read_resource(f"msm-mem://patients/{OWN}/timeline")
    assert timeline.contents[0].mime_type == "application/json"
    doc = json.loads(timeline.contents[0].text)  # type: ignore[union-attr]
    assert doc["patient_id"] == OWN and {e["patient_id"] for e in doc["studies"]} == {OWN}
    assert {"S0", "S1", "S2", "S-mcp"} <= {e["study_id"] for e in doc["studies"]}
    assert doc["stm"] and all(i["expires_at"] > 0 for i in doc["stm"])
    times = [e["time"] for e in doc["events"]]
    assert times == sorted(times) and {e["kind"] for e in doc["events"]} >= {"study", "semantic", "claim", "stm"}

    if auditor is not None:
        verified = ok(await auditor.call_tool("verify_audit", {}))
        assert verified["ok"] and verified["count"] > 0 and verified["first_bad_seq"] is None


def test_each_tool_and_resource_works_over_http(mcp_http: McpHttp) -> None:
    """Every tool and both resources, through the SDK's client on streamable HTTP, each call
    audited as the key's principal."""
    before = head(mcp_http.directory)

    async def scenario() -> None:
        async with (
            http_client(mcp_http.url, mcp_http.tokens["agent"]) as agent,
            http_client(mcp_http.url, mcp_http.tokens["critic"]) as critic,
            http_client(mcp_http.url, mcp_http.tokens["auditor"]) as auditor,
        ):
            await _every_tool(agent, mcp_http.root / "images", critic=critic, auditor=auditor)

    run(scenario)
    actors = {e["actor"] for e in events(mcp_http.directory, before)}
    assert {"svc-agent", "svc-critic"} <= actors  # verifying the chain writes nothing


def test_each_tool_and_resource_works_over_stdio(mcp_stdio_store: tuple[Path, Path, dict[str, str]]) -> None:
    """The same over stdio: one spawned server per credential (MSM_MEM_API_KEY)."""
    root, directory, tokens = mcp_stdio_store
    before = head(directory)

    async def scenario() -> None:
        async with (
            stdio_client(root, directory, MSM_MEM_API_KEY=tokens["agent"]) as agent,
            stdio_client(root, directory, MSM_MEM_API_KEY=tokens["critic"]) as critic,
            stdio_client(root, directory, MSM_MEM_API_KEY=tokens["auditor"]) as auditor,
        ):
            await _every_tool(agent, root / "images", critic=critic, auditor=auditor)

    run(scenario)
    assert {"svc-agent", "svc-critic"} <= {e["actor"] for e in events(directory, before)}


async def _denials(client: Client, directory: Path, images: Path, actor: str) -> None:
    """Another patient's data is refused by every tool and resource, audited, nothing of theirs written."""
    calls: list[tuple[str, dict[str, Any]]] = [
        ("ask", {"patient_id": OTHER, "question": QUESTION, "image_base64": png_base64(png(images, 41))}),
        ("ask", {"patient_id": OTHER, "question": QUESTION, "image_study": "S3"}),
        ("retrieve", {"patient_id": OTHER, "image_study": "S3"}),
        ("observe", {"patient_id": OTHER, "question": QUESTION, "image_base64": png_base64(png(images, 42))}),
        ("consolidate", {"patient_id": OTHER, "item_id": "M-x", "answer": "Right lower lobe consolidation."}),
        ("feedback", {"patient_id": OTHER, "study_id": "S3", "accept": True}),
        ("patient_state", {"patient_id": OTHER}),
        ("patient_history", {"patient_id": OTHER}),
    ]
    for tool, arguments in calls:
        before, stored = head(directory), counts(directory)
        doc = problem(await client.call_tool(tool, arguments))
        assert doc["type"] == "urn:msm-mem:problem:access-denied" and doc["status"] == 403, (tool, doc)
        assert OTHER not in json.dumps(doc), (tool, doc)
        new = events(directory, before)
        assert [(e["outcome"], e["actor"]) for e in new] == [("denied", actor)], (tool, new)
        after = counts(directory)
        assert {**after, "audit": 0} == {**stored, "audit": 0}, tool
    for uri in (f"msm-mem://patients/{OTHER}/timeline", f"msm-mem://patients/{OTHER}/claims/study:S3/chain"):
        before = head(directory)
        with pytest.raises(MCPError) as refused:
            await client.read_resource(uri)
        assert refused.value.data["type"] == "urn:msm-mem:problem:access-denied", refused.value.data
        assert OTHER not in json.dumps(refused.value.data) and OTHER not in refused.value.message
        assert [(e["outcome"], e["actor"]) for e in events(directory, before)] == [("denied", actor)]


def test_another_patients_data_is_refused_and_audited_over_http(mcp_http: McpHttp) -> None:
    """A key scoped to one patient reads and writes nothing of another's, and each refusal is in
    the audit trail with the key's actor."""

    async def scenario() -> None:
        async with http_client(mcp_http.url, mcp_http.tokens["agent"]) as agent:
            await _denials(agent, mcp_http.directory, mcp_http.root / "images", "svc-agent")

    run(scenario)


def test_another_patients_data_is_refused_and_audited_over_stdio(
    mcp_stdio_store: tuple[Path, Path, dict[str, str]],
) -> None:
    """The same over stdio, for an API key and for the configured identity with --patients."""
    root, directory, tokens = mcp_stdio_store

    async def scenario() -> None:
        async with stdio_client(root, directory, MSM_MEM_API_KEY=tokens["agent"]) as agent:
            await _denials(agent, directory, root / "images", "svc-agent")
        configured = {"MSM_MEM_ACTOR": "cfg-agent", "MSM_MEM_ROLE": "agent"}
        async with stdio_client(root, directory, "--patients", OWN, **configured) as agent:
            me = ok(await agent.call_tool("whoami", {}))
            assert (me["id"], me["credential"], me["patients"]) == ("cfg-agent", "configured", [OWN])
            assert ok(await agent.call_tool("patient_state", {"patient_id": OWN}))["items"]
            await _denials(agent, directory, root / "images", "cfg-agent")

    run(scenario)


def test_roles_and_consent_are_checked_and_audited(mcp_http: McpHttp) -> None:
    """Inside the scope, the role table and consent still decide: an auditor cannot ask, a critic
    cannot verify the audit chain, an agent acting for research has no consent; each refusal is
    audited and answered with its own problem type."""

    async def scenario() -> None:
        image = png_base64(png(mcp_http.root / "images", 51))
        cases = [
            ("auditor", "ask", {"patient_id": OWN, "question": QUESTION, "image_base64": image}, "access-denied"),
            ("critic", "verify_audit", {}, "access-denied"),
            ("researcher", "ask", {"patient_id": OWN, "question": QUESTION, "image_base64": image}, "consent-denied"),
        ]
        for key, tool, arguments, kind in cases:
            before = head(mcp_http.directory)
            async with http_client(mcp_http.url, mcp_http.tokens[key]) as client:
                doc = problem(await client.call_tool(tool, arguments))
            assert doc["type"] == f"urn:msm-mem:problem:{kind}" and doc["status"] == 403, (key, doc)
            assert any(e["outcome"] == "denied" for e in events(mcp_http.directory, before)), key

    run(scenario)


def test_a_stdio_client_that_leaves_ends_the_server_quietly(mcp_stdio_store: tuple[Path, Path, dict[str, str]]) -> None:
    """A stdio client that sends a request and leaves (closing both pipes, its reply unread)
    ends the server with nothing on stderr: no "Broken pipe" error and no traceback."""
    root, directory, tokens = mcp_stdio_store
    params = stdio_parameters(root, directory, MSM_MEM_API_KEY=tokens["agent"])
    hello = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    with subprocess.Popen(
        [params.command, *params.args],
        env=params.env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # the client reads nothing
        proc.stdin.write((json.dumps(hello) + "\n").encode())
        proc.stdin.flush()
        time.sleep(3)  # the server starts and writes its reply into the closed pipe
        proc.stdin.close()  # then the client is gone
        err = proc.stderr.read()
        code = proc.wait(timeout=60)
    assert err == b"" and code in (0, 141)

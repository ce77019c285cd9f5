"""The model behind the service and the MCP server: ``msm-mem serve`` and ``msm-mem mcp`` with
``--backbone openai`` over a model server process on loopback (the shipped fake), checked at
start, per request, and through the context / record_answer operations."""

from __future__ import annotations

import base64
import io
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from msm_mem import BackendUnavailable, MemoryClient, ModelRef
from tests.chat_process import ChatProcess, chat_process, image_sent, prompt_sent
from tests.helpers import png
from tests.http_support import (
    OWN,
    QUESTION,
    events,
    free_port,
    head,
    make_keys,
    make_store,
    start,
    stop_process,
)
from tests.mcp_support import counts, environment, ok, png_base64, problem, run, stdio_client

pytestmark = pytest.mark.system

KEY = "sk-test-model-server-key"


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)


def _backbone(server: ChatProcess, *more: str) -> list[str]:
    flags = ["--backbone", "openai", "--backbone-option", f"base_url={server.base_url}"]
    return [*flags, "--backbone-option", "model=llava-test", "--backbone-option", "retries=0", *more]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path


def test_serve_refuses_to_start_without_its_model_server(root: Path) -> None:
    """An unreachable model server, an unknown option or a key on the command line stop the
    start with one error line naming the problem; the service never listens."""
    directory = make_store(root)
    with chat_process(root / "chat") as server:
        url = server.base_url
    cases = [
        (_backbone(server), f"the model server at {url} is unreachable"),
        (
            _backbone(server, "--backbone-option", "temprature=0"),
            "backbone 'openai' has no option 'temprature'; it takes base_url",
        ),
        (_backbone(server, "--backbone-option", "api_key=sk-1"), "set MSM_MEM_BACKBONE_API_KEY"),
        (["--backbone", "gpt-4"], "unknown backbone 'gpt-4'"),
    ]
    for flags, message in cases:
        cmd = [sys.executable, "-m", "msm_mem", "serve", str(directory), "--port", str(free_port()), *flags]
        done = subprocess.run(cmd, capture_output=True, text=True, env=environment(), timeout=120)
        assert done.returncode == 1, done.stderr
        assert message in done.stderr, done.stderr
        assert "sk-1" not in done.stderr


@pytest.fixture
def served(root: Path) -> Iterator[tuple[str, Path, dict[str, str], ChatProcess]]:
    """``msm-mem serve --backbone openai`` over a model server process, its key in the environment."""
    directory = make_store(root)
    script = ["Right lower lobe consolidation, stable [see memory]."] * 3
    with chat_process(root / "chat", script) as server:
        served = start(root, directory, extra=_backbone(server), env={"MSM_MEM_BACKBONE_API_KEY": KEY})
        try:
            yield served.url, directory, served.tokens, server
        finally:
            stop_process(served.process)


def test_the_service_answers_with_its_model_and_says_503_without_it(
    served: tuple[str, Path, dict[str, str], ChatProcess], root: Path
) -> None:
    """ask is answered by the model server (the fused prompt, the image as a PNG data URL, the
    key from the environment as the bearer); context and record_answer go through the client;
    once the model server is gone, ask is a 503 problem and nothing is written."""
    url, directory, tokens, server = served
    image = png(root / "images", 50)  # a new study: novel for the write-back gate
    with MemoryClient(url, tokens["agent"], retries=0) as client:
        answer = client.ask(OWN, str(image), QUESTION, write_back=False)
        sent = server.requests()
        assert answer.model == ModelRef("openai", "fake-model") and answer.backbone == "openai"
        assert prompt_sent(sent[-1]) == answer.prompt
        assert image_sent(sent[-1]).startswith("data:image/png;base64,")
        assert {r["headers"].get("authorization") for r in sent} == {f"Bearer {KEY}"}

        ctx = client.context(OWN, str(image), QUESTION)
        assert ctx.prompt == answer.prompt and ctx.included
        assert ctx.image is not None and ctx.image.shape == (64, 64)
        done = client.record_answer(
            OWN,
            ctx.context_id,
            "Right lower lobe consolidation, resolving.",
            model=ModelRef("vllm", "llava-med-7b", "1.5"),
            evidence=ctx.included[:1],
        )
        assert done.gate.written and done.model.audit_id == "model:vllm/llava-med-7b@1.5"
        answered = [e for e in events(directory) if e["action"] == "answer"]
        assert [e["record_ids"][1] for e in answered] == ["model:openai/fake-model", "model:vllm/llava-med-7b@1.5"]

        server.stop()
        before, seq = counts(directory), head(directory)
        with pytest.raises(BackendUnavailable, match="connection error"):
            client.ask(OWN, str(image), QUESTION)
        raw = httpx.post(
            f"{url}/v1/patients/{OWN}/ask",
            headers={"Authorization": f"Bearer {tokens['agent']}"},
            data={"question": QUESTION, "image_study": "S0"},
        )
        assert raw.status_code == 503, raw.text
        assert raw.json()["type"] == "urn:msm-mem:problem:backend-unavailable"
        after = counts(directory)
        assert {**after, "audit": 0} == {**before, "audit": 0}
        assert {e["action"] for e in events(directory, seq)} <= {"consent", "read", "turn"}
    log = (root / "server.log").read_text()
    assert KEY not in log and QUESTION not in log and "base64" not in log


def test_mcp_context_is_ready_for_a_models_conversation(root: Path) -> None:
    """Over MCP, context gives the prompt with its evidence ids as text and the image as image
    content; record_answer writes the answer back naming the model in the audit trail."""
    directory = make_store(root)
    tokens = make_keys(directory)
    image = png_base64(png(root / "images", 51))  # a new study: novel for the write-back gate

    async def scenario() -> None:
        async with stdio_client(root, directory, MSM_MEM_API_KEY=tokens["agent"]) as agent:
            result = await agent.call_tool("context", {"patient_id": OWN, "question": QUESTION, "image_base64": image})
            assert not result.is_error, result.content
            text, picture = result.content[0], result.content[1]
            assert text.type == "text" and picture.type == "image"
            assert picture.mime_type == "image/png"  # type: ignore[union-attr]
            with Image.open(io.BytesIO(base64.b64decode(picture.data))) as png:  # type: ignore[union-attr]
                assert png.format == "PNG" and png.size == (64, 64)
            doc = result.structured_content
            assert doc is not None and "image" not in doc
            assert text.text.startswith(doc["prompt"])  # type: ignore[union-attr]
            assert all(i in text.text for i in doc["included"])  # type: ignore[union-attr]
            written = ok(
                await agent.call_tool(
                    "record_answer",
                    {
                        "patient_id": OWN,
                        "context_id": doc["context_id"],
                        "answer": "Right lower lobe consolidation, resolving.",
                        "backbone": "ollama",
                        "model": "llava:13b",
                        "evidence": doc["included"][:1],
                    },
                )
            )
            assert written["gate"]["written"] and written["model"] == {
                "backbone": "ollama",
                "model": "llava:13b",
                "version": "",
            }

    seq = head(directory)
    run(scenario)
    answered = [e for e in events(directory, seq) if e["action"] == "answer"]
    assert len(answered) == 1 and answered[0]["record_ids"][1] == "model:ollama/llava:13b"
    assert answered[0]["actor"] == "svc-agent"


def test_mcp_answers_with_its_model_and_refuses_without_it(root: Path) -> None:
    """msm-mem mcp --backbone openai: ask is answered by the model server process; once it is
    gone, ask is a tool error with the 503 problem and nothing is written; a server that is
    down at start stops the MCP server with one error line."""
    directory = make_store(root)
    tokens = make_keys(directory)
    image = png_base64(png(root / "images", 52))

    with chat_process(root / "chat", ["Right lower lobe consolidation, stable."]) as server:
        flags = _backbone(server)

        async def scenario() -> None:
            async with stdio_client(root, directory, *flags, MSM_MEM_API_KEY=tokens["agent"]) as agent:
                args = {"patient_id": OWN, "question": QUESTION, "image_base64": image, "write_back": False}
                answer = ok(await agent.call_tool("ask", args))
                assert answer["model"] == {"backbone": "openai", "model": "fake-model", "version": ""}
                server.stop()
                before = counts(directory)
                doc = problem(await agent.call_tool("ask", args))
                assert (doc["type"], doc["status"]) == ("urn:msm-mem:problem:backend-unavailable", 503)
                assert {**counts(directory), "audit": 0} == {**before, "audit": 0}

        run(scenario)
    cmd = [sys.executable, "-m", "msm_mem", "mcp", str(directory), *flags]
    done = subprocess.run(
        cmd, capture_output=True, text=True, env=environment(MSM_MEM_API_KEY=tokens["agent"]), timeout=120
    )
    assert done.returncode == 1 and "is unreachable" in done.stderr, done.stderr


def test_the_context_routes_check_roles_and_input(served: tuple[str, Path, dict[str, str], ChatProcess]) -> None:
    """A critic is refused a context (403, audited); a recorded answer with an unknown evidence
    id or a malformed model is a 422 problem naming it, with nothing written."""
    url, directory, tokens, _ = served

    def post(role: str, path: str, **kwargs: Any) -> httpx.Response:
        auth = {"Authorization": f"Bearer {tokens[role]}"}
        return httpx.post(f"{url}/v1/patients/{OWN}/{path}", headers=auth, **kwargs)

    seq = head(directory)
    refused = post("critic", "context", data={"question": QUESTION, "image_study": "S0"})
    assert refused.status_code == 403 and refused.json()["type"] == "urn:msm-mem:problem:access-denied"
    assert [(e["action"], e["outcome"]) for e in events(directory, seq)] == [("context", "denied")]
    ctx = post("agent", "context", data={"question": QUESTION, "image_study": "S1", "include_image": "true"})
    assert ctx.status_code == 201, ctx.text
    doc = ctx.json()
    assert doc["image"].startswith("data:image/png;base64,") and doc["context_id"].startswith("M-")
    answer = f"context/{doc['context_id']}/answer"
    good = {"answer": "Right lower lobe consolidation, resolving.", "model": {"backbone": "vllm"}}
    for body, message in [
        ({**good, "evidence": ["E-nowhere"]}, "names no record"),
        ({**good, "model": {"backbone": "v llm"}}, "model backbone"),
        ({**good, "model": {"backbone": "vllm", "weights": "x"}}, "weights"),
        ({**good, "answer": "Effusion \u202e"}, "U+202E"),
    ]:
        before = counts(directory)
        bad = post("agent", answer, json=body)
        assert bad.status_code == 422 and message in bad.text, bad.text
        assert {**counts(directory), "audit": 0} == {**before, "audit": 0}
    done = post("agent", answer, json={**good, "evidence": doc["included"][:1], "outcome": "follow up in 6 weeks"})
    assert done.status_code == 200 and done.json()["model"] == {"backbone": "vllm", "model": "", "version": ""}

"""Tests of the OpenAI-compatible HTTP backbone against a real local server (the shipped fake)."""

from __future__ import annotations

import base64
import io
import json
import logging
import socket
from collections.abc import Iterator

import numpy as np
import pytest
from PIL import Image

from msm_mem._errors import BackendError, InvalidInput
from msm_mem.plugins.backbones import Backbone, BackboneRequest, Candidate, get_backbone
from msm_mem.plugins.backbones.openai_http import (
    DEFAULT_SYSTEM_PROMPT,
    OpenAICompatibleBackbone,
    cited_ids,
    image_data_url,
)
from msm_mem.testing import FakeChatServer, FakeReply, completion

E_ID, V_ID, S_ID = "E-4f1c2a", "V-9b0e77", "S-0d3e21"
PROMPT = (
    "## Patient history (semantic memory)\n"
    f"[{S_ID}] impression:\n  [2024-01-02] right lower lobe consolidation\n"
    "## Similar prior encounters (episodic memory)\n"
    f"[{E_ID}] cos=0.912 | 2024-01-02 | Q: findings? | A: right lower lobe consolidation\n"
    "## Similar prior images (visual memory)\n"
    f"[{V_ID}] cos=0.880 | 2024-01-02\n"
    "## Current question\nWhat has changed since the last study?"
)


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Requests to 127.0.0.1 must not go through a proxy configured in the environment."""
    for name in (
        "http_proxy",
        "HTTP_PROXY",
        "https_proxy",
        "HTTPS_PROXY",
        "all_proxy",
        "ALL_PROXY",
    ):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def server() -> Iterator[FakeChatServer]:
    """A running fake chat-completions server with an empty script."""
    with FakeChatServer() as srv:
        yield srv


class Sleeps:
    """Records requested backoff waits instead of sleeping (no wall-clock waits in tests)."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def _image() -> np.ndarray:
    return np.linspace(0.0, 1.0, 12 * 16, dtype=np.float32).reshape(12, 16)


def _request(image: bool = True) -> BackboneRequest:
    cand = Candidate(E_ID, "episodic", "right lower lobe consolidation", "", 0.9, 0.0)
    return BackboneRequest(PROMPT, "What has changed?", (cand,), image=_image() if image else None)


def _backbone(srv: FakeChatServer, **kw: object) -> tuple[OpenAICompatibleBackbone, Sleeps]:
    sleeps = Sleeps()
    options: dict[str, object] = {"timeout_s": 5.0, "sleep": sleeps, **kw}
    return OpenAICompatibleBackbone(srv.base_url, "fake-vlm", **options), sleeps  # type: ignore[arg-type]


def test_success_parses_content_and_cited_ids(server: FakeChatServer) -> None:
    """A 200 reply's content is the answer; ids from the prompt it mentions become `cited`."""
    server.push(f"Consolidation has resolved [{E_ID}], compare [{V_ID}] and [E-invented].")
    backbone, sleeps = _backbone(server)
    assert isinstance(backbone, Backbone) and backbone.name == "openai"
    reply = backbone.generate(_request())
    assert reply.answer.startswith("Consolidation has resolved")
    assert reply.cited == (E_ID, V_ID)
    assert reply.source == "openai:fake-vlm" and reply.decision == "" and reply.confidence == 0.0
    assert len(server.requests) == 1 and sleeps.waits == []


def test_request_body_carries_prompt_and_image_data_url(server: FakeChatServer) -> None:
    """The user message has the prompt as a text part and the image as a PNG data URL."""
    server.push("ok")
    backbone, _ = _backbone(server, api_key="sk-test", max_tokens=77, temperature=0.3)
    backbone.generate(_request())
    (req,) = server.requests
    assert req.method == "POST" and req.path == "/v1/chat/completions"
    assert req.headers["authorization"] == "Bearer sk-test"
    assert req.headers["content-type"] == "application/json"
    body = req.json
    assert (body["model"], body["max_tokens"], body["temperature"]) == ("fake-vlm", 77, 0.3)
    system, user = body["messages"]
    assert system == {"role": "system", "content": DEFAULT_SYSTEM_PROMPT}
    text, image = user["content"]
    assert user["role"] == "user" and text == {"type": "text", "text": PROMPT}
    url = image["image_url"]["url"]
    assert image["type"] == "image_url" and url.startswith("data:image/png;base64,")
    png = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
    expected = np.rint(_image() * 255).astype(np.uint8)
    assert png.format == "PNG" and png.mode == "L"
    assert np.array_equal(np.asarray(png), expected)


def test_without_image_the_content_is_plain_text(server: FakeChatServer) -> None:
    """No image: the user content is the prompt string; no system message when it is empty."""
    server.push("ok")
    backbone, _ = _backbone(server, system_prompt="")
    backbone.generate(_request(image=False))
    assert server.requests[0].json["messages"] == [{"role": "user", "content": PROMPT}]
    assert "authorization" not in server.requests[0].headers


def test_500_then_success_is_retried_with_backoff(server: FakeChatServer) -> None:
    """A 500 then a 503 are retried (waits backoff, 2x backoff); the third reply wins."""
    server.push(FakeReply(500, "boom"), FakeReply(503, "busy"), "fine now")
    backbone, sleeps = _backbone(server, retries=2, backoff_s=0.25)
    assert backbone.generate(_request()).answer == "fine now"
    assert len(server.requests) == 3 and sleeps.waits == [0.25, 0.5]


def test_429_honours_retry_after_capped(server: FakeChatServer) -> None:
    """A 429 is retried after the server's Retry-After seconds, capped at 30 s."""
    server.push(
        FakeReply(429, "slow down", headers={"Retry-After": "3"}),
        FakeReply(429, "slow down", headers={"Retry-After": "9999"}),
        "ok",
    )
    backbone, sleeps = _backbone(server, retries=2, backoff_s=0.1)
    assert backbone.generate(_request()).answer == "ok"
    assert sleeps.waits == [3.0, 30.0]


def test_400_is_not_retried(server: FakeChatServer) -> None:
    """A 4xx other than 429 fails at once with the status and a body excerpt."""
    server.push(FakeReply(400, {"error": {"message": "image too large"}}), "never sent")
    backbone, sleeps = _backbone(server, retries=3)
    with pytest.raises(BackendError, match=r"HTTP 400.*image too large.*not retried"):
        backbone.generate(_request())
    assert len(server.requests) == 1 and sleeps.waits == []


def test_persistent_5xx_gives_up_after_all_attempts(server: FakeChatServer) -> None:
    """A server that keeps failing is tried retries+1 times; the error says so, excerpt cut."""
    server.push(*[FakeReply(502, "x" * 1000)] * 3)
    backbone, sleeps = _backbone(server, retries=2, backoff_s=0.0)
    with pytest.raises(BackendError) as info:
        backbone.generate(_request())
    message = str(info.value)
    assert "HTTP 502" in message and "3 attempt(s)" in message and "retried" in message
    assert "x" * 200 in message and "x" * 201 not in message  # excerpt bounded
    assert len(server.requests) == 3 and len(sleeps.waits) == 2


@pytest.mark.parametrize(
    ("body", "pattern"),
    [
        ("this is not json", "not JSON"),
        ({"object": "chat.completion"}, "no choices"),
        ({"choices": []}, "no choices"),
        ({"error": {"message": "model not loaded"}}, "no choices.*model not loaded"),
        (completion("   "), "empty content"),
        ({"choices": [{"message": {"role": "assistant", "content": None}}]}, "empty content"),
    ],
)
def test_malformed_replies_raise_backend_error(
    server: FakeChatServer, body: dict[str, object] | str, pattern: str
) -> None:
    """A 200 whose body is not JSON, lacks choices or has empty content is a BackendError."""
    server.push(FakeReply(200, body))
    backbone, _ = _backbone(server, retries=2)
    with pytest.raises(BackendError, match=pattern):
        backbone.generate(_request())
    assert len(server.requests) == 1  # the server answered: not retried


def test_content_parts_are_joined(server: FakeChatServer) -> None:
    """A reply whose content is a list of text parts is joined into one answer."""
    parts = [{"type": "text", "text": "No change "}, {"type": "text", "text": f"[{S_ID}]."}]
    server.push(FakeReply(200, {"choices": [{"message": {"content": parts}}]}))
    reply = _backbone(server)[0].generate(_request())
    assert reply.answer == f"No change [{S_ID}]." and reply.cited == (S_ID,)


def test_slow_reply_times_out_then_retries(server: FakeChatServer) -> None:
    """A reply slower than timeout_s is a timeout: retried, then a BackendError naming it."""
    server.push(FakeReply(delay_s=5.0), FakeReply(delay_s=5.0), "never reached")
    backbone, sleeps = _backbone(server, timeout_s=0.2, retries=1, backoff_s=0.0)
    with pytest.raises(BackendError, match=r"timed out after 0.2 s.*2 attempt"):
        backbone.generate(_request())
    assert len(server.requests) == 2 and sleeps.waits == [0.0]


def test_timeout_then_success(server: FakeChatServer) -> None:
    """After one timed-out attempt, a prompt reply on the retry is returned."""
    server.push(FakeReply(delay_s=5.0), "recovered")
    backbone, _ = _backbone(server, timeout_s=0.2, retries=1, backoff_s=0.0)
    assert backbone.generate(_request()).answer == "recovered"


def test_connection_refused_is_retried_then_fails() -> None:
    """Nothing listening: every attempt fails with a connection error, then BackendError."""
    with socket.socket() as s:  # a port that was free a moment ago and has no listener
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sleeps = Sleeps()
    backbone = OpenAICompatibleBackbone(
        f"http://127.0.0.1:{port}/v1", "m", retries=2, backoff_s=0.5, timeout_s=2, sleep=sleeps
    )
    with pytest.raises(BackendError, match=r"connection error.*3 attempt"):
        backbone.generate(_request())
    assert sleeps.waits == [0.5, 1.0]


@pytest.mark.parametrize("url", ["ftp://example.org/v1", "file:///etc/passwd", "127.0.0.1:8000", "http://", ""])
def test_base_url_must_be_http_or_https(url: str) -> None:
    """Only http(s) URLs with a host are accepted."""
    with pytest.raises(InvalidInput, match="base_url"):
        OpenAICompatibleBackbone(url, "m")


@pytest.mark.parametrize(
    "options",
    [{"model": ""}, {"timeout_s": 0}, {"retries": -1}, {"backoff_s": -1.0}, {"max_tokens": 0}, {"temperature": -0.5}],
)
def test_invalid_options_raise_invalid_input(options: dict[str, object]) -> None:
    """Out-of-range settings are refused at construction."""
    kw: dict[str, object] = {"model": "m", **options}
    with pytest.raises(InvalidInput):
        OpenAICompatibleBackbone("http://127.0.0.1:1/v1", **kw)  # type: ignore[arg-type]


def test_registry_builds_openai_backbone(server: FakeChatServer) -> None:
    """get_backbone('openai', ...) returns a working OpenAICompatibleBackbone; key not in repr."""
    server.push("ok")
    backbone = get_backbone("openai", base_url=server.base_url + "/", model="m", api_key="secret")
    assert isinstance(backbone, OpenAICompatibleBackbone) and "secret" not in repr(backbone)
    assert backbone.generate(_request()).answer == "ok"
    assert server.requests[0].path == "/v1/chat/completions"  # trailing slash normalised


def test_prompt_and_image_never_logged(server: FakeChatServer, caplog: pytest.LogCaptureFixture) -> None:
    """Even at DEBUG, log records carry neither the prompt nor the image bytes."""
    server.push(FakeReply(500, PROMPT), "ok")
    backbone, _ = _backbone(server, retries=1)
    with caplog.at_level(logging.DEBUG, logger="msm_mem"):
        backbone.generate(_request())
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert caplog.records and "retry 1 of 1" in logged
    assert "What has changed" not in logged and "base64" not in logged and E_ID not in logged


def test_cited_ids_only_counts_prompt_ids_and_skips_dates() -> None:
    """Ids cited must be bracketed in the prompt (dates excluded) or known; order of mention."""
    reply = f"See {V_ID} and [{E_ID}]; also [2024-01-02], [E-zzz] and {E_ID}x."
    assert cited_ids(PROMPT, reply) == (V_ID, E_ID)
    assert cited_ids(PROMPT, "[2024-01-02]") == ()
    assert cited_ids("no ids here", "cites [E-1]", known=["E-1"]) == ("E-1",)
    assert cited_ids(PROMPT, f"[{E_ID}, {S_ID}]") == (E_ID, S_ID)


def test_image_data_url_rgb_round_trip() -> None:
    """An (h, w, 3) float image becomes an RGB PNG with round(v * 255) values."""
    rgb = np.random.default_rng(0).random((5, 7, 3)).astype(np.float32)
    url = image_data_url(rgb)
    png = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
    assert png.mode == "RGB"
    assert np.array_equal(np.asarray(png), np.rint(rgb * 255).astype(np.uint8))


def test_fake_server_404_and_default_reply() -> None:
    """The fake answers 404 off the route, then its default once the script is used up."""
    with FakeChatServer(["first"], default="again") as srv:
        backbone = OpenAICompatibleBackbone(srv.base_url + "/nope", "m", retries=0)
        with pytest.raises(BackendError, match="HTTP 404"):
            backbone.generate(_request())
        good = OpenAICompatibleBackbone(srv.base_url, "m")
        answers = [good.generate(_request()).answer for _ in range(3)]
        assert answers == ["first", "again", "again"]
        assert json.loads(srv.requests[1].body)["model"] == "m"
    with pytest.raises(RuntimeError):
        _ = srv.base_url  # closed

"""Tests of the fused context and the recorded answer (MsmMem.context, MsmMem.record_answer), and
of the model behind ask: an OpenAI-compatible server run as a process of its own."""

from __future__ import annotations

import base64
import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from msm_mem import (
    AccessDenied,
    BackendError,
    BackendUnavailable,
    FixedClock,
    IllegalTransition,
    InvalidInput,
    ManifestRow,
    ModelRef,
    MsmMem,
    NotFound,
)
from msm_mem.testing import completion
from tests.agent_support import audit_since, counts
from tests.chat_process import ChatProcess, chat_process, image_sent, prompt_sent
from tests.helpers import ADMIN, AGENT, AUDITOR, CRITIC, INGEST, png
from tests.layers import Views


@pytest.fixture
def views() -> Iterator[Views]:
    """Handles of their own on the stores a test opens (``tests/layers.py``), closed after it."""
    with Views() as opened:
        yield opened


QUESTION = "What is the impression?"
T0 = 1_700_000_000.0


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Requests to 127.0.0.1 must not go through a proxy configured in the environment."""
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A store where P1 has two studies and P2 one, each answered."""
    directory = tmp_path / "store"
    images = tmp_path / "images"
    images.mkdir()
    with MsmMem.init(directory, ADMIN, clock=FixedClock(T0)) as mem:
        rows = [
            ManifestRow(p, f"S{i}", T0 - (3 - i) * 86_400, str(png(images, i)), QUESTION, answer, line=i + 1)
            for i, (p, answer) in enumerate(
                [
                    ("P1", "Right lower lobe consolidation."),
                    ("P1", "Right lower lobe consolidation, improving."),
                    ("P2", "No acute cardiopulmonary findings."),
                ]
            )
        ]
        mem.ingest(INGEST, rows)
    return directory


@pytest.fixture
def image(tmp_path: Path) -> Path:
    return png(tmp_path / "images", 7)


@pytest.fixture
def mem(store: Path) -> Iterator[MsmMem]:
    with MsmMem.open(store, clock=FixedClock(T0)) as m:
        yield m


def _openai(store: Path, server: ChatProcess, **options: Any) -> MsmMem:
    opts = {"base_url": server.base_url, "model": "llava-test", "retries": 0, **options}
    return MsmMem.open(store, clock=FixedClock(T0), backbone="openai", backbone_options=opts)


def _actions(mem: MsmMem, since: int) -> list[str]:
    return [e["action"] for e in audit_since(mem, since)]


def _head(mem: MsmMem) -> int:
    return mem.verify_audit(AUDITOR).count


def test_context_is_the_prompt_ask_gives_the_model(store: Path, image: Path, tmp_path: Path) -> None:
    """The model behind ask receives the context's prompt (evidence ids in brackets) and the
    image as a PNG data URL; the answer names the model the server reports, and so does its audit event."""
    reply = {"body": completion("Right lower lobe consolidation, stable.", "llava-test-7b", "fp-42")}
    with chat_process(tmp_path / "chat", [reply]) as server, _openai(store, server) as mem:
        ctx = mem.context(AGENT, "P1", str(image), QUESTION)
        seq = _head(mem)
        answer = mem.ask(AGENT, "P1", str(image), QUESTION, write_back=False)
        sent = server.requests()
        events = [e for e in audit_since(mem, seq) if e["action"] == "answer"]
    assert len(sent) == 1
    assert prompt_sent(sent[0]) == ctx.prompt == answer.prompt
    assert ctx.included and all(f"[{i}]" in ctx.prompt for i in ctx.included)
    url = image_sent(sent[0])
    assert url.startswith("data:image/png;base64,")
    with Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))) as got:
        assert got.format == "PNG"
        pixels = np.asarray(got)
    assert ctx.image is not None
    assert np.array_equal(pixels, np.round(ctx.image * 255).astype(np.uint8))
    assert answer.model == ModelRef("openai", "llava-test-7b", "fp-42")
    assert len(events) == 1
    assert "model:openai/llava-test-7b@fp-42" in events[0]["record_ids"]


def test_context_is_read_and_audited_not_answered(mem: MsmMem, image: Path) -> None:
    """A context writes a short-term item and audits its reads and one context event naming
    what it handed out; nothing reaches long-term memory."""
    before, seq = counts(mem), _head(mem)
    ctx = mem.context(AGENT, "P1", str(image), QUESTION)
    after = counts(mem)
    assert after == {**before, "stm": before["stm"] + 1}
    events = audit_since(mem, seq)
    assert [e["action"] for e in events][0] == "consent"
    assert {"read", "write", "context"} <= {e["action"] for e in events}
    handed = next(e for e in events if e["action"] == "context")
    assert handed["record_ids"] == [ctx.context_id, *ctx.included]
    assert ctx.budget_chars == mem.settings.prompt_budget_chars
    assert [e.id for e in ctx.evidence] and ctx.evidence[0].score >= ctx.evidence[-1].score
    assert "## Current question" in ctx.prompt and ctx.prompt.rstrip().endswith(QUESTION)


def test_context_of_a_stored_study_names_it(mem: MsmMem) -> None:
    """A stored study instead of an image: the context names it and carries its image."""
    ctx = mem.context(AGENT, "P1", None, QUESTION, image_study="S1")
    assert ctx.image_study == "S1" and ctx.study_id == "S1"
    assert ctx.image is not None and ctx.image.ndim == 2


def test_context_keeps_the_budget(store: Path, image: Path) -> None:
    """A small budget drops the lowest-ranked lines and says which."""
    from msm_mem import Settings

    with MsmMem.open(store, clock=FixedClock(T0), settings=Settings(prompt_budget_chars=300)) as mem:
        ctx = mem.context(AGENT, "P1", str(image), QUESTION)
    assert ctx.dropped
    assert not set(ctx.dropped) & set(ctx.included)
    assert all(f"[{i}]" not in ctx.prompt for i in ctx.dropped)


def test_a_role_that_may_not_ask_may_not_take_a_context(mem: MsmMem, image: Path) -> None:
    """A critic is refused a context, and the refusal is audited."""
    seq = _head(mem)
    with pytest.raises(AccessDenied, match="may not context"):
        mem.context(CRITIC, "P1", str(image), QUESTION)
    assert [(e["action"], e["outcome"]) for e in audit_since(mem, seq)] == [("context", "denied")]


def test_record_answer_goes_through_the_gate(mem: MsmMem, image: Path, tmp_path: Path) -> None:
    """A recorded answer is written as ask writes back: an episode, the semantic state and the
    question's claim superseded; one answer event names the item, the model and the evidence,
    and the FHIR export names the model as an agent."""
    ctx = mem.context(AGENT, "P1", str(image), QUESTION)
    before, seq = counts(mem), _head(mem)
    used = list(ctx.included[:2])
    model = ModelRef("vllm", "llava-med-7b", "1.5")
    done = mem.record_answer(
        AGENT, "P1", ctx.context_id, "Right lower lobe consolidation, resolving.", model=model, evidence=used
    )
    assert done.gate.written and done.episode_id is not None
    assert done.source == "agent" and done.evidence == tuple(used) and done.model == model
    after = counts(mem)
    assert after["episodic"] == before["episodic"] + 1
    assert after["semantic"] == before["semantic"] + 1  # a new version; the old one superseded
    assert after["stm"] == before["stm"]  # the item moved (its content purged)
    events = audit_since(mem, seq)
    answered = [e for e in events if e["action"] == "answer"]
    assert len(answered) == 1
    assert answered[0]["record_ids"] == [ctx.context_id, "model:vllm/llava-med-7b@1.5", *used]
    assert {"consolidate", "semantic_update"} <= {e["action"] for e in events}
    assert [s.impressions[-1].text for s in mem.semantic_state(AGENT, "P1")][-1].endswith("resolving.")
    out = tmp_path / "audit.ndjson"
    mem.export_fhir(AUDITOR, out)
    resources = [json.loads(line) for line in out.read_text().splitlines()]
    models = [
        a["who"]["identifier"]["value"]
        for r in resources
        for a in r["agent"]
        if a["who"]["identifier"]["system"] == "urn:msm-mem:model"
    ]
    assert "vllm/llava-med-7b@1.5" in models
    with pytest.raises(IllegalTransition, match="not active"):
        mem.record_answer(AGENT, "P1", ctx.context_id, "Again.", model=model)


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"evidence": ["E-nowhere"]}, InvalidInput, "names no record"),
        ({"answer": "Consolidation \x1b[31m"}, InvalidInput, "U\\+001B"),
        ({"model": {"backbone": "my model"}}, InvalidInput, "model backbone"),
        ({"model": {"model": "x"}}, InvalidInput, "needs its backbone"),
        ({"model": {"backbone": "vllm", "weights": "x"}}, InvalidInput, "unknown model field"),
        ({"evidence": "E-1"}, InvalidInput, "list of memory ids"),
        ({"context_id": "S-not-an-item"}, NotFound, "no short-term item"),
        ({"patient": "P2"}, NotFound, "no short-term item"),
    ],
)
def test_record_answer_refuses_bad_input_and_writes_nothing(
    mem: MsmMem, image: Path, change: dict[str, Any], error: type[Exception], message: str
) -> None:
    """Every bad part of a recorded answer is refused, naming it, and nothing is written."""
    ctx = mem.context(AGENT, "P1", str(image), QUESTION)
    args: dict[str, Any] = {
        "patient": "P1",
        "context_id": ctx.context_id,
        "answer": "Right lower lobe consolidation, resolving.",
        "model": {"backbone": "vllm", "model": "llava-med-7b"},
        "evidence": list(ctx.included[:1]),
        **change,
    }
    before, seq = counts(mem), _head(mem)
    with pytest.raises(error, match=message):
        mem.record_answer(
            AGENT, args["patient"], args["context_id"], args["answer"], model=args["model"], evidence=args["evidence"]
        )
    assert counts(mem) == before
    assert not {"answer", "consolidate", "hold", "semantic_update"} & set(_actions(mem, seq))


def test_record_answer_from_other_patients_experience_is_deidentified(mem: MsmMem, image: Path, views: Views) -> None:
    """An answer resting on another patient's record is stored de-identified, naming that record as its source."""
    ctx = mem.context(AGENT, "P1", str(image), QUESTION)
    p2 = views(mem).store.record_ids("episodic", "P2")
    done = mem.record_answer(
        AGENT,
        "P1",
        ctx.context_id,
        "No acute cardiopulmonary findings, as in John Smith.",
        model={"backbone": "vllm"},
        evidence=[p2[0]],
    )
    assert done.source == f"population:{p2[0]}"
    assert "John Smith" not in done.answer


# the model server: its faults, each a clear error with nothing written ------------------------


FAULTS = {
    "server down": (None, {}, BackendUnavailable, "connection error"),
    "slow past the timeout": ([{"delay_s": 5, "text": "late"}], {"timeout_s": 0.5}, BackendUnavailable, "timed out"),
    "HTTP 500": (
        [{"status": 500, "body": {"error": {"message": "boom"}}}] * 2,
        {"retries": 1},
        BackendUnavailable,
        "HTTP 500",
    ),
    "malformed JSON": ([{"status": 200, "body": "{not json"}], {}, BackendError, "not JSON"),
    "answer too long": (["consolidation " * 3000], {}, BackendError, "over the 32,768 allowed"),
    "empty answer": ([{"body": completion("\x00\x1b\u200b")}], {}, BackendError, "empty"),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_model_server_fault_is_a_clear_error_and_nothing_is_written(
    store: Path, image: Path, tmp_path: Path, fault: str
) -> None:
    """Down, slow, failing, malformed or oversized: ask raises naming the problem, and memory
    holds what it held; the audit trail gains the consent, the reads and the failed turn only."""
    script, options, error, message = FAULTS[fault]
    with chat_process(tmp_path / "chat", script or []) as server:
        if script is None:
            server.stop()
        with _openai(store, server, backoff_s=0, **options) as mem:
            before, seq = counts(mem), _head(mem)
            with pytest.raises(error, match=message) as raised:
                mem.ask(AGENT, "P1", str(image), QUESTION)
            assert counts(mem) == before
            actions = _actions(mem, seq)
    assert server.base_url.split("/v1")[0] in str(raised.value) or fault in ("answer too long", "empty answer")
    assert set(actions) <= {"consent", "read", "turn"} and actions.count("turn") == 1


def test_429_waits_as_long_as_retry_after_says(
    store: Path, image: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A 429 is retried after the server's Retry-After (not the configured backoff); when the
    retries run out the model server is unavailable and nothing is written."""
    busy = {"status": 429, "headers": {"Retry-After": "0"}, "body": {"error": {"message": "slow down"}}}
    caplog.set_level(logging.WARNING, logger="msm_mem.plugins.backbones.openai_http")
    with chat_process(tmp_path / "chat", [busy, busy]) as server, _openai(store, server, retries=1, backoff_s=9) as mem:
        before = counts(mem)
        with pytest.raises(BackendUnavailable, match="HTTP 429"):
            mem.ask(AGENT, "P1", str(image), QUESTION)
        assert counts(mem) == before
        assert len(server.requests()) == 2
    assert any("retry 1 of 1 in 0.00 s" in r.getMessage() for r in caplog.records)


def test_a_reply_with_control_characters_is_cleaned_before_it_is_stored(
    store: Path, image: Path, tmp_path: Path
) -> None:
    """Control, bidirectional and zero-width characters of a model's answer never reach memory."""
    dirty = "Right lower lobe \x1b[31mconsolidation\u202e, stable\u200b.\x07"
    with chat_process(tmp_path / "chat", [dirty]) as server, _openai(store, server) as mem:
        answer = mem.ask(AGENT, "P1", str(image), QUESTION)
        stored = [e.answer for e in mem.episodes(AGENT, "P1")]
    assert answer.answer == "Right lower lobe [31mconsolidation, stable."
    assert answer.answer in stored


def test_the_prompt_and_the_image_are_never_logged(
    store: Path, image: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """At DEBUG the backbone logs the URL, the model and sizes, never the prompt or the image."""
    caplog.set_level(logging.DEBUG)
    with chat_process(tmp_path / "chat", ["Stable consolidation."]) as server, _openai(store, server) as mem:
        answer = mem.ask(AGENT, "P1", str(image), QUESTION)
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "prompt_chars=" in logged
    assert QUESTION not in logged and "consolidation" not in logged.lower()
    assert "base64" not in logged and answer.prompt[:40] not in logged


def test_a_model_reference_is_an_audit_id() -> None:
    """A model named by a caller must be well-formed; what a server reports is made safe."""
    assert (
        ModelRef("openai", "llava-hf/llava-1.5-7b-hf", "fp_1").audit_id == "model:openai/llava-hf/llava-1.5-7b-hf@fp_1"
    )
    assert ModelRef("nonparametric").audit_id == "model:nonparametric"
    for bad in ({"backbone": ""}, {"backbone": "vllm", "model": "a b"}, {"backbone": "vllm", "version": "1@2"}):
        with pytest.raises(InvalidInput, match="must be 1-128 characters"):
            ModelRef(**bad)
    reported = ModelRef.reported("openai", "llava\x1b[31m 7b\u202e", "@" + "9" * 300)
    assert reported.model == "llava_31m_7b_" and len(reported.version) == 128
    assert ModelRef.reported("", "", "").audit_id == "model:unknown"

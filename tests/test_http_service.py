"""The service as a real process on a loopback port, over the embedded store and over a
PostgreSQL server the tests start (two workers there): the client against it, bad input, and
what the log holds (the matrix of roles x endpoints x own/other patient: test_http_scope.py)."""

from __future__ import annotations

import io
import json
import re
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import jwt
import numpy as np
import pytest
from PIL import Image

from msm_mem import AccessDenied, ConsentDenied, ConsentRecord, InvalidInput, MemoryClient, NotFound
from msm_mem._memory.ranking import TIER_WEIGHTS
from msm_mem._settings import DEFAULT_RETENTION_S
from tests.helpers import png
from tests.http_support import (
    JWT_AUDIENCE,
    JWT_ISSUER,
    JWT_SECRET,
    OTHER,
    OWN,
    QUESTION,
    ROLES,
    Served,
    serve_backend,
)

pytestmark = pytest.mark.system


@pytest.fixture(scope="module", params=[pytest.param("sqlite"), pytest.param("postgres", marks=pytest.mark.postgres)])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One server per backend for the module (embedded: one worker; PostgreSQL: two)."""
    yield from serve_backend(request.param, tmp_path_factory.mktemp(f"serve-{request.param}"))


def _png_bytes(seed: int, size: tuple[int, int] = (64, 64)) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (size[1], size[0]), dtype=np.uint8), mode="L").save(buf, "PNG")
    return buf.getvalue()


def _client(served: Served, role: str, **kwargs: Any) -> MemoryClient:
    return MemoryClient(served.url, served.tokens[role], **kwargs)


# the client against the server ------------------------------------------------------------------


def test_health_readiness_and_whoami_come_from_the_credential(served: Served) -> None:
    """/health and /ready need no credential; whoami is the key's principal and scope."""
    assert httpx.get(served.url + "/health").json() == {"status": "ok"}
    with _client(served, "agent") as c:
        assert c.health()
        who, scope = c.whoami()
    assert who == ROLES["agent"] and scope == (OWN,)


def test_the_client_mirrors_the_api_call_for_call(served: Served) -> None:
    """ask (upload and stored study), retrieve, observe, consolidate, feedback and every read,
    through the client, return the library's records for the key's own patient."""
    with _client(served, "agent") as agent, _client(served, "critic") as critic:
        answer = agent.ask(OWN, _png_bytes(11), QUESTION, study_id="S-new")
        assert answer.answer and answer.evidence and answer.gate is not None
        by_study = agent.ask(OWN, None, QUESTION, image_study="S0", write_back=False)
        assert by_study.gate is None and by_study.evidence
        found = agent.retrieve(OWN, png(served.images, 1), k=3)
        assert found.patient_id == OWN and 0 < len(found.items) <= 3
        assert all(i.record is None or getattr(i.record, "patient_id", OWN) == OWN for i in found.items)
        item = agent.observe(OWN, _png_bytes(12), "Any change?")
        assert item.patient_id == OWN and item.state.value == "active"
        written = agent.consolidate(OWN, item.item_id, "Stable right lower lobe consolidation noted.")
        assert written.gate.reasons
        claim = critic.feedback(OWN, "S0", accept=False, correction="Left basal effusion.")
        assert claim.content == "Left basal effusion." and claim.evidence_tier != "agent"
        history = agent.claim_history(OWN, claim.key)
        assert [c.content for c in history][-1] == "Left basal effusion."
        assert agent.semantic_state(OWN) and agent.semantic_history(OWN)
        episodes = agent.episodes(OWN)
        assert episodes and {e.patient_id for e in episodes} == {OWN} and episodes[0].z.size == 0
        assert {v.patient_id for v in agent.visuals(OWN)} == {OWN}
        assert {c.patient_id for c in agent.claims(OWN)} == {OWN}
        assert agent.stm_items(OWN, state="active") == [] or all(i.patient_id == OWN for i in agent.stm_items(OWN))


def test_a_records_decay_time_counts_from_the_patients_last_activity(served: Served) -> None:
    """GET episodes and claims: decay_at is one last activity (the newest write) + ten years x confidence x weight."""
    with httpx.Client(base_url=served.url, headers=served.headers("agent"), timeout=30) as http:
        episodes = http.get(f"/v1/patients/{OWN}/episodes").json()["items"]
        claims = http.get(f"/v1/patients/{OWN}/claims").json()["items"]
    records = [*episodes, *claims]
    share = {id(r): r["confidence"] * TIER_WEIGHTS[r["evidence_tier"]] for r in records}
    last = [r["decay_at"] - DEFAULT_RETENTION_S * share[id(r)] for r in records]
    assert max(last) - min(last) < 1e-3 and min(last) >= max(r["created_at"] for r in records) - 1e-3


def test_a_list_page_is_paged_in_the_read_and_audited_as_returned(served: Served) -> None:
    """GET a patient's episodes one at a time: each page holds one record, total counts them
    all, and the read's audit event names the page's record only."""
    with httpx.Client(base_url=served.url, headers=served.headers("agent"), timeout=30) as http:
        whole = http.get(f"/v1/patients/{OWN}/episodes").json()
        assert whole["total"] >= 2 and whole["next_offset"] is None
        before = served.head_seq()
        r = http.get(f"/v1/patients/{OWN}/episodes", params={"offset": 1, "limit": 1})
        assert r.status_code == 200, r.text
        doc = r.json()
    assert [e["episode_id"] for e in doc["items"]] == [whole["items"][1]["episode_id"]]
    assert (doc["total"], doc["offset"], doc["limit"]) == (whole["total"], 1, 1)
    assert doc["next_offset"] == (2 if whole["total"] > 2 else None)
    reads = [e for e in served.audit_events(before) if e["action"] == "read" and e["actor"] == ROLES["agent"].id]
    assert [e["record_ids"] for e in reads] == [[whole["items"][1]["episode_id"]]]


def test_retrieve_by_a_stored_study_is_one_audited_read(served: Served) -> None:
    """Retrieve given ``image_study`` ranks as the study's image does, with the audit events of
    one retrieve (no separate read of the patient's episodes); another patient's study id, or
    an unknown one, is 404."""
    with _client(served, "agent") as agent:
        by_image = agent.retrieve(OWN, png(served.images, 0), at=1_700_000_000.0)
        before = served.head_seq()
        by_study = agent.retrieve(OWN, None, image_study="S0", at=1_700_000_000.0)
        study_events = served.audit_events(before)
        assert [(i.evidence.id, i.evidence.score) for i in by_study.items] == [
            (i.evidence.id, i.evidence.score) for i in by_image.items
        ]
        assert [e["action"] for e in study_events] == ["consent", "read"]
        for study in ("S3", "no-such-study"):
            with pytest.raises(NotFound):
                agent.retrieve(OWN, None, image_study=study)


def test_the_client_runs_governance_as_its_credential(served: Served) -> None:
    """Consent grant, list and revoke (revoke needs every patient: break-glass), key rotation,
    audit verification, checkpoint and FHIR export, maintenance and shredding."""
    now = time.time()
    consent = ConsentRecord("ignored", OWN, "role:agent", "research", "permit", ("*",), now - 1)
    with _client(served, "admin") as admin:
        (granted,) = admin.grant([consent])
        assert granted.consent_id.startswith("C-") and granted.patient_id == OWN
        assert granted.consent_id in {c.consent_id for c in admin.consents(OWN)}
        with pytest.raises(AccessDenied):
            admin.revoke(granted.consent_id)  # every patient is outside the admin's scope
        assert admin.rotate_keys("test rotation") >= 1
    with _client(served, "admin", break_glass_reason="revoking a test consent") as glass:
        glass.revoke(granted.consent_id)
        assert glass.shred("PAT-SHRED-1", "erasure request") == 0
    events = served.audit_events()
    assert any(e["action"] == "break_glass" and e["actor"] == "svc-admin" for e in events)
    with _client(served, "auditor") as auditor:
        assert auditor.verify_audit().ok
        size, head = auditor.checkpoint()
        assert size > 0 and len(head) == 64
        out = served.directory.parent / "fhir.ndjson"
        assert auditor.export_fhir(out) == len(out.read_text().splitlines()) > 0
        assert OWN not in out.read_text()
        assert all(c.patient_id in ("*",) or c.patient_id.startswith("pt-") for c in auditor.consents())
        with pytest.raises(AccessDenied):
            auditor.episodes(OWN)  # the audit tier only
    with _client(served, "system") as system:
        report = system.maintain()
        assert report.checkpoint is not None


def test_the_client_raises_the_librarys_exceptions(served: Served) -> None:
    """Problems come back as AccessDenied, ConsentDenied, NotFound and InvalidInput."""
    with _client(served, "agent") as agent:
        with pytest.raises(AccessDenied):
            agent.episodes(OTHER)
        with pytest.raises(NotFound):
            agent.consolidate(OWN, "M-nothing", "Some answer about the lobe.")
        with pytest.raises(InvalidInput):
            agent.retrieve(OWN, _png_bytes(3), k=1000)
        with pytest.raises(InvalidInput):
            agent.ask(OWN, _png_bytes(3)[:50], QUESTION)
    with _client(served, "researcher") as researcher, pytest.raises(ConsentDenied):
        researcher.ask(OWN, _png_bytes(4), QUESTION)


# bad input --------------------------------------------------------------------------------------


def _jwt(**claims: Any) -> str:
    base = {
        "sub": "jwt-agent",
        "role": "agent",
        "purpose": "treatment",
        "patients": [OWN],
        "iss": JWT_ISSUER,
        "aud": JWT_AUDIENCE,
        "exp": int(time.time()) + 600,
    }
    base.update(claims)
    key = base.pop("key", JWT_SECRET)
    return jwt.encode({k: v for k, v in base.items() if v is not None}, key, algorithm="HS256")


def test_tokens_are_verified_and_fail_closed(served: Served) -> None:
    """No token, a forged or revoked API key, an expired, forged, wrong-audience or
    claim-less JWT: each 401 with a problem; a valid JWT acts as its claims say."""
    url = served.url + "/v1/whoami"
    forged = served.tokens["agent"][:-4] + "AAAA"
    for headers in (
        {},
        {"Authorization": "Basic abc"},
        {"Authorization": f"Bearer {forged}"},
        {"Authorization": f"Bearer {served.tokens['revoked']}"},
        {"Authorization": f"Bearer {_jwt(exp=int(time.time()) - 5)}"},
        {"Authorization": f"Bearer {_jwt(key='another-secret-that-is-also-32-bytes-long')}"},
        {"Authorization": f"Bearer {_jwt(aud='someone-else')}"},
        {"Authorization": f"Bearer {_jwt(iss='https://evil.test')}"},
        {"Authorization": f"Bearer {_jwt(role=None)}"},
    ):
        r = httpx.get(url, headers=headers)
        assert r.status_code == 401, (headers, r.text)
        assert r.json()["type"] == "urn:msm-mem:problem:unauthenticated"
        assert "Bearer" in r.headers["www-authenticate"]
    r = httpx.get(url, headers={"Authorization": f"Bearer {_jwt()}"})
    assert r.status_code == 200 and r.json()["id"] == "jwt-agent" and r.json()["credential"] == "jwt"


def test_bad_input_is_a_clear_4xx_and_stores_nothing(served: Served) -> None:
    """Malformed JSON, wrong content types, truncated, oversized or too large images, a long
    question, k and page size past their limits, a body naming a principal, an unknown patient:
    each a problem with its status, and nothing written to the store."""
    h = served.headers("agent")
    base = f"{served.url}/v1/patients/{OWN}"
    image = ("x.png", _png_bytes(5), "image/png")
    cases: list[tuple[str, int, Callable[[], httpx.Response]]] = [
        (
            "malformed JSON",
            400,
            lambda: httpx.post(
                f"{base}/stm/M-x/consolidate", content=b"{no", headers={**h, "content-type": "application/json"}
            ),
        ),
        ("JSON as text", 415, lambda: httpx.post(f"{base}/stm/M-x/consolidate", content=b"{}", headers=h)),
        ("a form as JSON", 415, lambda: httpx.post(f"{base}/ask", json={"question": QUESTION}, headers=h)),
        (
            "truncated image",
            422,
            lambda: httpx.post(
                f"{base}/ask", files={"image": ("x.png", _png_bytes(5)[:80])}, data={"question": QUESTION}, headers=h
            ),
        ),
        (
            "not an image",
            422,
            lambda: httpx.post(
                f"{base}/ask", files={"image": ("x.png", b"hello" * 40)}, data={"question": "q"}, headers=h
            ),
        ),
        (
            "oversized upload",
            413,
            lambda: httpx.post(
                f"{base}/ask",
                files={"image": ("x.png", b"\x89PNG" + b"0" * 1_600_000)},
                data={"question": "q"},
                headers=h,
            ),
        ),
        (
            "image too large",
            422,
            lambda: httpx.post(
                f"{base}/ask", files={"image": ("x.png", _png_bytes(6, (4000, 2)))}, data={"question": "q"}, headers=h
            ),
        ),
        ("no image", 422, lambda: httpx.post(f"{base}/ask", data={"question": QUESTION}, headers=h)),
        (
            "long question",
            422,
            lambda: httpx.post(f"{base}/ask", files={"image": image}, data={"question": "x" * 2001}, headers=h),
        ),
        (
            "k too large",
            422,
            lambda: httpx.post(f"{base}/retrieve", files={"image": image}, data={"k": "1000"}, headers=h),
        ),
        ("page too large", 422, lambda: httpx.get(f"{base}/episodes", params={"limit": 100_000}, headers=h)),
        ("image as a text field", 422, lambda: httpx.post(f"{base}/retrieve", data={"image": "abc"}, headers=h)),
        (
            "image and image_study",
            422,
            lambda: httpx.post(f"{base}/retrieve", files={"image": image}, data={"image_study": "S0"}, headers=h),
        ),
        (
            "unknown scope",
            422,
            lambda: httpx.post(f"{base}/retrieve", files={"image": image}, data={"scope": "world"}, headers=h),
        ),
        (
            "time not finite",
            422,
            lambda: httpx.post(f"{base}/retrieve", data={"image_study": "S0", "at": "inf"}, headers=h),
        ),
        (
            "a body naming a principal",
            422,
            lambda: httpx.post(
                f"{base}/stm/M-x/consolidate",
                json={"answer": "Clear.", "actor": "svc-admin", "role": "admin"},
                headers=h,
            ),
        ),
        ("unknown route", 404, lambda: httpx.get(f"{served.url}/v1/nothing", headers=h)),
    ]
    before = served.head_seq()
    for name, status, call in cases:
        r = call()
        assert r.status_code == status, (name, r.status_code, r.text)
        assert r.headers["content-type"] == "application/problem+json", name
        doc = r.json()
        assert doc["status"] == status and doc["type"].startswith("urn:msm-mem:problem:"), name
        assert OWN not in r.text, name
    assert served.head_seq() == before, "a refused request wrote to the store"
    with _client(served, "everyone") as c:
        with pytest.raises(NotFound):
            c.feedback("PAT-NOBODY-1", "S1", accept=True)
        assert c.claims("PAT-NOBODY-1") == [] and c.episodes("PAT-NOBODY-1") == []


def test_a_refused_form_field_is_named_without_its_value(served: Served) -> None:
    """A form field out of its bounds is a 422 naming the field (``body.k``), not its value; an
    empty field takes its default and a field the operation does not take is ignored."""
    h = served.headers("agent")
    base = f"{served.url}/v1/patients/{OWN}"
    r = httpx.post(f"{base}/retrieve", data={"image_study": "S0", "k": "987654", "scope": "x-9"}, headers=h)
    assert r.status_code == 422
    assert sorted(tuple(e["loc"]) for e in r.json()["errors"]) == [("body", "k"), ("body", "scope")]
    assert "987654" not in r.text and "x-9" not in r.text
    ok = httpx.post(f"{base}/retrieve", data={"image_study": "S0", "k": "", "colour": "red"}, headers=h)
    assert ok.status_code == 200, ok.text
    assert len(ok.json()["items"]) <= 10


def test_the_log_names_no_patient_question_or_token(served: Served) -> None:
    """After everything above, the server's log holds no patient id, question text or token,
    and its access lines name routes by their templates."""
    with _client(served, "agent") as agent:
        agent.ask(OWN, _png_bytes(21), QUESTION, write_back=False)
    text = ""
    for _ in range(50):  # the access line is written just after the answer is sent
        text = served.log.read_text()
        if "/v1/patients/{patient_id}/ask" in text:
            break
        time.sleep(0.1)
    assert "/v1/patients/{patient_id}/ask" in text
    for secret in (OWN, OTHER, QUESTION, "Left basal effusion", *served.tokens.values()):
        assert secret not in text, secret


def test_the_readme_agent_runs_against_the_server(
    served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's service example runs as written (with this server's URL, key and patient)."""
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    match = re.search(r"## As a service.*?```python\n(.*?)```", text, re.S)
    assert match, "README has no service example"
    code = match.group(1).replace("http://127.0.0.1:8080", served.url).replace("msmk_...", served.tokens["agent"])
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cxr.png").write_bytes(_png_bytes(31))
    exec(compile(code.replace('"P1"', repr(OWN)), "README.md", "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out[0] and out[-1].startswith("['")  # the answer, then the study's claim history


def _raw_get(served: Served, target: bytes, role: str = "clinician") -> tuple[int, dict[str, str], bytes]:
    """GET ``target`` exactly as given (no client re-encoding) over a socket: status, headers, body."""
    host, port = served.url.removeprefix("http://").split(":")
    token = served.tokens[role].encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(
            b"GET "
            + target
            + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
            + token
            + b"\r\nConnection: close\r\n\r\n"
        )
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def test_invalid_utf8_in_a_url_path_is_a_400_not_a_patient(served: Served) -> None:
    """Two different invalid byte sequences are each a 400 problem and nothing is audited for either."""
    before = served.head_seq()
    for bad in (b"%FF%FE%FD%FC", b"%C3%28%A0%A1"):
        status, headers, body = _raw_get(served, b"/v1/patients/" + bad + b"/episodes")
        assert status == 400, body
        assert headers["content-type"].startswith("application/problem+json")
        assert json.loads(body)["detail"] == "the URL path is not valid UTF-8"
    assert served.head_seq() == before  # refused before any governed call
    status, _, _ = _raw_get(served, f"/v1/patients/{OWN}/episodes".encode())
    assert status == 200


def test_a_405_answer_names_the_allowed_methods(served: Served) -> None:
    """A wrong method on a known path is 405 with Allow listing every method of that path."""
    r = httpx.put(f"{served.url}/v1/consents", headers=served.headers("admin"))
    assert r.status_code == 405, r.text
    assert r.headers["allow"] == "GET, POST"
    assert r.json()["type"] == "urn:msm-mem:problem:method-not-allowed"
    r = httpx.delete(f"{served.url}/v1/patients/{OWN}/episodes", headers=served.headers("admin"))
    assert r.status_code == 405 and r.headers["allow"] == "GET"


def test_a_question_with_an_escape_code_is_refused_naming_the_character(served: Served) -> None:
    """An ESC in a question sent to /ask is a 422 invalid-input problem naming U+001B."""
    r = httpx.post(
        f"{served.url}/v1/patients/{OWN}/ask",
        headers=served.headers("agent"),
        data={"question": "What \x1b[2J is seen?"},
        files={"image": ("x.png", _png_bytes(7), "image/png")},
    )
    assert r.status_code == 422, r.text
    assert "question must not contain a control character (found U+001B)" in r.json()["detail"]

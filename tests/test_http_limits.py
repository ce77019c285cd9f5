"""Bounded work per request in the service: request rates per client address and per
credential (429 with Retry-After), failed logins audited and, past a count, refused without a
hash (429), oversized or malformed images refused before decoding (422), and a request that
finds no free decoder in time answered 503. Real ``msm-mem serve`` processes; clients on
other loopback addresses (127.0.0.2, ...) stand for other hosts."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from msm_mem import InvalidInput, MsmMem, Principal
from msm_mem.interfaces.auth.apikeys import ApiKeyStore
from msm_mem.interfaces.http.app import create_app
from msm_mem.interfaces.http.config import ServeConfig
from tests.helpers import ADMIN, AUDITOR
from tests.http_support import OWN, QUESTION, Served, make_store, start, stop
from tests.test_image_headers import png_of

pytestmark = pytest.mark.system

TOO_MANY = "urn:msm-mem:problem:too-many-requests"


def _from(address: str) -> httpx.Client:
    """A client whose connections leave from ``address`` (another loopback address)."""
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=30)


def _png(size: tuple[int, int] = (64, 64)) -> bytes:
    buf = io.BytesIO()
    arr = np.random.default_rng(3).integers(0, 256, (size[1], size[0]), dtype=np.uint8)
    Image.fromarray(arr, mode="L").save(buf, "PNG")
    return buf.getvalue()


def _is_429(r: httpx.Response) -> None:
    assert r.status_code == 429, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["type"] == TOO_MANY
    assert 1 <= int(r.headers["retry-after"]) <= 120


@pytest.fixture(scope="module")
def address_limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A server allowing one request per address per 20 s (its readiness probe used 127.0.0.1's)."""
    root = tmp_path_factory.mktemp("per-address")
    served = start(root, make_store(root), extra=["--rate-per-address", "0.05"])
    yield served
    stop(served)


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A server allowing one request per credential per 20 s, 3 failed logins per address and
    images of up to 8192 pixels a side."""
    root = tmp_path_factory.mktemp("per-credential")
    served = start(
        root,
        make_store(root),
        extra=["--rate-per-credential", "0.05", "--max-login-failures", "3", "--max-image-side", "8192"],
    )
    yield served
    stop(served)


def test_an_address_past_its_rate_is_answered_429_and_others_are_not(address_limited: Served) -> None:
    """The second request of an address within its window is 429 with Retry-After, before its
    credential is looked at; another address is served."""
    url = address_limited.url + "/v1/whoami"
    with _from("127.0.0.2") as client:
        assert client.get(url, headers=address_limited.headers("agent")).status_code == 200
        _is_429(client.get(url, headers=address_limited.headers("agent")))
        _is_429(client.get(url))  # no credential: refused for the rate all the same
    with _from("127.0.0.3") as client:
        assert client.get(url, headers=address_limited.headers("agent")).status_code == 200


def test_a_credential_past_its_rate_is_answered_429_and_other_keys_are_not(limited: Served) -> None:
    """A key's second request within its window is 429 with Retry-After, from any address;
    another key is served."""
    url = limited.url + "/v1/whoami"
    with _from("127.0.0.4") as client:
        assert client.get(url, headers=limited.headers("agent")).status_code == 200
    with _from("127.0.0.5") as client:
        _is_429(client.get(url, headers=limited.headers("agent")))
        assert client.get(url, headers=limited.headers("critic")).status_code == 200


def test_failed_logins_are_audited_then_the_address_waits(limited: Served) -> None:
    """Three wrong secrets from one address: three 401s, each an audit event (actor
    unauthenticated, outcome denied, no patient); the fourth attempt, and even a good key never
    verified before, is 429 without an event; another address still logs in."""
    url = limited.url + "/v1/whoami"
    wrong = limited.tokens["system"][:-6] + "AAAAAA"
    since = limited.head_seq()
    with _from("127.0.0.6") as client:
        for headers in ({"Authorization": f"Bearer {wrong}"}, {}, {"Authorization": "Basic abc"}):
            assert client.get(url, headers=headers).status_code == 401
        _is_429(client.get(url, headers={"Authorization": f"Bearer {wrong}"}))
        _is_429(client.get(url, headers=limited.headers("auditor")))
    failures = [e for e in limited.audit_events(since) if e["action"] == "authenticate"]
    assert [(e["actor"], e["outcome"], e["patient"]) for e in failures] == [("unauthenticated", "denied", "")] * 3
    assert [e["reason"] for e in failures] == ["bad credential api-key", "bad credential none", "bad credential other"]
    assert wrong not in limited.log.read_text()
    with _from("127.0.0.7") as client:
        assert client.get(url, headers=limited.headers("auditor")).status_code == 200


def test_the_reviewers_png_and_a_corrupt_png_are_refused_before_decoding(limited: Served) -> None:
    """The 8192x4096 16-bit RGBA PNG (268 MB decoded) is a 422 naming the decoded-image
    budget; a PNG whose IDAT fails its CRC and one cut before IEND are 422; nothing is stored."""
    url = limited.url + f"/v1/patients/{OWN}/observe"
    good = _png()
    idat = good.index(b"IDAT")
    crc = good[: idat + 8] + bytes([good[idat + 8] ^ 0x01]) + good[idat + 9 :]
    cases = [
        ("clinician", png_of(8192, 4096, 16, 6), "decoded-image budget of 67,108,864 bytes"),
        ("everyone", crc, "fails its CRC"),
        ("system", good[:-12], "without its IEND"),
    ]  # one key each: this server allows a key one request per 20 s
    with _from("127.0.0.8") as client:
        for role, data, detail in cases:
            before = limited.head_seq()
            r = client.post(
                url, headers=limited.headers(role), files={"image": ("x.png", data)}, data={"question": QUESTION}
            )
            assert r.status_code == 422, r.text
            assert r.json()["type"] == "urn:msm-mem:problem:image-error" and detail in r.json()["detail"]
            assert limited.head_seq() == before


def test_an_upload_waiting_too_long_for_a_decoder_is_503(tmp_path: Path) -> None:
    """With every decoder slot taken, an upload waits decode_wait_s and is answered 503
    (server-busy, Retry-After); once a slot is free it is decoded and stored."""
    MsmMem.init(tmp_path / "s", ADMIN).close()
    token, _ = ApiKeyStore.of_store(tmp_path / "s").create(Principal("c", "clinician", "treatment"), ["*"])
    app = create_app(ServeConfig(tmp_path / "s", max_decodes=1, decode_wait_s=0.05))
    headers = {"Authorization": f"Bearer {token}"}
    with TestClient(app) as client:
        slots = app.state.server.throttle.decodes
        assert slots.acquire(timeout=5)
        try:
            r = client.post(
                "/v1/patients/P1/observe",
                headers=headers,
                files={"image": ("a.png", _png())},
                data={"question": QUESTION},
            )
        finally:
            slots.release()
        assert r.status_code == 503, r.text
        assert r.json()["type"] == "urn:msm-mem:problem:server-busy" and r.headers["retry-after"] == "1"
        r = client.post(
            "/v1/patients/P1/observe", headers=headers, files={"image": ("a.png", _png())}, data={"question": QUESTION}
        )
        assert r.status_code == 201, r.text


@pytest.mark.parametrize("name", ["rate_per_credential", "rate_per_address", "decode_wait_s", "login_window_s"])
@pytest.mark.parametrize("value", [-1, True, "5", float("nan")])
def test_a_bad_rate_setting_is_refused_by_name(tmp_path: Path, name: str, value: object) -> None:
    with pytest.raises(InvalidInput, match=name):
        ServeConfig(tmp_path, **{name: value})  # type: ignore[arg-type]


def test_a_failed_login_is_one_audit_event_naming_no_patient(tmp_path: Path) -> None:
    """MsmMem.refuse_login writes one event (authenticate, denied, actor unauthenticated, no
    patient) that the chain verifies; an unknown credential kind is refused, nothing written."""
    with MsmMem.init(tmp_path / "s", ADMIN) as mem:
        before = mem.audit_trail(AUDITOR).events
        mem.refuse_login("jwt")
        with pytest.raises(InvalidInput, match="credential kind"):
            mem.refuse_login("msmk_0123_secret")
        after = mem.audit_trail(AUDITOR).events
        new = [e for e in after[len(before) :] if e.action != "audit_read"]  # (the read of the trail)
        assert [(e.action, e.outcome, e.actor, e.patient, e.reason) for e in new] == [
            ("authenticate", "denied", "unauthenticated", "", "bad credential jwt")
        ]
        assert mem.verify_audit(AUDITOR).ok

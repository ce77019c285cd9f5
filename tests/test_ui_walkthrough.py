"""The explorer's server side, in process: walkthrough frames built from a store's real audit
events (and what they say when an event is missing), the GIF, and the explorer's endpoints
and files (scope, roles, validation, security headers)."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from PIL import Image

from msm_mem import MsmMem, Principal
from msm_mem.interfaces.auth.apikeys import ApiKeyStore
from msm_mem.interfaces.http.app import create_app
from msm_mem.interfaces.http.config import ServeConfig
from msm_mem.interfaces.http.ui.gif import render_gif
from msm_mem.interfaces.http.ui.walkthrough import build
from tests.helpers import AUDITOR
from tests.http_support import OTHER, OWN
from tests.ui_support import make_explorer_store

TTL = 86_400.0


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_explorer_store(tmp_path_factory.mktemp("walk"))


@pytest.fixture(scope="module")
def client(store: Path) -> Iterator[tuple[TestClient, dict[str, str]]]:
    keys = ApiKeyStore.of_store(store)
    tokens = {
        "clinician": keys.create(Principal("ui-clin", "clinician", "treatment"), [OWN])[0],
        "auditor": keys.create(Principal("ui-aud", "auditor", "audit"), ["*"])[0],
    }
    with TestClient(create_app(ServeConfig(store))) as c:
        yield c, {k: f"Bearer {v}" for k, v in tokens.items()}


def test_the_question_walkthrough_replays_the_latest_ask(store: Path) -> None:
    """Five frames from the latest ask turn: its consent, its STM write, its reads, the chain
    of its events and the gate's outcome, each with the events it rests on."""
    with MsmMem.open(store) as mem:
        events = mem.audit_trail(AUDITOR).events
    w = build("question", events, TTL, decay_visible=True)
    assert w.complete and [f.step for f in w.frames] == [1, 2, 3, 4, 5]
    write = [e for e in events if e.action == "write"]
    asked = [e for e in write if any(r.action == "read" and r.seq in (e.seq + 1, e.seq + 2) for r in events)][-1]
    assert w.frames[1].events[0].seq == asked.seq and asked.record_ids[0][:12] in w.frames[1].caption
    assert {e.action for e in w.frames[2].events} == {"read"}
    chain = w.frames[3].events
    assert all(b.prev_hash == a.event_hash for a, b in zip(chain, chain[1:], strict=False))
    assert w.frames[0].active == ["agent"] and "audit" in w.frames[3].active


def test_the_movement_walkthrough_and_what_a_patients_reader_sees(store: Path) -> None:
    """Write, consolidate, supersede, decay from real events; a care role's patient-scoped
    events hold the expiry but not the decay (anonymised records name no patient)."""
    with MsmMem.open(store) as mem:
        everything = mem.audit_trail(AUDITOR).events
        own = mem.audit_trail(Principal("dr-x", "clinician", "treatment"), OWN).events
    w = build("movement", everything, TTL, decay_visible=True)
    assert w.complete
    assert [f.title for f in w.frames] == [
        "A new piece of evidence shows up",
        "Write to STM",
        "STM to LTM consolidation",
        "Supersession",
        "Decay",
    ]
    assert w.frames[3].events[0].action == "critic_reject"
    assert "anonymised in place" in w.frames[4].caption and any(e.action == "decay" for e in w.frames[4].events)
    mine = build("movement", own, TTL, decay_visible=False)
    assert "name no patient" in mine.frames[4].caption
    assert not any(e.action == "decay" for e in mine.frames[4].events)


def test_a_step_without_an_event_says_so() -> None:
    """An empty store: every frame is marked missing and says how to produce its event."""
    for name in ("question", "movement"):
        w = build(name, [], TTL, decay_visible=True)
        assert not w.complete and len(w.frames) == 5
        assert all(f.missing and "no " in f.caption and not f.events for f in w.frames)


def test_the_gif_has_one_frame_per_step(store: Path) -> None:
    """Five distinct frames, each shown the chosen time, looping."""
    with MsmMem.open(store) as mem:
        events = mem.audit_trail(AUDITOR).events
    data = render_gif(build("question", events, TTL, decay_visible=True), 4.5)
    with Image.open(io.BytesIO(data)) as gif:
        assert gif.n_frames == 5 and gif.info["duration"] == 4500 and gif.info.get("loop") == 0


def test_the_endpoints_keep_scope_and_roles(client: tuple[TestClient, dict[str, str]]) -> None:
    """Thumbnails for the clinician's patient only, never for the auditor; a care role's
    walkthrough needs its patient; bad input is a 422 problem; the GIF is a GIF."""
    c, auth = client
    r = c.get(f"/v1/patients/{OWN}/thumbnails?size=64", headers={"Authorization": auth["clinician"]})
    assert r.status_code == 200 and len(r.json()["items"]) == 4
    with Image.open(io.BytesIO(base64.b64decode(r.json()["items"][0]["png_base64"]))) as im:
        assert max(im.size) <= 64
    assert c.get(f"/v1/patients/{OTHER}/thumbnails", headers={"Authorization": auth["clinician"]}).status_code == 403
    assert c.get(f"/v1/patients/{OWN}/thumbnails", headers={"Authorization": auth["auditor"]}).status_code == 403
    assert c.get("/v1/walkthroughs/question", headers={"Authorization": auth["clinician"]}).status_code == 422
    assert (
        c.get(f"/v1/walkthroughs/question?patient_id={OTHER}", headers={"Authorization": auth["clinician"]}).status_code
        == 403
    )
    assert c.get("/v1/walkthroughs/other", headers={"Authorization": auth["auditor"]}).status_code == 422
    assert (
        c.get("/v1/walkthroughs/movement/gif?seconds=2", headers={"Authorization": auth["auditor"]}).status_code == 422
    )
    gif = c.get("/v1/walkthroughs/movement/gif?seconds=6", headers={"Authorization": auth["auditor"]})
    assert gif.status_code == 200 and gif.headers["content-type"] == "image/gif" and gif.content[:6] == b"GIF89a"
    assert c.get("/v1/walkthroughs/movement").status_code == 401
    events = c.get("/v1/audit/events?limit=5", headers={"Authorization": auth["auditor"]}).json()
    assert [e["seq"] for e in events["events"]] == [1, 2, 3, 4, 5] and events["next_after"] == 5


def test_the_page_and_its_files_come_from_the_package(client: tuple[TestClient, dict[str, str]]) -> None:
    """/ui and its listed files need no credential, carry a strict CSP and name no CDN; any
    other name is a 404."""
    c, _ = client
    page = c.get("/ui")
    assert page.status_code == 200 and "default-src 'none'" in page.headers["content-security-policy"]
    assert page.headers["x-frame-options"] == "DENY" and "http" not in page.text.replace("http-equiv", "")
    for name in ("app.js", "views.js", "walkthrough.js", "app.css", "icon.svg"):
        r = c.get(f"/ui/static/{name}")
        assert r.status_code == 200 and "https://" not in r.text, name
    assert c.get("/ui/static/endpoints.py").status_code == 404
    assert c.get("/ui/static/..%2Fpages.py").status_code == 404
    assert "/ui" not in c.get("/openapi.json").json()["paths"]


def test_the_question_walkthrough_names_the_model_and_skips_a_context(tmp_path: Path) -> None:
    """The last frame names the model that answered; a context handed out later (no answer)
    is not taken for the latest question."""
    from tests.helpers import AGENT, png

    store = make_explorer_store(tmp_path)
    with MsmMem.open(store) as mem:
        image = str(png(tmp_path, 77))
        mem.ask(AGENT, OWN, image, "What is the impression?")
        mem.context(AGENT, OWN, image, "Any change?")
        events = mem.audit_trail(AUDITOR).events
    w = build("question", events, TTL, decay_visible=True)
    assert w.complete and "The model nonparametric answered" in w.frames[4].caption
    assert "answer" in {e.action for e in w.frames[4].events}
    assert "context" not in {e.action for e in w.frames[3].events}

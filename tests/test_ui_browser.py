"""The memory explorer in a real browser: headless Chromium (Debian's package) driven by
Playwright against a real ``msm-mem serve`` process on a loopback port. Each role signs in and
walks its views; an auditor sees no PHI on the page nor in any response; a clinician cannot open
another patient; a walkthrough steps by keyboard, dots and Play; its GIF has the frames.

With ``MSM_MEM_SCREENSHOTS=DIR`` the tests also save the screenshots of the README (1280x800
and 390x844) into DIR (``make screenshots`` writes ``docs/screenshots/``)."""

from __future__ import annotations

import io
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from msm_mem import AccessDenied, MemoryClient
from tests.helpers import raw_sql
from tests.http_support import OTHER, OWN, Served, stop
from tests.ui_support import OLD, PHI_MRN, PHI_NAME, PHI_QUESTION, serve_explorer

pytestmark = pytest.mark.system

playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the test extra")

DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
SHOTS = os.environ.get("MSM_MEM_SCREENSHOTS", "")


def _chromium() -> str:
    for name in (os.environ.get("MSM_MEM_CHROMIUM", ""), "chromium", "chromium-browser"):
        found = shutil.which(name) if name else None
        if found:
            return found
    pytest.skip("no chromium on PATH (apt-get install chromium; `make test` installs it as root)")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, dict[str, str]]]:
    served, tokens = serve_explorer(tmp_path_factory.mktemp("explorer"))
    yield served, tokens
    stop(served)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    path = _chromium()
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


class Tab:
    """One signed-in page, with every response body it received (for the PHI checks)."""

    def __init__(self, browser: Any, served: Served, token: str, viewport: dict[str, int] = DESKTOP) -> None:
        self.context = browser.new_context(viewport=viewport, accept_downloads=True)
        self.page = self.context.new_page()
        self.bodies: list[bytes] = []
        self.errors: list[str] = []
        self.page.on("response", self._keep)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.url = served.url
        self.page.goto(served.url + "/ui")
        self.page.fill("#token", token)
        self.page.click("#login-form button[type=submit]")
        self.page.wait_for_selector("#nav a")

    def _keep(self, response: Any) -> None:
        try:
            self.bodies.append(response.body())
        except Exception:  # a redirect or an aborted request has no body to read
            pass

    def view(self, hash_: str, ready: str) -> Any:
        self.page.evaluate("h => { location.hash = h; }", hash_)
        self.page.wait_for_selector(ready)
        self.page.wait_for_selector("[aria-busy=true]", state="detached")
        return self.page

    def text(self) -> str:
        return str(self.page.inner_text("body"))

    def snap(self, name: str) -> None:
        if SHOTS:
            Path(SHOTS).mkdir(parents=True, exist_ok=True)
            self.page.wait_for_timeout(400)  # let the tier boxes finish their colour transition
            self.page.screenshot(path=str(Path(SHOTS) / f"{name}.png"))

    def close(self) -> None:
        assert not self.errors, self.errors
        self.context.close()


def _unnamed(page: Any) -> list[str]:
    """Controls without an accessible name (aria-label, a label, or their text)."""
    return list(
        page.evaluate(
            """() => [...document.querySelectorAll('button, a[href], input, select, textarea, [tabindex]')]
              .filter(el => el.offsetParent !== null || el === document.activeElement)
              .filter(el => !(el.getAttribute('aria-label') || el.getAttribute('aria-labelledby')
                 || (el.labels && el.labels.length) || el.textContent.trim() || el.getAttribute('title')))
              .map(el => el.outerHTML.slice(0, 80))"""
        )
    )


def test_a_clinician_sees_the_timeline_of_its_patient(site: tuple[Served, dict[str, str]], browser: Any) -> None:
    """Studies with thumbnails, the claim's supersession chain, semantic versions and STM items
    with their expiry; no control lacks an accessible name; the phone layout does not scroll
    sideways."""
    served, tokens = site
    tab = Tab(browser, served, tokens["clinician"])
    page = tab.view(f"#/timeline/{OWN}", "#sec-studies")
    assert page.locator("article.study").count() == 4
    assert page.locator("article.study img[src^='data:image/png;base64,']").count() == 4
    s4 = page.locator("article.study", has_text="Study S4")
    # the agent's answer about S4 was held by the gate (no claim); the critic's verdict started the chain
    assert "Claim on “Any pneumonia?” and its supersession chain (1)" in s4.inner_text()
    assert s4.locator(".chain li.superseded").count() == 0 and s4.locator(".chain li.active").count() == 1
    assert "Left basal effusion, no consolidation." in s4.inner_text()
    versions = page.locator("#sec-semantic-state-versions").locator("xpath=..").locator("tbody tr")
    assert versions.count() >= 4 and "active" in versions.first.inner_text()
    stm = page.locator("#sec-short-term-memory").locator("xpath=..").locator("tbody tr")
    active = stm.filter(has_text="active")
    assert active.count() == 1 and "(in " in active.inner_text() and PHI_QUESTION in active.inner_text()
    assert stm.filter(has_text="expired").count() >= 1
    assert _unnamed(page) == []
    tab.snap("timeline-desktop")
    tab.close()
    phone = Tab(browser, served, tokens["clinician"], PHONE)
    page = phone.view(f"#/timeline/{OWN}", "#sec-studies")
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    phone.snap("timeline-phone")
    phone.close()


def test_a_clinician_cannot_open_another_patient(site: tuple[Served, dict[str, str]], browser: Any) -> None:
    """Another patient's timeline is refused (403, audited as a denial) and nothing of it shows."""
    served, tokens = site
    before = served.head_seq()
    tab = Tab(browser, served, tokens["clinician"])
    page = tab.view(f"#/timeline/{OTHER}", ".problem")
    assert "Refused" in page.inner_text(".problem")
    assert "Normal chest." not in tab.text() and not page.locator("article.study").count()
    assert all(b"Normal chest." not in b for b in tab.bodies)
    denials = [e for e in served.audit_events(before) if e["outcome"] == "denied" and e["actor"] == "dr-vance"]
    assert denials
    tab.close()


def test_the_evidence_trail_shows_scores_factors_and_what_the_answer_used(
    site: tuple[Served, dict[str, str]], browser: Any
) -> None:
    """Asking about a stored study lists every retrieved memory with its score and composite_k
    factors (as the API returned them) and marks the ones the answer cites."""
    served, tokens = site
    tab = Tab(browser, served, tokens["clinician"])
    page = tab.view(f"#/evidence/{OWN}", "form.ask")
    page.select_option("#ask-study", "S2")
    with page.expect_response(lambda r: r.url.endswith("/ask")) as got:
        page.click("form.ask button[type=submit]")
    answer = got.value.json()
    page.wait_for_selector("#answer-title")
    rows = page.locator("table tbody tr")
    assert rows.count() == len(answer["evidence"]) > 0
    assert answer["cited"] and set(answer["cited"]) <= {e["id"] for e in answer["evidence"]}
    assert page.locator("tr.used").count() == len(set(answer["cited"]))
    first = answer["evidence"][0]
    text = rows.first.inner_text()
    assert f"{first['score']:.3f}" in text and f"{first['freshness']:.3f}" in text and first["evidence_tier"] in text
    assert page.inner_text(".answer-text") == answer["answer"]
    tab.snap("evidence-desktop")
    tab.close()


def _step(page: Any, panel: str) -> int:
    return int(page.get_attribute(panel, "data-step"))


def _until_step(page: Any, panel: str, step: int) -> None:
    """Wait (at most 15 s, polled: the page's CSP forbids evaluated predicates) for ``step``."""
    page.wait_for_selector(f"{panel}[data-step='{step}']", timeout=15000)


def test_a_walkthrough_steps_by_keyboard_dots_and_play(site: tuple[Served, dict[str, str]], browser: Any) -> None:
    """Replayed from the store's own events: step 2 names the STM item the latest question wrote;
    left/right move, the dots jump, Space plays and pauses, Play advances on its own."""
    served, tokens = site
    tab = Tab(browser, served, tokens["auditor"])
    page = tab.view("#/walkthroughs", "#walk-question")
    q = "#walk-question"
    events = served.audit_events()
    # the STM writes of asks: each is followed by the turn's ranked reads
    asks = [e for e, n in zip(events, events[1:], strict=False) if e["action"] == "write" and n["action"] == "read"]
    page.focus(q)
    assert _step(page, q) == 1
    page.keyboard.press("ArrowRight")
    assert _step(page, q) == 2
    caption = page.inner_text(f"{q} .caption")
    assert str(asks[-1]["record_ids"][0])[:12] in caption and f"#{asks[-1]['seq']}" in caption
    page.keyboard.press("ArrowLeft")
    page.keyboard.press("ArrowLeft")
    assert _step(page, q) == 5
    page.click(f"{q} .dot >> nth=2")
    assert _step(page, q) == 3
    assert "ranked reads" in page.inner_text(f"{q} .caption")
    page.focus(q)
    page.keyboard.press(" ")
    assert page.get_attribute(q, "data-playing") == "true"
    _until_step(page, q, 4)
    page.keyboard.press(" ")
    assert page.get_attribute(q, "data-playing") == "false"
    m = "#walk-movement"
    page.click(f"{m} button[aria-label='Play']")
    _until_step(page, m, 2)
    page.click(f"{m} button[aria-label='Pause']")
    titles = []
    for i in range(5):
        page.click(f"{m} .dot >> nth={i}")
        titles.append(page.inner_text(f"{m} .step-line"))
    assert [t.split(" — ")[1].split("\n")[0] for t in titles] == [
        "A new piece of evidence shows up",
        "Write to STM",
        "STM to LTM consolidation",
        "Supersession",
        "Decay",
    ]
    assert "anonymised in place" in page.inner_text(f"{m} .caption")
    assert _unnamed(page) == []
    page.click(f"{q} .dot >> nth=2")
    page.locator(q).scroll_into_view_if_needed()
    tab.snap("walkthrough-desktop")
    tab.close()
    phone = Tab(browser, served, tokens["clinician"], PHONE)
    page = phone.view(f"#/walkthroughs/{OWN}", "#walk-movement")
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    page.click("#walk-movement .dot >> nth=3")
    page.locator("#walk-movement").scroll_into_view_if_needed()
    phone.snap("walkthrough-phone")
    phone.close()


def test_the_walkthrough_gif_has_the_frames(site: tuple[Served, dict[str, str]], browser: Any) -> None:
    """The downloaded GIF is rendered by the server: five frames at the chosen speed."""
    served, tokens = site
    tab = Tab(browser, served, tokens["clinician"])
    page = tab.view(f"#/walkthroughs/{OWN}", "#walk-movement")
    page.select_option("#walk-movement-speed", "5")
    with page.expect_download() as got:
        page.click("#walk-movement button:has-text('Download animated GIF')")
    data = Path(got.value.path()).read_bytes()
    with Image.open(io.BytesIO(data)) as gif:
        assert gif.format == "GIF" and gif.n_frames == 5
        assert gif.info["duration"] == 5000
        frames = []
        for i in range(gif.n_frames):
            gif.seek(i)
            frames.append(gif.convert("RGB").tobytes())
    assert len(set(frames)) == 5, "each step is its own picture"
    tab.close()


def test_an_auditor_sees_the_audit_view_and_no_phi(site: tuple[Served, dict[str, str]], browser: Any) -> None:
    """Verification, checkpoints and events, the FHIR export; neither the page text nor any
    response holds a patient id, a name, an MRN or narrative text; patient data is refused."""
    served, tokens = site
    tab = Tab(browser, served, tokens["auditor"])
    page = tab.view("#/audit", ".verdict")
    assert "Chain verified" in page.inner_text(".verdict")
    assert page.locator("#sec-signed-checkpoints").locator("xpath=..").locator("tbody tr").count() >= 1
    assert page.locator("#sec-latest-events-of-" + str(served.head_seq() - 1)).count() <= 1
    with page.expect_download() as got:
        page.click("button:has-text('Download FHIR AuditEvent export')")
    fhir = Path(got.value.path()).read_bytes()
    assert fhir.count(b"\n") >= 50 and b"AuditEvent" in fhir
    tab.snap("audit-desktop")
    tab.view("#/walkthroughs", "#walk-movement")
    for panel in ("#walk-question", "#walk-movement"):
        for i in range(5):
            page.click(f"{panel} .dot >> nth={i}")
            tab.bodies.append(page.inner_text(panel).encode())
    tab.view(f"#/timeline/{OWN}", "#view")  # not one of its views: it falls back to its own
    secrets = [PHI_NAME, PHI_MRN, OWN, OTHER, OLD, "Right lower lobe", "effusion", "pneumonia"]
    text = tab.text()
    for s in secrets:
        assert s not in text, s
        assert all(s.encode() not in b for b in tab.bodies + [fhir]), s
    tab.close()
    phone = Tab(browser, served, tokens["auditor"], PHONE)
    page = phone.view("#/audit", ".verdict")
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    phone.snap("audit-phone")
    phone.close()


def test_each_role_sees_its_own_views(site: tuple[Served, dict[str, str]], browser: Any) -> None:
    """The views offered follow the role: care roles the patient's memory, the audit roles the
    audit tier (an admin's audit view verifies the chain too)."""
    served, tokens = site
    expected = {
        "clinician": ["timeline", "evidence", "walkthroughs"],
        "critic": ["timeline", "walkthroughs"],
        "auditor": ["walkthroughs", "audit"],
        "admin": ["walkthroughs", "audit"],
    }
    for role, views in expected.items():
        tab = Tab(browser, served, tokens[role])
        assert [a.get_attribute("data-view") for a in tab.page.locator("#nav a").all()] == views, role
        tab.close()
    tab = Tab(browser, served, tokens["admin"])
    page = tab.view("#/audit", ".verdict")
    assert "Chain verified" in page.inner_text(".verdict")
    tab.close()


def test_the_explorer_works_with_the_keyboard_alone(site: tuple[Served, dict[str, str]], browser: Any) -> None:
    """Sign in, switch views and play a walkthrough with Tab, Enter and Space only; the page's
    own files come from the server under a strict Content-Security-Policy."""
    served, tokens = site
    ctx = browser.new_context(viewport=DESKTOP)
    page = ctx.new_page()
    response = page.goto(served.url + "/ui")
    assert "script-src 'self'" in response.headers["content-security-policy"]
    page.keyboard.press("Tab")  # the skip link
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.id") == "token"
    page.keyboard.type(tokens["critic"])
    page.keyboard.press("Enter")
    page.wait_for_selector("#nav a")
    for _ in range(30):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.textContent") == "Walkthroughs":
            break
    page.keyboard.press("Enter")
    page.wait_for_selector("#walk-question")
    page.wait_for_selector("[aria-busy=true]", state="detached")
    for _ in range(30):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.id") == "walk-question":
            break
    page.keyboard.press("ArrowRight")
    assert _step(page, "#walk-question") == 2
    assert page.get_attribute("#nav a[aria-current=page]", "data-view") == "walkthroughs"
    scripts = [s.get_attribute("src") for s in page.locator("script").all()]
    assert scripts and all(s.startswith("/ui/static/") for s in scripts)
    ctx.close()


def test_the_client_reads_the_audit_trail(site: tuple[Served, dict[str, str]]) -> None:
    """MemoryClient.audit_trail: the auditor pages the chain, the clinician reads its patient's
    events only, another patient is refused."""
    served, tokens = site
    with MemoryClient(served.url, tokens["auditor"]) as auditor:
        page = auditor.audit_trail(limit=5)
        assert [e.seq for e in page.events] == [1, 2, 3, 4, 5] and page.next_after == 5
        assert page.checkpoints and page.head_seq > page.next_after  # a first page of a longer chain
    with MemoryClient(served.url, tokens["clinician"]) as clinician:
        mine = clinician.audit_trail(OWN, tail=True, limit=50)
        assert mine.events and len({e.patient for e in mine.events}) == 1
        with pytest.raises(AccessDenied):
            clinician.audit_trail(OTHER)


def test_the_audit_view_names_the_first_broken_link(site: tuple[Served, dict[str, str]], browser: Any) -> None:
    """After one stored event is edited, the auditor's page says the chain is broken and at
    which event (runs last: it breaks the module's store)."""
    served, tokens = site
    raw_sql(
        served.directory,
        "UPDATE audit SET payload = CAST(replace(CAST(payload AS TEXT), 'success', 'denied') AS BLOB) WHERE seq = 7",
    )
    tab = Tab(browser, served, tokens["auditor"])
    page = tab.view("#/audit", ".verdict")
    verdict = page.inner_text(".verdict")
    assert "Chain broken" in verdict and "event #7" in verdict
    assert page.locator("button:has-text('Download FHIR AuditEvent export')").count() == 1
    tab.close()

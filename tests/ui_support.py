"""A store for the memory explorer's browser tests and screenshots: every tier transition of the
walkthroughs happened in it (ask, observe, consolidate, critic correction, STM expiry, decay),
identifiable text seeded into a clinician's question, and a real server over it."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageFilter

from msm_mem import FixedClock, ManifestRow, MsmMem, Principal
from msm_mem.interfaces.auth.apikeys import ApiKeyStore
from tests.helpers import ADMIN, CLINICIAN, CRITIC, INGEST, SYSTEM
from tests.http_support import OTHER, OWN, Served, start

#: a patient whose records are old enough to decay when maintenance runs
OLD = "PAT-OLD-3"
#: identifiable text a clinician typed into a question: the auditor must never see it
PHI_NAME, PHI_MRN = "Johnathan Smithers", "MRN 4471-2290"
PHI_QUESTION = f"Follow-up film for {PHI_NAME}, {PHI_MRN}: any change?"
DAY = 86_400.0
YEAR = 365.25 * DAY


def radiograph(path: Path, seed: int, size: int = 192) -> Path:
    """A chest-film-like grayscale PNG (two dark lung fields, a spine, a little noise per seed)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size] / size
    img = 0.82 - 0.25 * ((x - 0.5) ** 2 + (y - 0.45) ** 2)
    for cx in (0.31, 0.69):
        lung = ((x - cx) / 0.16) ** 2 + ((y - 0.5) / 0.3) ** 2 < 1
        img = np.where(lung, 0.22 + 0.08 * rng.random() + 0.1 * (y - 0.2), img)
    img = np.where(np.abs(x - 0.5) < 0.035, 0.9, img)
    blob = ((x - rng.uniform(0.25, 0.75)) / 0.07) ** 2 + ((y - rng.uniform(0.5, 0.75)) / 0.06) ** 2 < 1
    img = np.where(blob, img + 0.25, img) + rng.normal(0, 0.02, img.shape)
    pil = Image.fromarray((np.clip(img, 0, 1) * 255).astype(np.uint8), mode="L").filter(ImageFilter.GaussianBlur(1.5))
    pil.save(path)
    return path


def make_explorer_store(root: Path) -> Path:
    """The store: OLD ingested eleven years ago (past the ten-year retention: it decays); OWN's
    three studies, a question written back, an explicit consolidation, a critic's correction, an
    STM item left to expire, maintenance (expiry and decay); then a pending STM item holding
    identifiable text. Times are set by a fixed clock that ends about now, so the server's clock
    continues from it."""
    images = root / "images"
    images.mkdir(parents=True, exist_ok=True)
    now = time.time()
    clock = FixedClock(now - 11 * YEAR)
    directory = root / "store"

    def row(patient: str, study: str, when: float, seed: int, answer: str) -> ManifestRow:
        return ManifestRow(
            patient, study, when, str(radiograph(images / f"{study}.png", seed)), "What is the impression?", answer
        )

    with MsmMem.init(directory, ADMIN, clock=clock) as mem:
        mem.ingest(INGEST, [row(OLD, "S-OLD", clock.now(), 90, "Clear lungs, no acute process.")])
        clock.advance(11 * YEAR - 3 * DAY)
        base = clock.now()
        answers = [
            "Right lower lobe consolidation.",
            "Right lower lobe consolidation, improving.",
            "Small left effusion.",
        ]
        mem.ingest(INGEST, [row(OWN, f"S{i + 1}", base - (30 - 10 * i) * DAY, i + 1, a) for i, a in enumerate(answers)])
        mem.ingest(INGEST, [row(OTHER, "S-X", base - 5 * DAY, 40, "Normal chest.")])
        clock.advance(3600)
        mem.ask(CLINICIAN, OWN, str(radiograph(images / "S4.png", 4)), "Any pneumonia?", study_id="S4")
        clock.advance(3600)
        item = mem.observe(CLINICIAN, OWN, str(radiograph(images / "S5.png", 5)), "Interval change?", study_id="S5")
        mem.consolidate(CLINICIAN, OWN, item.item_id, "Stable right lower lobe consolidation, no new effusion.")
        clock.advance(3600)
        mem.feedback(CRITIC, OWN, "S4", accept=False, correction="Left basal effusion, no consolidation.")
        mem.observe(CLINICIAN, OWN, str(radiograph(images / "S6.png", 6)), "Quick look?", study_id="S6")
        clock.advance(2 * DAY)
        mem.maintain(SYSTEM)
        clock.set(max(clock.now(), time.time()))
        mem.observe(CLINICIAN, OWN, str(radiograph(images / "S7.png", 7)), PHI_QUESTION, study_id="S7")
    return directory


def serve_explorer(root: Path) -> tuple[Served, dict[str, str]]:
    """The server over a fresh explorer store, and a key per role: the care roles scoped to OWN,
    the auditor and the admin to every patient (their scope names no patient)."""
    directory = make_explorer_store(root)
    keys = ApiKeyStore.of_store(directory)
    tokens = {
        "clinician": keys.create(Principal("dr-vance", "clinician", "treatment"), [OWN])[0],
        "critic": keys.create(Principal("report-signer", "critic", "treatment"), [OWN])[0],
        "auditor": keys.create(Principal("auditor-kim", "auditor", "audit"), ["*"])[0],
        "admin": keys.create(Principal("admin-lee", "admin", "operations"), ["*"])[0],
    }
    return start(root, directory), tokens

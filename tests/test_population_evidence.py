"""Tests of evidence for a new patient: the population memories that drove the answer are its
evidence (de-identified, consented), never an empty list when the answer came from memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from msm_mem import ConsentRecord, ManifestRow
from msm_mem.plugins.backbones.nonparametric import NonparametricBackbone
from msm_mem.testing import FixedClock
from tests.agent_support import Recording
from tests.conftest import MemFactory
from tests.helpers import ADMIN, AGENT, INGEST, png

T0 = 1_700_000_000.0
ANSWER = "Left lower lobe consolidation, pneumonia"
CONFIGS = [
    {},
    {"use_sem": False},
    {"use_vis": False},
    {"use_sem": False, "use_vis": False},
]


def _base(new_mem: MemFactory, tmp_path: Path) -> tuple[object, Recording]:
    bb = Recording()
    mem = new_mem("pop", clock=FixedClock(T0), backbone=bb)
    rows = [
        ManifestRow(f"P{i}", "S1", T0 - 10 * 86_400.0, str(png(tmp_path, i)), "Findings?", ANSWER) for i in range(3)
    ]
    mem.ingest(INGEST, rows)
    return mem, bb


@pytest.mark.parametrize("flags", CONFIGS, ids=lambda f: ",".join(sorted(f)) or "all")
def test_a_new_patient_gets_the_population_memories_behind_its_answer(
    new_mem: MemFactory, tmp_path: Path, flags: dict[str, bool]
) -> None:
    """A patient with no history is answered from other patients' experience, and those records
    are the evidence: exactly the population items given to the backbone, the cited ones among them."""
    mem, bb = _base(new_mem, tmp_path)
    a = mem.ask(AGENT, "NEW", png(tmp_path, 9), "Findings?", timestamp=T0, write_back=False, **flags)  # type: ignore[attr-defined]
    assert a.source == "population-prior" and a.answer == ANSWER
    assert a.evidence and all(e.kind.startswith("population-") for e in a.evidence)
    listed = {e.id for e in a.evidence}
    (request,) = bb.requests
    assert {c.id for c in request.prior} == listed
    cited = NonparametricBackbone().generate(request).cited
    assert cited and set(cited) <= listed
    assert {c.text for c in request.prior} == {ANSWER}  # de-identified copies of the ground truth


def test_no_population_evidence_without_consent(new_mem: MemFactory, tmp_path: Path) -> None:
    """Patients who opt out of population use neither answer nor appear; with nothing left the
    answer says there is no evidence, with an empty trail."""
    mem, _ = _base(new_mem, tmp_path)
    mem.grant(  # type: ignore[attr-defined]
        ADMIN,
        [
            ConsentRecord(f"D-{i}", f"P{i}", "role:agent", "treatment", "deny", ("population",), start=0.0)
            for i in range(3)
        ],
    )
    a = mem.ask(AGENT, "NEW", png(tmp_path, 9), "Findings?", timestamp=T0, write_back=False)  # type: ignore[attr-defined]
    assert (a.source, a.evidence) == ("empty", ())

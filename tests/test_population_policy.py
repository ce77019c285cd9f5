"""Population use as a consent policy: ``init --population permit|deny`` (``MsmMem.init(...,
population=...)``), on both stores."""

from __future__ import annotations

from pathlib import Path

import pytest

from msm_mem import ConsentRecord, InvalidInput, MsmMem
from msm_mem._records import new_id
from msm_mem.datasets.synthetic import generate
from msm_mem.interfaces.cli import main
from tests.conftest import MemFactory
from tests.helpers import ADMIN, AGENT, INGEST


def _other_patients(mem: MsmMem, rows: list, patient: str) -> set[str]:  # type: ignore[type-arg]
    """Episode ids of other patients in ``patient``'s population retrieve about its first study."""
    mine = next(r for r in rows if r.patient_id == patient)
    found = mem.retrieve(AGENT, patient, image_study=mine.study_id, scope="population")
    own = {i.evidence.id for i in found.items if i.record is not None and i.record.patient_id == patient}
    return {i.evidence.id for i in found.items} - own


def _permit(patient: str) -> ConsentRecord:
    return ConsentRecord(
        consent_id=new_id("C"),
        patient_id=patient,
        grantee="role:agent",
        purpose="treatment",
        decision="permit",
        data_classes=("population",),
        start=0.0,
        created_at=0.0,
    )


def test_deny_by_default_until_a_patient_opts_in(new_mem: MemFactory, tmp_path: Path) -> None:
    """Under ``population=False`` no patient's records inform another's retrieval until that
    patient's consent permits population; then they do, de-identified. Under the default
    policy they do from the start."""
    rows, _ = generate(tmp_path / "data", patients=3, studies_per_patient=(2, 2), seed=4, size=64)
    first, second = sorted({r.patient_id for r in rows})[:2]
    closed = new_mem("closed", population=False)
    closed.ingest(INGEST, rows)
    assert _other_patients(closed, rows, first) == set()
    closed.grant(ADMIN, [_permit(second)])
    opened = _other_patients(closed, rows, first)
    assert opened  # the patient who opted in now informs the others
    theirs = {e.episode_id for e in closed.episodes(AGENT, second)}
    theirs |= {v.visual_id for v in closed.visuals(AGENT, second)}
    others = {
        e.episode_id for r in rows if r.patient_id not in (first, second) for e in closed.episodes(AGENT, r.patient_id)
    }
    assert opened <= theirs and not opened & others  # the opted-in patient's records, nobody else's
    default = new_mem("default")
    default.ingest(INGEST, rows)
    assert _other_patients(default, rows, first)


def test_a_policy_and_population_false_are_refused_together(new_mem: MemFactory) -> None:
    with pytest.raises(InvalidInput, match="population"):
        new_mem("both", policy=[_permit("P1")], population=False)


def test_init_says_which_policy_it_wrote(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["init", str(tmp_path / "a"), "--actor", "dr-admin"]) == 0
    assert "until that patient denies population" in capsys.readouterr().out
    assert main(["init", str(tmp_path / "b"), "--actor", "dr-admin", "--population", "deny"]) == 0
    assert "until a consent permits population for that patient" in capsys.readouterr().out

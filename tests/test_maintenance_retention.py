"""Tests of retention in maintenance (msm_mem._memory.maintenance, ranking.decay_at): decay counts
from the patient's last activity in the store plus ``Settings.retention_s`` x confidence x tier
weight, never from the study's date; an imported archive survives its first maintenance; a new
activity moves every record of the patient; ``maintain(dry_run=True)`` says what would decay
and why and writes nothing but one audit read event; the setting is validated."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from msm_mem import InvalidInput, ManifestRow, MsmMem, Settings, State
from msm_mem._memory.ranking import decay_at
from msm_mem._settings import DEFAULT_RETENTION_S
from msm_mem.datasets.registry import load_dataset
from msm_mem.testing import FixedBackbone, FixedClock
from tests.cli_support import SYSTEM as SYSTEM_FLAGS
from tests.cli_support import run
from tests.conftest import SHARED, MemFactory
from tests.helpers import ADMIN, AGENT, CRITIC, INGEST, SYSTEM, audit_events
from tests.helpers import png as _png
from tests.layers import Views


@pytest.fixture
def views() -> Iterator[Views]:
    """Handles of their own on the stores a test opens (``tests/layers.py``), closed after it."""
    with Views() as opened:
        yield opened


YEAR = 365.25 * 86_400.0
NOW = 1_764_000_000.0  # November 2025: the store's clock when the archive is imported
ANSWER = "Bilateral lower lobe opacities consistent with pneumonia"
CORRECTION = "Right lower lobe consolidation, pneumonia confirmed"


def _archive(folder: Path) -> list[ManifestRow]:
    """Two patients' studies dated 2015 to 2020, one a year each (synthetic)."""
    rows = []
    for i, year in enumerate(range(2015, 2021)):
        when = 1_420_070_400.0 + (year - 2015) * YEAR + 40 * 86_400.0
        patient = "P1" if i % 2 == 0 else "P2"
        rows.append(ManifestRow(patient, f"S{year}", when, str(_png(folder, i + 1)), "Findings?", f"finding {year}"))
    return rows


def _imported(new_mem: MemFactory, folder: Path, clock: FixedClock, **options: object) -> MsmMem:
    mem: MsmMem = new_mem("s", clock=clock, backbone=FixedBackbone(ANSWER, "treat"), **options)
    assert mem.ingest(INGEST, _archive(folder)).ingested == 6
    return mem


def _live(mem: MsmMem, patient: str) -> tuple[int, int]:
    """The patient's readable (episodes, claims)."""
    return len(mem.episodes(CRITIC, patient)), len(mem.claims(CRITIC, patient))


def test_an_imported_archive_survives_its_first_maintenance(new_mem: MemFactory, tmp_path: Path) -> None:
    """Studies of 2015-2020 ingested today, an answer and a critic's correction: maintain decays nothing."""
    clock = FixedClock(NOW)
    mem = _imported(new_mem, tmp_path, clock)
    clock.advance(3600.0)
    mem.ask(AGENT, "P1", _png(tmp_path, 20), "Any consolidation?", study_id="S2020-followup")
    clock.advance(60.0)
    fixed = mem.feedback(CRITIC, "P1", "S2020-followup", accept=False, correction=CORRECTION)
    before = {p: _live(mem, p) for p in ("P1", "P2")}
    report = mem.maintain(SYSTEM)
    assert (report.anonymized, report.retracted, report.decay) == (0, 0, ())
    assert {p: _live(mem, p) for p in ("P1", "P2")} == before
    assert fixed.claim_id in {c.claim_id for c in mem.claims(CRITIC, "P1")}
    assert {e.study_id for e in mem.episodes(CRITIC, "P2")} == {"S2016", "S2018", "S2020"}
    assert not [e for e in audit_events(mem) if e.action == "decay"]


def test_records_decay_once_the_retention_after_the_last_activity_passed(new_mem: MemFactory, tmp_path: Path) -> None:
    """Due exactly at last activity + retention x confidence x weight; each record's reads say when."""
    clock = FixedClock(NOW)
    mem = _imported(new_mem, tmp_path, clock, settings=Settings(retention_s=2 * YEAR))
    (e, *_) = mem.episodes(CRITIC, "P1")
    assert e.decay_at == decay_at(NOW, 1.0, "ground_truth", 2 * YEAR) == NOW + 2 * YEAR
    assert mem.maintain(SYSTEM, at=NOW + 2 * YEAR - 1).decay == ()
    report = mem.maintain(SYSTEM, at=NOW + 2 * YEAR)
    # 3 studies a patient: episode, visual, claim each anonymised; 3 semantic versions retracted
    assert (report.anonymized, report.retracted) == (18, 6)
    assert {d.due_at for d in report.decay} == {NOW + 2 * YEAR} and _live(mem, "P1") == (0, 0)
    assert {d.last_activity for d in report.decay} == {NOW} and {d.retention_s for d in report.decay} == {2 * YEAR}


def test_a_new_activity_moves_every_record_of_the_patient(new_mem: MemFactory, tmp_path: Path) -> None:
    """A study written a year later keeps the patient's 2015 records a year longer; not the other patient's."""
    clock = FixedClock(NOW)
    mem = _imported(new_mem, tmp_path, clock, settings=Settings(retention_s=2 * YEAR))
    clock.advance(YEAR)
    late = ManifestRow("P1", "S2010", NOW - 15 * YEAR, str(_png(tmp_path, 30)), "Findings?", "an old study")
    assert mem.ingest(INGEST, [late]).ingested == 1  # an older study, written now: the write counts
    assert {e.decay_at for e in mem.episodes(CRITIC, "P1")} == {NOW + 3 * YEAR}
    report = mem.maintain(SYSTEM, at=NOW + 2 * YEAR)
    assert _live(mem, "P2") == (0, 0) and _live(mem, "P1") == (4, 4)
    assert report.anonymized == 9  # P2's three studies
    assert mem.maintain(SYSTEM, at=NOW + 3 * YEAR).anonymized == 12 and _live(mem, "P1") == (0, 0)


def test_weaker_evidence_keeps_a_shorter_share_of_the_retention(new_mem: MemFactory, tmp_path: Path) -> None:
    """The agent's own answer (confidence x 0.6) decays before the ground truth of the same patient."""
    clock = FixedClock(NOW)
    mem = _imported(new_mem, tmp_path, clock, settings=Settings(retention_s=10 * YEAR))
    a = mem.ask(AGENT, "P1", _png(tmp_path, 20), "Any consolidation in the lower lobe?", study_id="S-new")
    assert a.gate is not None and a.gate.written
    plan = mem.maintain(SYSTEM, at=NOW + 7 * YEAR, dry_run=True).decay
    assert plan and {d.evidence_tier for d in plan} == {"agent"}
    for d in plan:
        assert d.retention_s == pytest.approx(10 * YEAR * d.confidence * 0.6) and d.due_at <= NOW + 7 * YEAR


def test_the_last_activity_does_not_move_back_when_the_newest_answer_decays(
    new_mem: MemFactory, tmp_path: Path
) -> None:
    """Old ground truth, then an agent answer years later: after the answer's records decay the ground truth still
    counts from the answer (its semantic version keeps the whole retention)."""
    clock = FixedClock(NOW)
    mem = _imported(new_mem, tmp_path, clock, settings=Settings(retention_s=10 * YEAR))
    clock.advance(8 * YEAR)
    answered = clock.now()
    a = mem.ask(AGENT, "P1", _png(tmp_path, 20), "Any consolidation in the lower lobe?", study_id="S-new")
    assert a.gate is not None and a.gate.written
    assert len(mem.episodes(CRITIC, "P1")) == 4
    gone = mem.maintain(SYSTEM, at=answered + 7 * YEAR)  # P2's records and P1's agent answer
    assert {d.last_activity for d in gone.decay if d.evidence_tier == "agent"} == {answered}
    assert {e.evidence_tier for e in mem.episodes(CRITIC, "P1")} == {"ground_truth"} and _live(mem, "P2") == (0, 0)
    assert mem.maintain(SYSTEM, at=answered + 10 * YEAR - 1).decay == ()
    assert {e.decay_at for e in mem.episodes(CRITIC, "P1")} == {answered + 10 * YEAR}
    assert mem.maintain(SYSTEM, at=answered + 10 * YEAR).anonymized == 9 and _live(mem, "P1") == (0, 0)


def test_a_dry_run_says_what_would_decay_and_writes_nothing(new_mem: MemFactory, tmp_path: Path) -> None:
    """dry_run lists kind, id, last activity, retention and due time; no record changes, one read event."""
    clock = FixedClock(NOW)
    mem = _imported(new_mem, tmp_path, clock, settings=Settings(retention_s=YEAR))
    events = len(audit_events(mem))
    dry = mem.maintain(SYSTEM, at=NOW + YEAR, dry_run=True)
    assert dry.dry_run and (dry.anonymized, dry.retracted) == (18, 6) and dry.checkpoint is None
    assert {(d.kind, d.to) for d in dry.decay} == {
        ("episodic", State.ANONYMIZED),
        ("visual", State.ANONYMIZED),
        ("claims", State.ANONYMIZED),
        ("semantic", State.RETRACTED),
    }
    assert all(d.last_activity == NOW and d.due_at == d.last_activity + d.retention_s for d in dry.decay)
    new = audit_events(mem)[events:]
    assert [(e.action, e.role, e.patient, e.record_ids) for e in new] == [("read", "system", "", ())]
    assert _live(mem, "P1") == (3, 3)
    real = mem.maintain(SYSTEM, at=NOW + YEAR)
    assert {d.record_id for d in real.decay} == {d.record_id for d in dry.decay}
    with pytest.raises(InvalidInput, match="dry_run"):
        mem.maintain(SYSTEM, dry_run="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, 151 * YEAR, "10y", True, None])
def test_the_retention_setting_is_validated(bad: object) -> None:
    """A non-positive, non-finite, absurd (over 150 years) or non-numeric retention is refused by name."""
    with pytest.raises(InvalidInput, match="retention_s"):
        Settings(retention_s=bad)  # type: ignore[arg-type]


def test_the_retention_setting_comes_from_the_environment() -> None:
    """MSM_MEM_RETENTION_S sets it in seconds; the default is ten years; garbage is a clear error."""
    assert Settings().retention_s == DEFAULT_RETENTION_S == 10 * YEAR
    assert Settings.from_env({"MSM_MEM_RETENTION_S": "189345600"}).retention_s == 6 * YEAR
    with pytest.raises(InvalidInput, match="MSM_MEM_RETENTION_S"):
        Settings.from_env({"MSM_MEM_RETENTION_S": "ten years"})
    with pytest.raises(InvalidInput, match="retention_s"):
        Settings.from_env({"MSM_MEM_RETENTION_S": "-5"})


def test_maintain_dry_run_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """maintain --dry-run prints what would decay (nothing for an archive just imported) and writes no record."""
    directory = tmp_path / "s"
    with MsmMem.init(directory, ADMIN, clock=FixedClock(time.time())) as mem:
        mem.ingest(INGEST, _archive(tmp_path))
    code, out, _ = run(capsys, "maintain", directory, "--dry-run", *SYSTEM_FLAGS)
    assert code == 0
    report = json.loads(out)
    assert report["dry_run"] is True and report["decay"] == [] and report["anonymized"] == 0
    assert report["checkpoint"] == []


@pytest.mark.shared
def test_the_covid_cxr_archive_survives_its_first_maintenance(new_mem: MemFactory, views: Views) -> None:
    """The real covid-cxr studies (dated before today) ingested now: maintain decays none of them."""
    folder = SHARED / "data" / "covid-cxr"
    if not (folder / "metadata.csv").is_file():
        pytest.skip("../shared/data/covid-cxr absent")
    rows, _ = load_dataset("covid-cxr", folder, check_images=False)
    mem: MsmMem = new_mem("covid")
    ingested = mem.ingest(INGEST, rows).ingested
    assert ingested > 100 and min(r.timestamp for r in rows) < time.time() - 5 * YEAR
    assert mem.maintain(SYSTEM, dry_run=True).decay == ()
    report = mem.maintain(SYSTEM)
    assert (report.anonymized, report.retracted) == (0, 0)
    assert sum(len(mem.episodes(CRITIC, p)) for p in views(mem).store.patients()) == views(mem).store.count("episodic")

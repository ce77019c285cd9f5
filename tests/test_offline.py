"""Tests of msm_mem._agent.offline: ingest skips bad images by line and bounds its batches."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from msm_mem import InvalidInput, MsmMem, read_manifest
from msm_mem._agent import offline
from msm_mem.datasets.synthetic import generate
from tests.helpers import ADMIN, CLINICIAN, INGEST
from tests.layers import Views, layers_of
from tests.strategies import png_declaring


@pytest.fixture
def views() -> Iterator[Views]:
    """Handles of their own on the stores a test opens (``tests/layers.py``), closed after it."""
    with Views() as opened:
        yield opened


def test_fifo_huge_and_device_images_are_row_problems(tmp_path: Path, views: Views) -> None:
    """A FIFO, a device and a 9000x9000 PNG header each skip their row, naming its line and
    the reason; the other rows are ingested and nothing of the bad ones is stored."""
    rows, _ = generate(tmp_path / "syn", patients=2, studies_per_patient=(2, 2), seed=1, size=64)
    os.mkfifo(tmp_path / "pipe.png")
    (tmp_path / "huge.png").write_bytes(png_declaring(9000, 9000))
    bad = [
        replace(rows[0], image=str(tmp_path / "pipe.png"), line=101),
        replace(rows[1], image="/dev/zero", line=102),
        replace(rows[2], image=str(tmp_path / "huge.png"), line=103),
    ]
    with MsmMem.init(tmp_path / "store", ADMIN) as mem:
        report = mem.ingest(INGEST, [*bad, rows[3]])
        assert report.ingested == 1
        reasons = {p.line: p.reason for p in report.problems}
        assert sorted(reasons) == [101, 102, 103]
        assert "not a regular file" in reasons[101] and "not a regular file" in reasons[102]
        assert "too large" in reasons[103]
        assert views(mem).store.count("episodic") == 1 and len(views(mem).store.stm_list()) == 1  # the good row only


def test_pixel_budget_splits_batches_without_changing_what_is_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a pixel budget of two images a batch closes early; every row is still ingested once."""
    rows, _ = generate(tmp_path / "syn", patients=3, studies_per_patient=(2, 3), seed=2, size=64)
    with MsmMem.init(tmp_path / "a", ADMIN) as mem:
        whole = mem.ingest(INGEST, rows)
        expected = sorted(r.study_id for r in mem.episodes(CLINICIAN, rows[0].patient_id))
    monkeypatch.setattr(offline, "MAX_BATCH_PIXELS", 2 * 64 * 64)
    commits: list[int] = []
    with MsmMem.init(tmp_path / "b", ADMIN) as mem, layers_of(mem) as layers:
        original = layers.gm.commit_many
        monkeypatch.setattr(layers.gm, "commit_many", lambda turns: (commits.append(1), original(turns))[1])
        split = offline.ingest_rows(INGEST, layers.gm, layers.encoder, rows)
        got = sorted(r.study_id for r in mem.episodes(CLINICIAN, rows[0].patient_id))
    assert split.ingested == whole.ingested == len(rows) and got == expected
    assert len(commits) == (len(rows) + 1) // 2


def test_batch_size_must_be_positive(tmp_path: Path) -> None:
    """A batch size below one is refused instead of looping."""
    generate(tmp_path / "syn", patients=1, seed=3, size=64)
    rows, _ = read_manifest(tmp_path / "syn" / "manifest.jsonl")
    with MsmMem.init(tmp_path / "s", ADMIN) as mem, layers_of(mem) as layers:
        with pytest.raises(InvalidInput, match="batch_size"):
            offline.ingest_rows(INGEST, layers.gm, layers.encoder, rows, batch_size=0)


def test_several_questions_of_one_study_share_its_visual_record(tmp_path: Path, views: Views) -> None:
    """Each question of a study is an episode; the study's image is one visual record, and
    re-ingesting (with a question added) stores only the new question, still without a visual."""
    rows, _ = generate(tmp_path / "syn", patients=1, studies_per_patient=(2, 2), seed=4, size=64)
    asked = [replace(rows[0], question="Is there an effusion?", answer="no", question_type="yes_no", line=11)]
    with MsmMem.init(tmp_path / "store", ADMIN) as mem:
        first = mem.ingest(INGEST, [*rows, *asked])
        assert (first.ingested, first.already_stored) == (3, 0)
        assert views(mem).store.count("episodic") == 3 and views(mem).store.count("visual") == 2
        more = [replace(rows[0], question="Is the heart enlarged?", answer="yes", question_type="yes_no", line=12)]
        again = mem.ingest(INGEST, [*rows, *asked, *more])
        assert (again.ingested, again.already_stored) == (1, 3)
        assert views(mem).store.count("episodic") == 4 and views(mem).store.count("visual") == 2
        episodes = mem.episodes(CLINICIAN, rows[0].patient_id)
        by_study = sorted((e.study_id, e.question, e.answer) for e in episodes if e.study_id == rows[0].study_id)
        assert [q for _, q, _ in by_study] == sorted(
            [rows[0].question, "Is there an effusion?", "Is the heart enlarged?"]
        )

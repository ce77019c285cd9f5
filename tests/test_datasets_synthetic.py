from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from msm_mem._errors import InvalidInput
from msm_mem.datasets import synthetic, synthetic_images
from msm_mem.datasets.manifest import read_manifest
from msm_mem.datasets.synthetic import DECISIONS, QUESTION, generate


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[synthetic.ManifestRow]]:
    out = tmp_path_factory.mktemp("syn")
    rows, problems = generate(out, patients=12, seed=3)
    assert problems == []
    return out, rows


def _pixels(path: str) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im, dtype=np.float64)


def test_same_seed_gives_byte_identical_files(tmp_path: Path) -> None:
    """Two runs with one seed into two folders write identical manifest and image bytes."""
    a, b = tmp_path / "a", tmp_path / "b"
    rows_a, _ = generate(a, patients=6, seed=11)
    rows_b, _ = generate(b, patients=6, seed=11)
    assert (a / "manifest.jsonl").read_bytes() == (b / "manifest.jsonl").read_bytes()
    names = sorted(p.name for p in (a / "images").iterdir())
    assert names == sorted(p.name for p in (b / "images").iterdir())
    assert len(names) == len(rows_a) == len(rows_b)
    for name in names:
        assert (a / "images" / name).read_bytes() == (b / "images" / name).read_bytes()


def test_other_seed_gives_other_data(tmp_path: Path) -> None:
    """A different seed changes the manifest."""
    generate(tmp_path / "a", patients=6, seed=1)
    generate(tmp_path / "b", patients=6, seed=2)
    assert (tmp_path / "a/manifest.jsonl").read_bytes() != (tmp_path / "b/manifest.jsonl").read_bytes()


def test_manifest_reads_back_as_the_returned_rows(small: tuple[Path, list]) -> None:
    """read_manifest on the written file returns exactly the rows generate returned."""
    out, rows = small
    read, problems = read_manifest(out / "manifest.jsonl")
    assert problems == []
    assert read == rows
    assert all(Path(r.image).is_file() and Path(r.image).is_absolute() for r in rows)
    assert "images/" in (out / "manifest.jsonl").read_text().splitlines()[0]
    assert str(out) not in (out / "manifest.jsonl").read_text()


def test_rows_are_longitudinal_and_sorted(small: tuple[Path, list]) -> None:
    """Ids follow SYN-0001 / SYN-0001-01, 2..5 studies each, times strictly increase per patient."""
    _, rows = small
    patients = sorted({r.patient_id for r in rows})
    assert patients == [f"SYN-{i:04d}" for i in range(1, 13)]
    assert rows == sorted(rows, key=lambda r: (r.patient_id, r.timestamp))
    for pid in patients:
        mine = [r for r in rows if r.patient_id == pid]
        assert 2 <= len(mine) <= 5
        assert [r.study_id for r in mine] == [f"{pid}-{i:02d}" for i in range(1, len(mine) + 1)]
        for a, b in pairwise(mine):
            assert b.timestamp > a.timestamp
            assert 1 <= b.timestamp // 86_400 - a.timestamp // 86_400 <= 30  # calendar days


def test_text_fields_are_consistent(small: tuple[Path, list]) -> None:
    """The answer is the report's impression; the first study has no comparison; fixed question."""
    _, rows = small
    for row in rows:
        assert row.question == QUESTION
        assert row.decision in DECISIONS
        assert row.report.endswith(f"IMPRESSION: {row.answer}")
        assert "FINDINGS: " in row.report
        first = row.study_id.endswith("-01")
        assert row.report.startswith("COMPARISON: None.") == first
        assert row.answer[:1].isupper() or row.answer[:1].isdigit()


def test_impression_wording_follows_the_course() -> None:
    """Change words compare each finding with the prior state."""
    imp = synthetic._impression
    assert imp(None, {}) == "No acute cardiopulmonary abnormality."
    assert imp({}, {"rll_consolidation": 2}) == "New moderate right lower lobe consolidation."
    assert (
        imp({"rll_consolidation": 1}, {"rll_consolidation": 3})
        == "Extensive right lower lobe consolidation, increased since prior."
    )
    assert imp({"edema": 2}, {"edema": 1}) == "Mild pulmonary edema, decreased since prior."
    assert imp({"left_effusion": 1}, {}) == (
        "Interval resolution of left pleural effusion. No acute cardiopulmonary abnormality."
    )


def test_decision_rules() -> None:
    """The most urgent action wins: drain > admit > treat > follow-up > no action."""
    dec = synthetic._decision
    assert dec(None, {}) == "no action"
    assert dec(None, {"right_pneumothorax": 2}) == "drain"
    assert dec(None, {"right_pneumothorax": 1}) == "follow-up"
    assert dec(None, {"cardiomegaly": 2, "edema": 2}) == "admit"
    assert dec({"lll_consolidation": 1}, {"lll_consolidation": 2}) == "treat"
    assert dec({"lll_consolidation": 3}, {"lll_consolidation": 1}) == "follow-up"
    assert dec(None, {"left_effusion": 3, "edema": 2}) == "drain"


def _render_pair(state: dict[str, int]) -> tuple[np.ndarray, np.ndarray, synthetic_images._Anatomy]:
    anatomy = synthetic_images._anatomy(np.random.default_rng(5), 128)
    normal = synthetic_images._render(anatomy, {}, np.random.default_rng(9), 128)
    sick = synthetic_images._render(anatomy, state, np.random.default_rng(9), 128)
    return normal.astype(np.float64), sick.astype(np.float64), anatomy


def _lung_box(
    anatomy: synthetic_images._Anatomy, side: str, v0: float, v1: float, half: float = 0.5
) -> tuple[slice, slice]:
    cx, gap, rx, ly, ry = (getattr(anatomy, k) for k in ("cx", "gap", "rx", "ly", "ry"))
    lx = cx - gap if side == "right" else cx + gap
    cols = slice(int((lx - half * rx) * 127), int((lx + half * rx) * 127))
    rows = slice(int((ly + v0 * ry) * 127), int((ly + v1 * ry) * 127))
    return rows, cols


def test_images_show_their_findings() -> None:
    """Each finding changes the pixels where it should and in the right direction."""
    n, s, a = _render_pair({"rll_consolidation": 3})
    box = _lung_box(a, "right", 0.3, 0.7)
    assert s[box].mean() > n[box].mean() + 0.05
    other = _lung_box(a, "left", -0.6, -0.2)
    assert abs(s[other].mean() - n[other].mean()) < 0.01

    n, s, a = _render_pair({"left_effusion": 3})
    assert s[_lung_box(a, "left", 0.55, 0.8)].mean() > n[_lung_box(a, "left", 0.55, 0.8)].mean() + 0.2

    n, s, a = _render_pair({"right_pneumothorax": 3})
    apex = _lung_box(a, "right", -0.8, -0.45, half=0.25)
    assert s[apex].mean() < n[apex].mean() - 0.02
    assert s[apex].std() < n[apex].std()  # no lung markings

    n, s, a = _render_pair({"cardiomegaly": 3})
    assert (s > 0.6).sum() > (n > 0.6).sum() + 150

    n, s, a = _render_pair({"edema": 3})
    for side in ("right", "left"):
        assert s[_lung_box(a, side, -0.1, 0.2)].mean() > n[_lung_box(a, side, -0.1, 0.2)].mean() + 0.05

    n, s, _ = _render_pair({"left_nodule": 2})
    diff = s - n
    assert diff.max() > 0.25 and (diff > 0.1).sum() < 60  # small, round, bright


def test_same_patient_images_resemble_each_other(small: tuple[Path, list]) -> None:
    """Consecutive studies of one patient differ less than first studies of two patients."""
    _, rows = small
    by_patient: dict[str, list[np.ndarray]] = {}
    for r in rows:
        by_patient.setdefault(r.patient_id, []).append(_pixels(r.image))
    within = [np.abs(a - b).mean() for ims in by_patient.values() for a, b in pairwise(ims)]
    firsts = [ims[0] for ims in by_patient.values()]
    across = [np.abs(a - b).mean() for a, b in pairwise(firsts)]
    assert np.mean(within) < 0.7 * np.mean(across)


def test_images_are_grayscale_png_of_the_requested_size(tmp_path: Path) -> None:
    """Images are 8-bit grayscale PNG, size x size."""
    rows, _ = generate(tmp_path, patients=2, size=96)
    for r in rows:
        with Image.open(r.image) as im:
            assert (im.format, im.mode, im.size) == ("PNG", "L", (96, 96))


def test_the_default_set_has_forty_patients(tmp_path: Path) -> None:
    """The default set has 40 patients (its speed is not a test: machines here are shared)."""
    rows, _ = generate(tmp_path)
    assert len({r.patient_id for r in rows}) == 40


@pytest.mark.parametrize(
    "kwargs",
    [
        {"patients": 0},
        {"studies_per_patient": (3, 2)},
        {"studies_per_patient": (0, 2)},
        {"size": 16},
    ],
)
def test_bad_arguments_are_refused(tmp_path: Path, kwargs: dict) -> None:
    """Out-of-range arguments raise InvalidInput and write nothing."""
    with pytest.raises(InvalidInput):
        generate(tmp_path / "x", **kwargs)
    assert not (tmp_path / "x").exists()


def test_questions_ask_each_study_the_impression_a_decision_and_a_yes_no(tmp_path: Path) -> None:
    """With three questions each study gives three rows (text, label, yes/no) sharing its image;
    the images and the impressions are those of the default one-question set."""
    one, _ = generate(tmp_path / "one", patients=3, seed=2, size=64)
    three, _ = generate(
        tmp_path / "three", patients=3, seed=2, size=64, questions=("impression", "decision", "effusion")
    )
    assert len(three) == 3 * len(one)
    assert [r.answer for r in three if r.question_type == "text"] == [r.answer for r in one]
    assert {r.answer for r in three if r.question_type == "label"} <= set(DECISIONS)
    impressions = {r.study_id: r.answer for r in one}
    yes_no = [(r.answer, impressions[r.study_id]) for r in three if r.question_type == "yes_no"]
    assert {a for a, _ in yes_no} == {"yes", "no"}
    assert all("effusion" in text for a, text in yes_no if a == "yes")  # a present effusion is reported
    assert read_manifest(tmp_path / "three" / "manifest.jsonl")[0] == three
    for a, b in zip(
        sorted((tmp_path / "one" / "images").iterdir()), sorted((tmp_path / "three" / "images").iterdir()), strict=True
    ):
        assert a.read_bytes() == b.read_bytes()
    with pytest.raises(InvalidInput, match="questions"):
        generate(tmp_path / "bad", patients=1, questions=("colour",))

from __future__ import annotations

from pathlib import Path

import pytest

from msm_mem._errors import InvalidInput
from msm_mem.datasets.registry import DATASETS, load_dataset, options_of


def test_known_names() -> None:
    """The registry serves exactly the four documented data sets."""
    assert sorted(DATASETS) == ["covid-cxr", "iu-xray", "manifest", "mimic-cxr", "synthetic"]


def test_unknown_name_lists_known_names() -> None:
    """An unknown name raises InvalidInput naming every known data set."""
    with pytest.raises(InvalidInput) as info:
        load_dataset("chexpert", "x")
    for name in DATASETS:
        assert name in str(info.value)


def test_options_come_from_the_loaders() -> None:
    """Each data set's options are its loader's keyword-only parameters."""
    assert options_of("synthetic") == ("patients", "questions", "seed", "size", "studies_per_patient")
    assert options_of("covid-cxr") == ("check_images", "keep_unlabelled")
    assert options_of("iu-xray") == ("images_dir", "views_csv")
    assert options_of("mimic-cxr") == ("reports_dir", "split")


def test_unknown_option_and_missing_path_are_refused(tmp_path: Path) -> None:
    """A misspelt option or a None path raises InvalidInput before anything is written."""
    with pytest.raises(InvalidInput, match="accepted: patients, questions, seed"):
        load_dataset("synthetic", tmp_path / "s", patient=3)
    with pytest.raises(InvalidInput, match="needs a path"):
        load_dataset("mimic-cxr", None)
    assert not (tmp_path / "s").exists()


def test_synthetic_through_the_registry(tmp_path: Path) -> None:
    """load_dataset('synthetic', folder, ...) generates the same rows as the module."""
    rows, problems = load_dataset("synthetic", str(tmp_path), patients=3, seed=4)
    assert problems == [] and {r.patient_id for r in rows} == {"SYN-0001", "SYN-0002", "SYN-0003"}
    assert (tmp_path / "manifest.jsonl").is_file()


def test_loader_errors_pass_through(tmp_path: Path) -> None:
    """A loader's own InvalidInput (here: no metadata.csv) reaches the caller."""
    with pytest.raises(InvalidInput, match="metadata.csv"):
        load_dataset("covid-cxr", tmp_path)

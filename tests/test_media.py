"""Tests of msm_mem._media: where a stored image path points, and the image root a store records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from msm_mem import InvalidInput, StoreError
from msm_mem._media import MEDIA_FILE, image_root, resolve_media, set_image_root


def test_a_relative_path_resolves_against_the_recorded_root(tmp_path: Path) -> None:
    """With a root recorded, a relative path resolves under it and says so; an absolute path
    stays itself."""
    store, root = tmp_path / "store", tmp_path / "images"
    store.mkdir()
    root.mkdir()
    assert set_image_root(store, root) == root
    place = resolve_media("P1/a.png", store)
    assert (place.path, place.root) == (root / "P1" / "a.png", root)
    assert place.describe() == f"stored as 'P1/a.png', resolved against the store's image root {root}"
    absolute = resolve_media(str(tmp_path / "b.png"), store)
    assert (absolute.path, absolute.root) == (tmp_path / "b.png", None)
    assert "absolute path" in absolute.describe()


def test_without_a_root_a_relative_path_resolves_as_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No media.json (or no store directory): a relative path is left relative, read from the
    working directory, and the description names that directory and how to record a root."""
    monkeypatch.chdir(tmp_path)
    for directory in (tmp_path, None):
        place = resolve_media("a.png", directory)
        assert (place.path, place.root) == (Path("a.png"), None)
        assert f"working directory {tmp_path}" in place.describe() and "store image-root" in place.describe()


def test_the_root_is_recorded_absolute_and_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative root is recorded as an absolute folder, in a file only its owner can read,
    replacing the one recorded before."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path)
    set_image_root(tmp_path, "a")
    set_image_root(tmp_path, "b")
    assert json.loads((tmp_path / MEDIA_FILE).read_text()) == {"image_root": str(tmp_path / "b")}
    assert (tmp_path / MEDIA_FILE).stat().st_mode & 0o777 == 0o600
    assert image_root(tmp_path) == tmp_path / "b"


def test_a_root_that_is_not_a_folder_is_refused(tmp_path: Path) -> None:
    """Recording a missing folder or a file is InvalidInput naming it, and writes nothing."""
    (tmp_path / "f").write_text("x")
    for bad in ("missing", "f"):
        with pytest.raises(InvalidInput, match=str(tmp_path / bad)):
            set_image_root(tmp_path, tmp_path / bad)
    assert not (tmp_path / MEDIA_FILE).exists()


@pytest.mark.parametrize(
    "text",
    ["{not json", "[]", '{"image_root": "relative/dir"}', '{"image_root": 3}', '{"image_root": "/x", "more": 1}'],
)
def test_a_malformed_media_file_is_a_store_error_naming_it(tmp_path: Path, text: str) -> None:
    """A media.json that does not parse, or holds anything but one absolute image_root, is a
    StoreError naming the file (never a silent fallback to the working directory)."""
    (tmp_path / MEDIA_FILE).write_text(text)
    with pytest.raises(StoreError, match=MEDIA_FILE):
        resolve_media("a.png", tmp_path)

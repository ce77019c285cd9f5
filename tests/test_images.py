"""Tests of msm_mem.plugins.images: PNG, JPEG, DICOM and video keyframe loading."""

from __future__ import annotations

import io
import os
import sys
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from PIL import Image
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, SecondaryCaptureImageStorage, generate_uid

from msm_mem._errors import ImageError, InvalidInput, MissingExtra
from msm_mem._limits import MAX_IMAGE_PIXELS
from msm_mem.plugins import images
from msm_mem.plugins.images import (
    detect_format,
    load_image,
    load_image_bytes,
    load_keyframe,
    resize,
    to_rgb_uint8,
)
from tests.strategies import dicom_declaring, image_bytes, jpeg_declaring, png_declaring


def _png_bytes(arr: np.ndarray, mode: str | None = None) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr, mode=mode).save(buf, format="PNG")
    return buf.getvalue()


def _jpeg_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def _dicom_bytes(
    pixels: np.ndarray,
    *,
    photometric: str = "MONOCHROME2",
    window: tuple[Any, Any] | None = None,
    rescale: tuple[float, float] | None = None,
    preamble: bool = True,
    frames: int = 1,
    with_pixels: bool = True,
) -> bytes:
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = SecondaryCaptureImageStorage
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID = SecondaryCaptureImageStorage
    ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
    ds.Rows, ds.Columns = pixels.shape[-2:]
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = photometric
    ds.BitsAllocated = ds.BitsStored = 16
    ds.HighBit = 15
    ds.PixelRepresentation = 0
    if frames > 1:
        ds.NumberOfFrames = frames
    if with_pixels:
        ds.PixelData = np.ascontiguousarray(pixels, dtype="<u2").tobytes()
    if window is not None:
        ds.WindowCenter, ds.WindowWidth = window
    if rescale is not None:
        ds.RescaleSlope, ds.RescaleIntercept = rescale
    buf = io.BytesIO()
    if not preamble:
        ds.preamble = None
    ds.save_as(buf, enforce_file_format=preamble)
    return buf.getvalue()


RAMP = np.arange(12, dtype=np.uint16).reshape(3, 4)


def test_png_8bit_gray_is_divided_by_255(tmp_path: Path) -> None:
    """An 8-bit grayscale PNG loads as float32 (h, w) equal to value / 255."""
    arr = np.array([[0, 51, 255], [102, 204, 1]], dtype=np.uint8)
    p = tmp_path / "a.png"
    p.write_bytes(_png_bytes(arr))
    img = load_image(p)
    assert img.dtype == np.float32 and img.shape == (2, 3) and img.flags.c_contiguous
    np.testing.assert_allclose(img, arr / 255.0, atol=1e-7)


def test_png_16bit_uses_full_16bit_range(tmp_path: Path) -> None:
    """A 16-bit PNG is divided by 65535, not min-max scaled."""
    arr = np.array([[0, 1000], [30000, 65535]], dtype=np.uint16)
    p = tmp_path / "a16.png"
    p.write_bytes(_png_bytes(arr))
    np.testing.assert_allclose(load_image(p), arr / 65535.0, atol=1e-6)


def test_colour_png_uses_bt601_luma_and_ignores_alpha(tmp_path: Path) -> None:
    """Red, green, blue and white pixels map to 0.299, 0.587, 0.114 and 1; alpha is ignored."""
    rgba = np.zeros((1, 4, 4), dtype=np.uint8)
    rgba[0, 0, 0] = rgba[0, 1, 1] = rgba[0, 2, 2] = 255
    rgba[0, 3, :3] = 255
    rgba[..., 3] = 10
    p = tmp_path / "c.png"
    p.write_bytes(_png_bytes(rgba, mode="RGBA"))
    np.testing.assert_allclose(load_image(p)[0], [0.299, 0.587, 0.114, 1.0], atol=1e-6)


def test_jpeg_loads_close_to_source(tmp_path: Path) -> None:
    """A JPEG decodes to the source gray levels within compression error."""
    arr = np.tile(np.linspace(0, 255, 32).astype(np.uint8), (32, 1))
    p = tmp_path / "g.jpg"
    p.write_bytes(_jpeg_bytes(arr))
    img = load_image(p)
    assert img.shape == (32, 32)
    assert float(np.abs(img - arr / 255.0).max()) < 0.05


def test_format_is_detected_from_content_not_extension(tmp_path: Path) -> None:
    """A PNG named .jpg and a DICOM named .png both load by their content."""
    p = tmp_path / "really_png.jpg"
    p.write_bytes(_png_bytes(np.full((2, 2), 255, dtype=np.uint8)))
    assert float(load_image(p).min()) == 1.0
    d = tmp_path / "really_dicom.png"
    d.write_bytes(_dicom_bytes(RAMP))
    assert load_image(d).shape == (3, 4)
    assert detect_format(d.read_bytes()[:132]) == "dicom"


def test_dicom_without_window_is_min_max_scaled(tmp_path: Path) -> None:
    """Without a VOI window, rescaled DICOM values are scaled to [0, 1] by min and max."""
    p = tmp_path / "a.dcm"
    p.write_bytes(_dicom_bytes(RAMP, rescale=(2.0, -100.0)))
    np.testing.assert_allclose(load_image(p), RAMP / 11.0, atol=1e-6)


def test_dicom_window_uses_rescaled_values_and_first_value(tmp_path: Path) -> None:
    """The first WindowCenter/Width applies to slope*x+intercept with the DICOM linear VOI."""
    # Stored x -> 2x + 10; window c=20, w=5 applies to 10..32: (v - 19.5) / 4 + 0.5.
    p = tmp_path / "w.dcm"
    p.write_bytes(_dicom_bytes(RAMP, rescale=(2.0, 10.0), window=([20, 1000], [5, 2000])))
    v = RAMP * 2.0 + 10.0
    expected = np.clip((v - 19.5) / 4.0 + 0.5, 0, 1)
    np.testing.assert_allclose(load_image(p), expected, atol=1e-6)


def test_dicom_monochrome1_is_inverted(tmp_path: Path) -> None:
    """MONOCHROME1 (low values bright) loads as 1 - the MONOCHROME2 result."""
    m1 = tmp_path / "m1.dcm"
    m1.write_bytes(_dicom_bytes(RAMP, photometric="MONOCHROME1"))
    np.testing.assert_allclose(load_image(m1), 1.0 - RAMP / 11.0, atol=1e-6)


def test_dicom_without_preamble_loads_by_extension(tmp_path: Path) -> None:
    """A DICOM data set without the 128-byte preamble still loads when named .dcm."""
    data = _dicom_bytes(RAMP, preamble=False)
    assert data[128:132] != b"DICM"
    p = tmp_path / "raw.dcm"
    p.write_bytes(data)
    np.testing.assert_allclose(load_image(p), RAMP / 11.0, atol=1e-6)


def test_dicom_multiframe_gives_middle_frame(tmp_path: Path) -> None:
    """A 3-frame DICOM loads its frame 1 (n // 2)."""
    frames = np.stack([RAMP, RAMP[::-1], RAMP * 0])
    p = tmp_path / "mf.dcm"
    p.write_bytes(_dicom_bytes(frames, frames=3))
    np.testing.assert_allclose(load_image(p), RAMP[::-1] / 11.0, atol=1e-6)


def test_load_image_bytes_matches_load_image(tmp_path: Path) -> None:
    """Decoding bytes in memory gives the same array as loading the file."""
    data = _dicom_bytes(RAMP, window=(5, 8))
    p = tmp_path / "b.dcm"
    p.write_bytes(data)
    np.testing.assert_array_equal(load_image_bytes(data, "upload.dcm"), load_image(p))


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"", "empty"),
        (b"GIF89a" + b"\x00" * 200, "unsupported"),
        (b"hello, not an image\n" * 20, "unsupported"),
        (b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, "cannot decode"),
        (b"\xff\xd8\xff\xe0" + b"\x13" * 40, "cannot decode"),
    ],
)
def test_bad_files_raise_image_error_naming_file(tmp_path: Path, content: bytes, problem: str) -> None:
    """Empty, unsupported and corrupt files raise ImageError with the file name and problem."""
    p = tmp_path / "bad_file.bin"
    p.write_bytes(content)
    with pytest.raises(ImageError, match=problem) as info:
        load_image(p)
    assert "bad_file.bin" in str(info.value)
    assert isinstance(info.value, InvalidInput) and isinstance(info.value, ValueError)


@pytest.mark.parametrize("fmt", ["png", "jpeg", "dicom"])
def test_truncated_files_raise_image_error(tmp_path: Path, fmt: str) -> None:
    """A file cut to 60% of its length raises ImageError rather than returning pixels."""
    arr = (np.random.default_rng(0).random((64, 64)) * 255).astype(np.uint8)
    data = {
        "png": lambda: _png_bytes(arr),
        "jpeg": lambda: _jpeg_bytes(arr),
        "dicom": lambda: _dicom_bytes(arr.astype(np.uint16)),
    }[fmt]()
    p = tmp_path / f"cut.{fmt}"
    p.write_bytes(data[: int(len(data) * 0.6)])
    with pytest.raises(ImageError, match="cut"):
        load_image(p)


def test_missing_file_and_directory_raise_image_error(tmp_path: Path) -> None:
    """A path that does not exist, or is a directory, raises ImageError naming it."""
    with pytest.raises(ImageError, match="does not exist"):
        load_image(tmp_path / "nope.png")
    with pytest.raises(ImageError, match="directory"):
        load_image(tmp_path)


def test_dicom_without_pixel_data_raises(tmp_path: Path) -> None:
    """A DICOM file with no PixelData element raises ImageError."""
    p = tmp_path / "nopix.dcm"
    p.write_bytes(_dicom_bytes(RAMP, with_pixels=False))
    with pytest.raises(ImageError, match="no pixel data"):
        load_image(p)


def test_to_rgb_uint8_repeats_and_rounds() -> None:
    """A gray float image becomes (h, w, 3) uint8 with round(v * 255), clipped."""
    rgb = to_rgb_uint8(np.array([[0.0, 0.5, 1.2]], dtype=np.float32))
    assert rgb.shape == (1, 3, 3) and rgb.dtype == np.uint8
    assert rgb[0, :, 0].tolist() == [0, 128, 255]
    assert np.array_equal(rgb[..., 0], rgb[..., 2])
    with pytest.raises(ImageError):
        to_rgb_uint8(np.zeros((2, 2, 2)))


def test_resize_shapes_and_preserves_constant() -> None:
    """resize takes (height, width), keeps dtype and leaves a constant image constant."""
    img = np.full((30, 50), 0.25, dtype=np.float32)
    out = resize(img, (10, 20))
    assert out.shape == (10, 20) and out.dtype == np.float32
    np.testing.assert_allclose(out, 0.25, atol=1e-6)
    assert resize(img, 7).shape == (7, 7)
    assert resize(to_rgb_uint8(img), 8).shape == (8, 8, 3)


def test_keyframe_without_video_backend_raises_missing_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With neither imageio nor cv2 importable, loading a video raises MissingExtra('video')."""
    monkeypatch.setitem(sys.modules, "imageio.v3", None)
    monkeypatch.setitem(sys.modules, "cv2", None)
    p = tmp_path / "clip.mp4"
    p.write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"\x00" * 200)
    with pytest.raises(MissingExtra) as info:
        load_image(p)
    assert info.value.extra == "video"


def test_keyframe_is_the_middle_decoded_frame(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a video backend, the frame at index n // 2 of the decoded frames is returned."""

    def imiter(path: str) -> Iterator[np.ndarray]:
        for k in range(5):
            yield np.full((4, 6, 3), 40 * k, dtype=np.uint8)

    fake = types.ModuleType("imageio.v3")
    fake.imiter = imiter  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "imageio.v3", fake)
    p = tmp_path / "clip.avi"
    p.write_bytes(b"RIFF\x00\x00\x00\x00AVI " + b"\x00" * 200)
    frame = load_keyframe(p)
    assert frame.shape == (4, 6)
    np.testing.assert_allclose(frame, 80 / 255.0, atol=1e-6)
    np.testing.assert_array_equal(load_image(p), frame)


def test_undecodable_video_raises_image_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A backend failure or a video with no frames becomes ImageError naming the file."""

    def broken(path: str) -> Iterator[np.ndarray]:
        raise RuntimeError("moov atom not found")
        yield  # pragma: no cover

    monkeypatch.setattr(images, "_video_backend", lambda: broken)
    p = tmp_path / "broken.mp4"
    p.write_bytes(b"\x00\x00\x00\x18ftypmp42")
    with pytest.raises(ImageError, match="broken.mp4.*moov"):
        load_keyframe(p)
    monkeypatch.setattr(images, "_video_backend", lambda: lambda path: iter(()))
    with pytest.raises(ImageError, match="no decodable frames"):
        load_keyframe(p)


# bounds: regular files only, bytes and pixels limited before decoding ---------------------------


def test_huge_declared_png_is_refused_before_decoding() -> None:
    """A 9000x9000 PNG header (a few bytes of data) is refused from its header, not decoded."""
    with pytest.raises(ImageError, match=r"too large: 9000x9000 = 81,000,000 pixels"):
        load_image_bytes(png_declaring(9000, 9000), "huge.png")
    with pytest.raises(ImageError, match="too large"):  # past Pillow's own bound too
        load_image_bytes(png_declaring(2**31 - 1, 2**31 - 1), "absurd.png")


def test_huge_declared_jpeg_and_dicom_are_refused() -> None:
    """A JPEG frame header or DICOM Rows/Columns/frames over the pixel limit are refused."""
    with pytest.raises(ImageError, match="too large: 9000x9000"):
        load_image_bytes(jpeg_declaring(9000, 9000), "huge.jpg")
    with pytest.raises(ImageError, match="too large: 60000x60000x1 frames"):
        load_image_bytes(dicom_declaring(60000, 60000), "huge.dcm")
    with pytest.raises(ImageError, match="too large: 4096x4096x3000 frames"):
        load_image_bytes(dicom_declaring(4096, 4096, frames=3000), "cine.dcm")


def test_pixel_and_byte_limits_can_be_set_per_call(tmp_path: Path) -> None:
    """max_pixels and max_bytes bound one call; within them the image loads as before."""
    p = tmp_path / "a.png"
    p.write_bytes(_png_bytes(np.zeros((10, 20), dtype=np.uint8)))
    assert load_image(p).shape == (10, 20)
    with pytest.raises(ImageError, match="exceeds the limit of 199"):
        load_image(p, max_pixels=199)
    with pytest.raises(ImageError, match="larger than the limit of 10 bytes"):
        load_image(p, max_bytes=10)


def test_fifo_device_and_escaping_symlink_are_refused(tmp_path: Path) -> None:
    """A FIFO and /dev/zero are refused at once; with a root, a link out of it is refused."""
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    with pytest.raises(ImageError, match="not a regular file"):
        load_image(fifo)  # returns at once: the FIFO is never opened
    with pytest.raises(ImageError, match="not a regular file"):
        load_image("/dev/zero")
    root = tmp_path / "root"
    root.mkdir()
    real = tmp_path / "outside.png"
    real.write_bytes(_png_bytes(np.zeros((4, 4), dtype=np.uint8)))
    (root / "link.png").symlink_to(real)
    with pytest.raises(ImageError, match="outside the allowed folder"):
        load_image(root / "link.png", root=root)
    with pytest.raises(ImageError, match="outside the allowed folder"):
        load_image(root / ".." / "outside.png", root=root)
    assert load_image(root / "link.png").shape == (4, 4)  # no root: the caller's own file


@settings(max_examples=300, deadline=None)
@given(image_bytes)
def test_fuzzed_image_bytes_decode_or_raise_image_error(data: bytes) -> None:
    """Arbitrary bytes, damaged files and lying headers give an image or ImageError, nothing else."""
    try:
        img = load_image_bytes(data, "fuzz.bin")
    except (ImageError, MissingExtra):
        return
    assert img.dtype == np.float32 and img.ndim == 2 and img.size <= MAX_IMAGE_PIXELS
    assert float(img.min()) >= 0.0 and float(img.max()) <= 1.0


@settings(max_examples=40, deadline=None)
@given(image_bytes)
def test_fuzzed_image_files_decode_or_raise_image_error(data: bytes) -> None:
    """The same through a file on disk (the path the manifest and the API take)."""
    with tempfile.TemporaryDirectory() as folder:
        p = Path(folder) / "fuzz.dcm"
        p.write_bytes(data)
        try:
            load_image(p)
        except (ImageError, MissingExtra):
            pass

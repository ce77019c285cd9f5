"""Tests of msm_mem.plugins._headers and the decoded-size budget of the image loader: PNG and
JPEG structure checked, pixels x channels x bytes per sample refused before decoding."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from msm_mem._errors import ImageError
from msm_mem.plugins._headers import Declared, jpeg_declared, png_declared
from msm_mem.plugins.images import load_image_bytes
from tests.strategies import dicom_declaring


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_of(width: int, height: int, depth: int, colour: int, *, rows: int | None = None) -> bytes:
    """A PNG of zero pixels (a few hundred KB even when huge: zeros compress), built by hand."""
    channels = {0: 1, 2: 3, 4: 2, 6: 4}[colour]
    row = b"\x00" * (1 + width * channels * depth // 8)
    comp = zlib.compressobj(9)
    idat = b"".join(comp.compress(row) for _ in range(height if rows is None else rows)) + comp.flush()
    ihdr = struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")


def pillow_png(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def pillow_jpeg(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


GRAY = (np.arange(64 * 48, dtype=np.uint32).reshape(48, 64) % 251).astype(np.uint8)


def test_png_header_gives_pixels_channels_and_sample_bytes() -> None:
    """IHDR bit depth and colour type give channels and bytes per sample."""
    assert png_declared(png_of(8, 4, 16, 6), "a") == Declared(8, 4, 4, 2)
    assert png_declared(png_of(8, 4, 8, 0), "a") == Declared(8, 4, 1, 1)
    assert png_declared(png_of(8, 4, 8, 2), "a").decoded_bytes == 8 * 4 * 3


def test_the_reviewers_png_is_refused_naming_the_budget() -> None:
    """The 261 KB 8192x4096 16-bit RGBA PNG (268 MB decoded) is refused before any decoding,
    with a message naming its decoded size and the budget."""
    data = png_of(8192, 4096, 16, 6)
    assert len(data) < 300_000
    with pytest.raises(ImageError, match=r"268,435,456 bytes exceeds the decoded-image budget of 134,217,728"):
        load_image_bytes(data, "big.png")
    with pytest.raises(ImageError, match="budget of 1,000"):
        load_image_bytes(pillow_png(GRAY), "small.png", max_decoded_bytes=1_000)
    assert load_image_bytes(pillow_png(GRAY), "small.png", max_decoded_bytes=64 * 48).shape == (48, 64)


def test_png_with_a_bad_crc_a_missing_or_damaged_iend_is_refused() -> None:
    """A flipped byte in IDAT (bad CRC), a missing IEND, bytes after IEND: each refused, named."""
    good = pillow_png(GRAY)
    assert load_image_bytes(good, "ok.png").shape == (48, 64)
    idat = good.index(b"IDAT")
    flipped = good[: idat + 10] + bytes([good[idat + 10] ^ 0xFF]) + good[idat + 11 :]
    with pytest.raises(ImageError, match="IDAT.*fails its CRC"):
        load_image_bytes(flipped, "crc.png")
    with pytest.raises(ImageError, match="without its IEND"):
        load_image_bytes(good[:-12], "noend.png")
    with pytest.raises(ImageError, match="after its IEND"):
        load_image_bytes(good + b"trailing", "after.png")
    bad_end = good[:-4] + b"\x00\x00\x00\x00"
    with pytest.raises(ImageError, match="IEND.*fails its CRC"):
        load_image_bytes(bad_end, "badend.png")


def test_jpeg_without_eoi_or_frame_header_is_refused() -> None:
    """A JPEG cut before EOI, or with its frame header missing, is refused before decoding."""
    good = pillow_jpeg(GRAY)
    assert load_image_bytes(good, "ok.jpg").shape == (48, 64)
    assert jpeg_declared(good, "ok.jpg") == Declared(64, 48, 1, 1)
    with pytest.raises(ImageError, match="EOI"):
        load_image_bytes(good[:-2], "cut.jpg")
    with pytest.raises(ImageError, match="EOI"):
        load_image_bytes(good[: len(good) // 2], "half.jpg")
    sos = good.index(b"\xff\xda")
    with pytest.raises(ImageError, match="scan before any frame header"):
        load_image_bytes(b"\xff\xd8" + good[sos:], "nosof.jpg")


def test_jpeg_decodes_reduced_to_the_size_asked() -> None:
    """reduce_to decodes a large JPEG at a DCT scale keeping both sides at least that long."""
    big = np.tile(GRAY, (40, 40))  # 2560 x 1920
    data = pillow_jpeg(big)
    full = load_image_bytes(data, "big.jpg")
    reduced = load_image_bytes(data, "big.jpg", reduce_to=400)
    assert full.shape == (1920, 2560)
    assert reduced.shape == (480, 640)  # 1/4: both sides stay >= 400
    assert load_image_bytes(data, "big.jpg", reduce_to=1000).shape == (1920, 2560)  # 1/2 would be 960
    # the budget applies to what is decoded: the reduced decode fits where the full one does not
    with pytest.raises(ImageError, match="budget"):
        load_image_bytes(data, "big.jpg", max_decoded_bytes=1_000_000)
    assert load_image_bytes(data, "big.jpg", max_decoded_bytes=1_000_000, reduce_to=400).shape == (480, 640)


def test_dicom_budget_counts_bits_allocated_and_frames() -> None:
    """A DICOM's Rows x Columns x frames x SamplesPerPixel x BitsAllocated/8 is the decoded size."""
    with pytest.raises(ImageError, match=r"512x512 pixels x 4 frames x 1 channels x 2 bytes a sample = 2,097,152"):
        load_image_bytes(dicom_declaring(512, 512, frames=4), "cine.dcm", max_decoded_bytes=2_000_000)


def test_colour_converts_by_rows_as_the_whole_array_does() -> None:
    """An RGB(A) image's luma, converted a block of rows at a time, equals BT.601 over 255
    computed on the whole array in float64."""
    rng = np.random.default_rng(7)
    for shape in ((70, 1500, 3), (33, 20, 4)):
        arr = rng.integers(0, 256, shape, dtype=np.uint8)
        got = load_image_bytes(pillow_png(arr), "c.png")
        want = (arr[:, :, :3].astype(np.float64) @ np.array([0.299, 0.587, 0.114])) / 255.0
        assert got.dtype == np.float32 and np.array_equal(got, np.clip(want, 0, 1).astype(np.float32))

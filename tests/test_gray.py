"""Tests of the conversion of decoded pixels to a GrayImage (``msm_mem.plugins._gray``)."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from msm_mem.plugins import _gray
from msm_mem.plugins.images import load_image_bytes


def test_every_grey_level_is_the_float32_of_its_float64_fraction() -> None:
    """8-bit, 16-bit (either byte order) and grey-with-alpha PNGs holding every level load as
    exactly float32(v / max) computed in float64, C-contiguous: the blocked path is exact,
    over more pixels than one block (a partial last block included)."""
    levels8 = (np.arange(257 * 300) % 256).astype(np.uint8).reshape(257, 300)
    levels16 = (np.arange(257 * 300) % 65536).astype(np.uint16).reshape(257, 300)
    cases = [
        (Image.fromarray(levels8), levels8, 255.0),
        (Image.fromarray(np.stack([levels8, levels8[::-1]], axis=2), mode="LA"), levels8, 255.0),
        (Image.fromarray(levels16), levels16, 65535.0),
        (Image.frombytes("I;16B", (300, 257), levels16.astype(">u2").tobytes()), levels16, 65535.0),
    ]
    for pil, values, top in cases:
        buf = io.BytesIO()
        pil.save(buf, format="PNG")
        want = (values.astype(np.float64) / top).astype(np.float32)
        # through a PNG file, and straight from the decoded image (a PNG may reopen as I;16)
        for img in (load_image_bytes(buf.getvalue(), "levels.png"), _gray.pil_gray(pil, "levels")):
            assert img.dtype == np.float32 and img.flags.c_contiguous
            assert np.array_equal(img, want), pil.mode

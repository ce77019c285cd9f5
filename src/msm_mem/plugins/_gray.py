"""Decoded pixels as a GrayImage (float32, ``(height, width)``, values in ``[0, 1]``): the
conversions the loaders of :mod:`.images` share, apart from reading and decoding files."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from PIL import Image

from .._errors import ImageError

__all__ = ["GrayImage", "array_to_gray", "finish", "minmax", "pil_gray"]

GrayImage = npt.NDArray[np.float32]
"""A grayscale image: float32, shape (height, width), values in [0, 1]."""

_BT601 = np.array([0.299, 0.587, 0.114], dtype=np.float64)
#: grey levels converted at a time: their float64 quotients (512 KiB) stay in the cache
_CHUNK = 1 << 16


def pil_gray(pil: Image.Image, name: str) -> GrayImage:
    """A decoded image as a GrayImage. 8- and 16-bit grey (the modes of radiographs): each
    level divided by the largest in float64 and rounded to float32, as the general path does,
    a block of :data:`_CHUNK` levels at a time, so no full-size float64 copy is made, checked
    or clipped: the result is bit-identical to the general path's. Other modes take the
    general path."""
    if pil.mode in ("L", "LA", "I;16", "I;16B", "I;16L"):
        levels = np.asarray(pil.getchannel("L") if pil.mode == "LA" else pil)
        if levels.ndim == 2 and levels.size and levels.dtype.kind == "u" and levels.dtype.itemsize in (1, 2):
            top = float(np.iinfo(levels.dtype).max)
            flat = np.ascontiguousarray(levels).reshape(-1)
            out = np.empty(flat.size, dtype=np.float32)
            quotients = np.empty(min(flat.size, _CHUNK), dtype=np.float64)
            for start in range(0, flat.size, _CHUNK):
                part = quotients[: min(_CHUNK, flat.size - start)]
                np.divide(flat[start : start + _CHUNK], top, out=part)
                out[start : start + _CHUNK] = part
            return out.reshape(levels.shape)
    if pil.mode in ("RGB", "RGBA") and pil.width and pil.height:
        return _colour_rows(pil)
    return finish(_pil_to_gray(pil), name)


def _colour_rows(pil: Image.Image) -> GrayImage:
    """A decoded 8-bit RGB(A) image as a GrayImage, a block of rows at a time (BT.601 luma over
    255, clipped, as :func:`array_to_gray` and :func:`finish` do, element by element): neither
    a full-size array of its pixels nor a float64 copy is made, so the peak is the decoded
    image and the float32 result."""
    width, height = pil.size
    out = np.empty((height, width), dtype=np.float32)
    rows = max(1, _CHUNK // width)
    for top in range(0, height, rows):
        block = np.asarray(pil.crop((0, top, width, min(height, top + rows))))
        luma = block[:, :, :3].astype(np.float64) @ _BT601
        out[top : top + rows] = np.clip(luma / 255.0, 0.0, 1.0)
    return out


def _pil_to_gray(pil: Image.Image) -> npt.NDArray[np.float64]:
    """Any other decoded mode in float64: 32-bit integers over 0..65535 (some 16-bit files
    open as ``I``), floats min-max scaled, everything else through RGB and BT.601 luma."""
    if pil.mode == "I":
        return np.asarray(pil, dtype=np.float64) / 65535.0
    if pil.mode == "F":
        return minmax(np.asarray(pil, dtype=np.float64))
    return array_to_gray(np.asarray(pil.convert("RGB")), "")


def array_to_gray(a: npt.NDArray[Any], name: str) -> npt.NDArray[np.float64]:
    """A grey or RGB(A) pixel array in float64: uint8 over 255, other types min-max scaled;
    colour through BT.601 luma, alpha ignored."""
    if a.ndim == 2:
        gray = a.astype(np.float64)
        return gray / 255.0 if a.dtype == np.uint8 else minmax(gray)
    if a.ndim == 3 and a.shape[2] in (3, 4):
        rgb = a[:, :, :3].astype(np.float64)
        luma = rgb @ _BT601
        return luma / 255.0 if a.dtype == np.uint8 else minmax(luma)
    raise ImageError(f"{name}: unexpected pixel array of shape {a.shape}")


def minmax(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """``x`` scaled to [0, 1] by its range (zeros when constant); left as is when empty or not
    finite, for :func:`finish` to refuse."""
    if x.size == 0 or not np.all(np.isfinite(x)):
        return x
    lo, hi = float(x.min()), float(x.max())
    if hi <= lo:
        return np.zeros_like(x)
    return (x - lo) / (hi - lo)


def finish(img: npt.NDArray[np.float64], name: str) -> GrayImage:
    """A float64 image as a GrayImage: ImageError when it has no pixels or a non-finite one;
    clipped to [0, 1]."""
    if img.ndim != 2 or img.shape[0] == 0 or img.shape[1] == 0:
        raise ImageError(f"{name}: image has no pixels (shape {img.shape})")
    if not np.all(np.isfinite(img)):
        raise ImageError(f"{name}: image contains non-finite pixel values")
    return np.ascontiguousarray(np.clip(img, 0.0, 1.0), dtype=np.float32)

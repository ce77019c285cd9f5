"""Uploaded images and text fields, checked before anything reads them further: an image's
format and size from its header before its pixels are decoded, a text field's length. Needs no
web framework, so the MCP server checks its inputs with the same code."""

from __future__ import annotations

import io

from ... import ImageError, InvalidInput
from ...plugins.images import detect_format, jpeg_declared, load_image_bytes, png_declared
from .config import ServeConfig

__all__ = ["check_text", "decode_upload"]


def decode_upload(data: bytes, config: ServeConfig) -> object:
    """An uploaded PNG, JPEG or DICOM as the grayscale array the encoder takes. Before any pixel
    is decoded: its structure (PNG chunks and CRCs, JPEG markers), its sides and pixels, and
    its decoded size (pixels x channels x bytes per sample) against ``max_decoded_bytes``; a
    JPEG decodes reduced to ``decode_side``. ImageError (422) for anything empty, truncated,
    corrupt, oversized or of another format; the message names no file."""
    kind = detect_format(data[:132], "upload")
    if kind not in ("png", "jpeg", "dicom"):
        raise ImageError("upload: not a PNG, JPEG or DICOM image")
    width, height = _dimensions(data, kind)
    if width < 1 or height < 1:
        raise ImageError("upload: the image has no pixels")
    if max(width, height) > config.max_image_side or width * height > config.max_image_pixels:
        raise ImageError(
            f"upload: {width}x{height} pixels is over the limit "
            f"({config.max_image_side} a side, {config.max_image_pixels} in all)"
        )
    return load_image_bytes(
        data,
        "upload",
        max_pixels=config.max_image_pixels,
        max_decoded_bytes=config.max_decoded_bytes,
        reduce_to=config.decode_side,
    )


def _dimensions(data: bytes, kind: str | None) -> tuple[int, int]:
    """Width and height from the header (a PNG's or JPEG's structure checked on the way)."""
    if kind == "png":
        declared = png_declared(data, "upload")
        return declared.width, declared.height
    if kind == "jpeg":
        declared = jpeg_declared(data, "upload")
        return declared.width, declared.height
    try:
        import pydicom

        ds = pydicom.dcmread(io.BytesIO(data), stop_before_pixels=True)
        return int(ds.Columns), int(ds.Rows)
    except Exception as exc:  # any decoder failure is a bad upload, not a server error
        raise ImageError(f"upload: the image header cannot be read ({type(exc).__name__})") from None


def check_text(name: str, value: str, limit: int) -> str:
    """``value`` when it has 1..limit characters; InvalidInput otherwise."""
    if not value.strip():
        raise InvalidInput(f"{name} must not be empty")
    if len(value) > limit:
        raise InvalidInput(f"{name} is longer than {limit} characters")
    return value

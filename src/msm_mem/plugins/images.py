"""Image loading for the encoders: PNG, JPEG, DICOM and video keyframes.

Every loader returns one grayscale image as a C-contiguous ``float32`` array of shape
``(height, width)`` with values in ``[0, 1]``:

- PNG / JPEG (Pillow): EXIF orientation is applied; 8-bit values are divided by 255 and
  16-bit values by 65535; colour is converted to luma with the ITU-R BT.601 weights
  ``0.299 R + 0.587 G + 0.114 B`` (alpha is ignored).
- DICOM (pydicom): stored values are mapped through ``RescaleSlope`` / ``RescaleIntercept``;
  then the VOI window ``WindowCenter`` / ``WindowWidth`` is applied with the linear function
  of DICOM PS3.3 C.11.2.1.2 when both are present (the first value when multi-valued),
  otherwise the image is min-max scaled; ``MONOCHROME1`` images are inverted so that higher
  always means brighter. A multi-frame file gives its middle frame (index ``n // 2``).
- Video: :func:`load_keyframe` decodes the middle frame (index ``n // 2`` of the ``n``
  decodable frames, counted by decoding, not taken from container metadata), which makes the
  choice deterministic for a given file. It needs ``imageio`` (with a video plugin) or
  ``opencv-python``; without either it raises :class:`~msm_mem._errors.MissingExtra`.

The format is detected from the content (PNG and JPEG signatures, ``DICM`` at byte offset
128, video container signatures); the file extension is only a fallback for DICOM files that
lack the 128-byte preamble. A constant image (no contrast) loads as all zeros. Any file that
does not exist, is empty, truncated, corrupt or of another format raises
:class:`~msm_mem._errors.ImageError` naming the file and the problem.

Input is bounded before it is decoded (:mod:`msm_mem._limits`): only regular files are read,
never a FIFO or device, and never more than ``max_bytes``; the width and height a PNG or JPEG
header declares, or the rows, columns and frames of a DICOM header, must stay within
``max_pixels``, and the decoded size (pixels x channels x bytes per sample, from the PNG
``IHDR`` bit depth and colour type, the JPEG frame header, the DICOM ``SamplesPerPixel`` and
``BitsAllocated``) within ``max_decoded_bytes``, before any pixel is decoded. A PNG's chunks
(every CRC, an ``IEND`` at the end) and a JPEG's markers (a frame header, ``EOI`` at the end)
are checked first (:mod:`._headers`). With ``reduce_to``, a JPEG is decoded at the smallest
DCT scale (1/2, 1/4, 1/8) that keeps both sides at least ``reduce_to`` pixels (Pillow's draft
mode), for callers whose encoder takes a smaller image. Pillow's own decompression-bomb bound
(``Image.MAX_IMAGE_PIXELS``) still applies on top.
"""

from __future__ import annotations

import importlib
import io
import os
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from PIL import Image, ImageOps

from .._errors import ImageError, MissingExtra
from .._files import read_regular, regular_path
from .._limits import MAX_DECODED_BYTES, MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS, MAX_VIDEO_BYTES
from ._gray import GrayImage, array_to_gray, finish, minmax, pil_gray
from ._headers import Declared, check_budget, jpeg_declared, png_declared

__all__ = [
    "Declared",
    "GrayImage",
    "detect_format",
    "jpeg_declared",
    "load_image",
    "load_image_bytes",
    "load_keyframe",
    "png_declared",
    "resize",
    "to_rgb_uint8",
]


_PNG = b"\x89PNG\r\n\x1a\n"
_JPEG = b"\xff\xd8\xff"
_DICOM_EXTS = {".dcm", ".dicom", ".dic"}
_VIDEO_EXTS = {".mp4", ".m4v", ".mov", ".avi", ".mkv", ".webm", ".mpg", ".mpeg"}


def detect_format(head: bytes, name: str = "") -> str | None:
    """Name the format of a file from its first bytes (at least 132 for DICOM).

    Returns ``"png"``, ``"jpeg"``, ``"dicom"``, ``"video"`` or ``None`` when unknown. ``name``
    (a file name) is only used for DICOM files without preamble and for video containers.
    """
    if head.startswith(_PNG):
        return "png"
    if head.startswith(_JPEG):
        return "jpeg"
    if len(head) >= 132 and head[128:132] == b"DICM":
        return "dicom"
    suffix = Path(name).suffix.lower()
    is_video_magic = (
        head[4:8] == b"ftyp"  # MP4 / QuickTime
        or (head[:4] == b"RIFF" and head[8:12] == b"AVI ")
        or head[:4] == b"\x1a\x45\xdf\xa3"  # Matroska / WebM
        or head[:4] in (b"\x00\x00\x01\xba", b"\x00\x00\x01\xb3")  # MPEG-PS / MPEG-1
    )
    if is_video_magic:
        return "video"
    if suffix in _DICOM_EXTS:
        return "dicom"
    if suffix in _VIDEO_EXTS:
        return "video"
    return None


def load_image(
    path: str | os.PathLike[str],
    *,
    root: str | os.PathLike[str] | None = None,
    max_bytes: int = MAX_IMAGE_BYTES,
    max_pixels: int = MAX_IMAGE_PIXELS,
    max_decoded_bytes: int = MAX_DECODED_BYTES,
) -> GrayImage:
    """Load one image file as grayscale float32 ``(height, width)`` in ``[0, 1]``.

    Only a regular file is read (a FIFO or device is refused without blocking), of at most
    ``max_bytes`` (video: :data:`~msm_mem._limits.MAX_VIDEO_BYTES`), whose declared size is at
    most ``max_pixels`` and whose decoded pixels take at most ``max_decoded_bytes`` (both
    checked from the header, before decoding); with ``root``, the path must
    resolve (links and ``..`` followed) inside it. Video files give their deterministic middle
    keyframe (see :func:`load_keyframe`). Raises :class:`ImageError` for a missing, empty,
    truncated, corrupt, oversized, unsupported or refused file.
    """
    target = regular_path(path, max_bytes=max(max_bytes, MAX_VIDEO_BYTES), root=root, error=ImageError)
    head = read_regular(target, max_bytes=max(max_bytes, MAX_VIDEO_BYTES), error=ImageError, head=132)
    if detect_format(head, target.name) == "video":
        return load_keyframe(target, name=os.fspath(path), max_pixels=max_pixels)
    data = read_regular(target, max_bytes=max_bytes, error=ImageError)
    return load_image_bytes(data, str(target), max_pixels=max_pixels, max_decoded_bytes=max_decoded_bytes)


def load_image_bytes(
    data: bytes,
    name: str,
    *,
    max_pixels: int = MAX_IMAGE_PIXELS,
    max_decoded_bytes: int = MAX_DECODED_BYTES,
    reduce_to: int | None = None,
) -> GrayImage:
    """Decode an image held in memory (an HTTP upload, say); ``name`` labels errors.

    Same formats, output and limits as :func:`load_image` (the caller bounds the bytes);
    ``reduce_to`` (pixels) lets a JPEG decode at a reduced DCT scale that keeps both sides at
    least that long, and the budget applies to what is decoded. Video bytes are written to a
    temporary file for the decoder and the file is removed afterwards.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ImageError(f"{name}: image data must be bytes, got {type(data).__name__}")
    data = bytes(data)
    if not data:
        raise ImageError(f"{name}: file is empty")
    kind = detect_format(data[:132], name)
    if kind in ("png", "jpeg"):
        return _decode_pillow(data, name, kind, max_pixels, max_decoded_bytes, reduce_to)
    if kind == "dicom":
        img = _decode_dicom(data, name, max_pixels, max_decoded_bytes)
    elif kind == "video":
        fd, tmp = tempfile.mkstemp(suffix=Path(name).suffix or ".mp4")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            return load_keyframe(tmp, name=name, max_pixels=max_pixels)
        finally:
            os.unlink(tmp)
    else:
        raise ImageError(f"{name}: unsupported format (expected PNG, JPEG, DICOM or video)")
    return finish(img, name)


def load_keyframe(
    path: str | os.PathLike[str], *, name: str | None = None, max_pixels: int = MAX_IMAGE_PIXELS
) -> GrayImage:
    """Load the middle frame (index ``n // 2`` of ``n`` decoded frames) of a video file.

    Frames are counted by decoding the whole file once, so the choice does not depend on
    container metadata; the frame is then converted like a colour image (BT.601 luma). A frame
    of more than ``max_pixels`` ends decoding with :class:`ImageError` (the decoder has made
    that one frame; containers do not declare sizes this loader could trust).
    Uses ``imageio`` when installed, else ``opencv-python`` (``cv2``); raises
    :class:`MissingExtra` (extra ``video``) when neither is, and :class:`ImageError` when the
    file cannot be decoded or has no frames.
    """
    label = name or str(path)
    regular_path(path, max_bytes=MAX_VIDEO_BYTES, error=ImageError)
    backend = _video_backend()

    def frames() -> Iterator[Any]:
        for frame in backend(str(path)):
            shape = np.shape(frame)
            size = int(shape[0]) * int(shape[1]) if len(shape) >= 2 else 0
            if size > max_pixels:
                raise ImageError(f"{label}: video frame of {size:,} pixels exceeds the limit of {max_pixels:,}")
            yield frame

    try:
        n = sum(1 for _ in frames())
        if n == 0:
            raise ImageError(f"{label}: video has no decodable frames")
        for i, frame in enumerate(frames()):
            if i == n // 2:
                return finish(array_to_gray(np.asarray(frame), label), label)
    except ImageError:
        raise
    except Exception as exc:  # decoders raise many unrelated types; all mean "unreadable"
        raise ImageError(f"{label}: cannot decode video ({exc})") from exc
    raise ImageError(f"{label}: video changed while being read")


def to_rgb_uint8(img: npt.NDArray[Any]) -> npt.NDArray[np.uint8]:
    """Convert a grayscale ``[0, 1]`` image (or an RGB one) to ``(h, w, 3)`` uint8.

    Float input is clipped to ``[0, 1]`` and rounded (``round(v * 255)``); uint8 input is
    passed through; a 2-D image is repeated on three channels.
    """
    a = np.asarray(img)
    if a.ndim not in (2, 3) or (a.ndim == 3 and a.shape[2] != 3) or a.size == 0:
        raise ImageError(f"expected an (h, w) or (h, w, 3) image, got shape {a.shape}")
    if a.dtype != np.uint8:
        a = np.rint(np.clip(a.astype(np.float64), 0.0, 1.0) * 255.0).astype(np.uint8)
    if a.ndim == 2:
        a = np.repeat(a[:, :, None], 3, axis=2)
    return np.ascontiguousarray(a)


def resize(img: npt.NDArray[Any], size: int | tuple[int, int], *, bicubic: bool = False) -> npt.NDArray[Any]:
    """Resize with Pillow's bilinear filter (or bicubic), antialiased when shrinking.

    ``size`` is ``(height, width)`` in pixels, or one int for a square. A 2-D float image is
    resized in float32 (bicubic may overshoot the input range slightly); an ``(h, w, 3)``
    uint8 image stays uint8.
    """
    flt = Image.Resampling.BICUBIC if bicubic else Image.Resampling.BILINEAR
    h, w = (size, size) if isinstance(size, int) else size
    if h < 1 or w < 1:
        raise ValueError(f"size must be positive, got {size!r}")
    a = np.asarray(img)
    if a.ndim == 2:
        pil = Image.fromarray(np.ascontiguousarray(a, dtype=np.float32), mode="F")
        out = pil.resize((w, h), flt)
        return np.asarray(out, dtype=np.float32).copy()
    if a.ndim == 3 and a.shape[2] == 3 and a.dtype == np.uint8:
        out = Image.fromarray(np.ascontiguousarray(a), mode="RGB").resize((w, h), flt)
        return np.asarray(out, dtype=np.uint8).copy()
    raise ImageError(f"cannot resize an array of shape {a.shape} and dtype {a.dtype}")


# --- decoders ---------------------------------------------------------------------------


def _too_large(name: str, what: str, pixels: int, max_pixels: int) -> ImageError:
    return ImageError(f"{name}: image too large: {what} = {pixels:,} pixels exceeds the limit of {max_pixels:,}")


def _decode_pillow(
    data: bytes, name: str, kind: str, max_pixels: int, max_decoded_bytes: int, reduce_to: int | None
) -> GrayImage:
    declared = png_declared(data, name) if kind == "png" else jpeg_declared(data, name)
    width, height = declared.width, declared.height
    if width * height > max_pixels:
        raise _too_large(name, f"{width}x{height}", width * height, max_pixels)
    if kind == "png":
        check_budget(declared, max_decoded_bytes, name)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=[kind.upper()]) as opened:
                if kind == "jpeg":
                    if reduce_to is not None and min(width, height) >= 2 * reduce_to:
                        opened.draft(opened.mode, (reduce_to, reduce_to))  # DCT scaling: nothing decoded yet
                    w, h = opened.size
                    check_budget(Declared(w, h, declared.channels, declared.sample_bytes), max_decoded_bytes, name)
                opened.load()
                return pil_gray(ImageOps.exif_transpose(opened), name)
    except ImageError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageError(f"{name}: image too large ({exc})") from exc
    except Exception as exc:  # a decoder meets malformed data with many unrelated types
        raise ImageError(f"{name}: cannot decode image ({exc})") from exc


def _declared(ds: Any, keyword: str, default: int) -> int:
    value = ds.get(keyword, default)
    return int(value) if value not in (None, "") else default


def _decode_dicom(data: bytes, name: str, max_pixels: int, max_decoded_bytes: int) -> npt.NDArray[np.float64]:
    import pydicom

    try:
        ds = pydicom.dcmread(io.BytesIO(data), force=True)
        if "PixelData" not in ds:
            raise ImageError(f"{name}: DICOM file has no pixel data")
        rows, columns = _declared(ds, "Rows", 0), _declared(ds, "Columns", 0)
        samples, frames = _declared(ds, "SamplesPerPixel", 1) or 1, _declared(ds, "NumberOfFrames", 1) or 1
        pixels = rows * columns * max(frames, 1)
        if pixels > max_pixels:  # from the header: the pixel data is not decoded yet
            raise _too_large(name, f"{rows}x{columns}x{frames} frames", pixels, max_pixels)
        sample_bytes = max(1, (_declared(ds, "BitsAllocated", 8) + 7) // 8)
        check_budget(Declared(columns, rows, samples, sample_bytes, max(frames, 1)), max_decoded_bytes, name)
        arr = np.asarray(ds.pixel_array)
    except ImageError:
        raise
    except RuntimeError as exc:  # pydicom: no handler for a compressed transfer syntax
        raise ImageError(f"{name}: cannot decode DICOM pixel data ({exc})") from exc
    except Exception as exc:  # malformed data surfaces as many unrelated types
        raise ImageError(f"{name}: cannot decode DICOM ({exc})") from exc
    if frames > 1:
        arr = arr[frames // 2]
    if samples == 3:
        return array_to_gray(arr.astype(np.float64), name)  # colour DICOM: luma, min-max
    if arr.ndim != 2:
        raise ImageError(f"{name}: unexpected DICOM pixel array of shape {arr.shape}")
    values = arr.astype(np.float64)
    slope = float(ds.get("RescaleSlope", 1.0) or 1.0)
    intercept = float(ds.get("RescaleIntercept", 0.0) or 0.0)
    values = values * slope + intercept
    window = _first_window(ds)
    out = _voi_window(values, *window) if window is not None else minmax(values)
    if str(ds.get("PhotometricInterpretation", "")).strip().upper() == "MONOCHROME1":
        out = 1.0 - out
    return out


def _first_window(ds: Any) -> tuple[float, float] | None:
    center, width = ds.get("WindowCenter"), ds.get("WindowWidth")
    if center is None or width is None:
        return None

    from pydicom.multival import MultiValue

    def first(v: Any) -> float:
        return float(v[0]) if isinstance(v, MultiValue | list | tuple) else float(v)

    try:
        c, w = first(center), first(width)
    except (TypeError, ValueError, IndexError):
        return None
    return (c, w) if w >= 1.0 and np.isfinite(c) and np.isfinite(w) else None


def _voi_window(x: npt.NDArray[np.float64], c: float, w: float) -> npt.NDArray[np.float64]:
    """DICOM PS3.3 C.11.2.1.2.1 linear VOI function, scaled to [0, 1]."""
    if w == 1.0:
        return (x > c - 0.5).astype(np.float64)
    return np.clip((x - (c - 0.5)) / (w - 1.0) + 0.5, 0.0, 1.0)


# --- video backends ---------------------------------------------------------------------


def _video_backend() -> Any:
    """A function ``path -> iterator of frames`` from imageio or OpenCV."""
    try:
        iio = importlib.import_module("imageio.v3")
    except ImportError:
        iio = None
    if iio is not None:

        def frames_imageio(path: str) -> Iterator[Any]:
            yield from iio.imiter(path)

        return frames_imageio
    try:
        cv2 = importlib.import_module("cv2")
    except ImportError:
        raise MissingExtra("imageio or opencv-python", "video") from None

    def frames_cv2(path: str) -> Iterator[Any]:
        cap = cv2.VideoCapture(path)
        try:
            if not cap.isOpened():
                raise ImageError(f"{path}: cannot open video")
            while True:
                ok, frame = cap.read()
                if not ok:
                    return
                yield frame[:, :, ::-1] if frame.ndim == 3 else frame  # BGR -> RGB
        finally:
            cap.release()

    return frames_cv2

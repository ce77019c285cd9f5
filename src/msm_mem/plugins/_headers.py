"""What a PNG, JPEG or DICOM file declares before a pixel is decoded: its structure checked and
the size of its decoded pixels.

- PNG: the chunk sequence is walked from the signature to ``IEND``: ``IHDR`` first (13 bytes:
  width, height, bit depth, colour type), every chunk's CRC-32 checked, ``IEND`` empty and the
  last bytes of the file. A file without ``IEND``, with a bad CRC or with data after ``IEND``
  is refused.
- JPEG: the markers from ``SOI`` up to the frame header (``SOFn``: precision, height, width,
  components) are walked; it must come before any scan (``SOS``), and the file must end with
  ``EOI`` (``FF D9``).
- DICOM: ``Rows``, ``Columns``, ``NumberOfFrames``, ``SamplesPerPixel`` and ``BitsAllocated``.

The decoded size is ``width x height x frames x channels x bytes per sample`` (a sample of up to
8 bits is one byte, of up to 16 two), what a decoder allocates at least for the pixels; callers
compare it with a budget before they decode (:func:`check_budget`). Every refusal is
:class:`~msm_mem._errors.ImageError` naming the file and what is wrong.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from .._errors import ImageError

__all__ = ["Declared", "check_budget", "jpeg_declared", "png_declared"]

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: PNG colour type -> channels (ISO/IEC 15948, 11.2.2): grey, RGB, palette, grey+alpha, RGBA
_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
_PNG_DEPTHS = {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16), 6: (8, 16)}
#: JPEG start-of-frame markers (SOF0-SOF15 but DHT, JPG and DAC)
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
#: JPEG markers without a length: TEM, RST0-7, SOI, EOI
_STANDALONE = frozenset({0x01, *range(0xD0, 0xDA)})


@dataclass(frozen=True, slots=True)
class Declared:
    """An image's size as its header declares it: pixels, frames, channels per pixel and bytes
    per sample."""

    width: int
    height: int
    channels: int
    sample_bytes: int
    frames: int = 1

    @property
    def decoded_bytes(self) -> int:
        """The bytes its decoded pixels take: width x height x frames x channels x sample bytes."""
        return self.width * self.height * self.frames * self.channels * self.sample_bytes

    def describe(self) -> str:
        frames = f" x {self.frames} frames" if self.frames > 1 else ""
        return (
            f"{self.width}x{self.height} pixels{frames} x {self.channels} channels x {self.sample_bytes} bytes a sample"
        )


def _bad(name: str, what: str) -> ImageError:
    return ImageError(f"{name}: cannot decode image: {what}")


def check_budget(declared: Declared, budget: int, name: str) -> None:
    """ImageError naming the budget when ``declared`` decodes to more than ``budget`` bytes."""
    if declared.decoded_bytes > budget:
        raise ImageError(
            f"{name}: image too large to decode: {declared.describe()} = {declared.decoded_bytes:,} bytes "
            f"exceeds the decoded-image budget of {budget:,} bytes"
        )


def png_declared(data: bytes, name: str) -> Declared:
    """The size ``data`` (a whole PNG file) declares in ``IHDR``, after its chunk structure
    (IHDR first, every CRC, an empty IEND at the very end) is checked; ImageError otherwise."""
    if not data.startswith(_PNG_SIGNATURE):
        raise _bad(name, "not a PNG file")
    view = memoryview(data)
    pos, size = len(_PNG_SIGNATURE), len(data)
    declared: Declared | None = None
    while True:
        if pos + 12 > size:
            raise _bad(name, "PNG ends without its IEND chunk (truncated)")
        length = int.from_bytes(view[pos : pos + 4], "big")
        kind = bytes(view[pos + 4 : pos + 8])
        end = pos + 12 + length
        if length > 0x7FFFFFFF or end > size:
            raise _bad(name, f"PNG chunk {kind!r} at byte {pos} runs past the end of the file (truncated)")
        if zlib.crc32(view[pos + 4 : end - 4]) != int.from_bytes(view[end - 4 : end], "big"):
            raise _bad(name, f"PNG chunk {kind!r} at byte {pos} fails its CRC (corrupt)")
        if declared is None:
            declared = _ihdr(kind, bytes(view[pos + 8 : end - 4]), name)
        elif kind == b"IHDR":
            raise _bad(name, "PNG has a second IHDR chunk")
        elif kind == b"IEND":
            if length != 0:
                raise _bad(name, "PNG IEND chunk is not empty")
            if end != size:
                raise _bad(name, f"PNG has {size - end:,} bytes after its IEND chunk")
            return declared
        pos = end


def _ihdr(kind: bytes, body: bytes, name: str) -> Declared:
    if kind != b"IHDR" or len(body) != 13:
        raise _bad(name, "PNG does not start with a 13-byte IHDR chunk")
    width, height = int.from_bytes(body[0:4], "big"), int.from_bytes(body[4:8], "big")
    depth, colour = body[8], body[9]
    if colour not in _PNG_CHANNELS or depth not in _PNG_DEPTHS[colour]:
        raise _bad(name, f"PNG declares bit depth {depth} with colour type {colour}, which PNG does not define")
    if width < 1 or height < 1:
        raise _bad(name, f"PNG declares no pixels ({width}x{height})")
    return Declared(width, height, _PNG_CHANNELS[colour], 2 if depth == 16 else 1)


def jpeg_declared(data: bytes, name: str) -> Declared:
    """The size ``data`` (a whole JPEG file) declares in its frame header, after its marker
    structure (SOI, the segments up to a frame header that comes before any scan, EOI at the
    very end) is checked; ImageError otherwise."""
    if not data.startswith(b"\xff\xd8"):
        raise _bad(name, "not a JPEG file")
    if not data.endswith(b"\xff\xd9"):
        raise _bad(name, "JPEG does not end with its EOI marker (truncated or corrupt)")
    pos, size = 2, len(data)
    while True:
        if pos + 2 > size or data[pos] != 0xFF:
            raise _bad(name, f"JPEG marker expected at byte {pos} (corrupt)")
        while pos < size and data[pos] == 0xFF:  # fill bytes before a marker
            pos += 1
        if pos >= size:
            raise _bad(name, "JPEG ends inside a marker (truncated)")
        marker = data[pos]
        pos += 1
        if marker in _STANDALONE:
            if marker == 0xD9:
                raise _bad(name, "JPEG ends (EOI) before its first scan")
            continue
        if pos + 2 > size:
            raise _bad(name, f"JPEG segment at byte {pos} is truncated")
        length = int.from_bytes(data[pos : pos + 2], "big")
        if length < 2 or pos + length > size:
            raise _bad(name, f"JPEG segment {marker:#04x} at byte {pos} runs past the end of the file")
        if marker in _SOF:
            return _sof(data[pos + 2 : pos + length], name)
        if marker == 0xDA:
            raise _bad(name, "JPEG scan before any frame header (SOF)")
        pos += length


def _sof(body: bytes, name: str) -> Declared:
    if len(body) < 6:
        raise _bad(name, "JPEG frame header is truncated")
    precision = body[0]
    height, width, components = int.from_bytes(body[1:3], "big"), int.from_bytes(body[3:5], "big"), body[5]
    if width < 1 or height < 1 or components < 1:
        raise _bad(name, f"JPEG declares no pixels ({width}x{height}, {components} components)")
    return Declared(width, height, components, 2 if precision > 8 else 1)

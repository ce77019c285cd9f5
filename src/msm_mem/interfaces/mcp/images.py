"""A tool's image, given one of three ways, each bounded and checked before anything is stored:

- ``image_base64``: the bytes of a PNG, JPEG or DICOM file (a ``data:...;base64,`` prefix is
  allowed), at most the server's upload size once decoded;
- ``image_path``: a file inside one of the server's ``--image-root`` folders (absolute, or
  relative to the first), resolved with its links and ``..`` and read once, as a regular file of
  at most the upload size (the path is not recorded: the store keeps what was read, as for an
  upload);
- ``image_study``: a stored study of the patient (ingested), read by the operation itself
  inside its turn (``MsmMem.ask(..., image_study=...)``: no separate read is audited).

The first two are decoded here the way the HTTP service decodes an upload (format and pixel
count from the header first).
"""

from __future__ import annotations

import base64
import binascii
import re
from pathlib import Path

from ... import ImageError, InvalidInput, MsmMemError
from ..._files import inside, read_regular
from ..http.uploads import decode_upload
from .state import McpState

__all__ = ["image_of"]

_DATA_URL = re.compile(r"\Adata:[\w.+/-]*;base64,", re.ASCII)
_B64 = re.compile(r"\A[A-Za-z0-9+/]*={0,2}\Z", re.ASCII)


def _from_base64(state: McpState, text: str) -> bytes:
    text = _DATA_URL.sub("", text.strip(), count=1)
    text = "".join(text.split())
    if len(text) > state.config.max_image_base64:
        raise InvalidInput(f"image_base64 is over {state.config.server.max_upload_bytes} bytes once decoded")
    if not text or not _B64.match(text) or len(text) % 4:
        raise InvalidInput("image_base64 is not base64 (A-Z, a-z, 0-9, + and /, padded with =)")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput("image_base64 is not base64") from None


def _from_path(state: McpState, text: str) -> bytes:
    roots = state.config.image_roots
    if not roots:
        raise InvalidInput("image_path is off on this server (start it with --image-root DIR); send image_base64")
    path = Path(text)
    if not path.is_absolute():
        path = roots[0] / path
    root = next((r for r in roots if inside(path, r)), None)
    if root is None:
        raise InvalidInput("image_path lies outside the server's image folders (after resolving links and '..')")
    try:
        return read_regular(path, max_bytes=state.config.server.max_upload_bytes, root=root, error=ImageError)
    except ImageError as exc:  # name the file as the caller did, not by the server's folder
        raise ImageError(str(exc).replace(str(path), text)) from None


def image_of(
    state: McpState,
    image_base64: str | None,
    image_path: str | None,
    image_study: str | None,
) -> object:
    """The image of a call: a decoded array (base64 or a file), or None for a stored study (the
    operation reads it itself, given ``image_study``). InvalidInput unless exactly one way is
    given."""
    given = [v for v in (image_base64, image_path, image_study) if v is not None]
    if len(given) != 1:
        raise InvalidInput("give exactly one of image_base64, image_path and image_study")
    if image_study is not None:
        return None
    data = _from_base64(state, image_base64) if image_base64 is not None else _from_path(state, str(image_path))
    # at most max_decodes decodes at once in this process, as in `serve`: their memory is bounded together
    throttle = state.throttle
    if not throttle.decodes.acquire(timeout=throttle.decode_wait_s):
        raise MsmMemError(
            f"every image decoder of this server is busy ({state.config.server.max_decodes} at once): retry in a second"
        )
    try:
        return decode_upload(data, state.config.server)
    finally:
        throttle.decodes.release()

"""Bounds on input from outside, and the checks of ids and text that enforce them.

Every value that enters the library (a manifest row, an API argument, an image file) is bounded
before it is parsed, decoded or stored, so a hostile or broken input costs a clear error, not
the process. The limits are fixed constants, not settings: a caller cannot widen them through
the environment, and a store holds nothing that exceeds them. The image loader takes its two
limits as keyword arguments for callers that need larger images.

| limit | value | applies to |
|---|---|---|
| :data:`MAX_ID_CHARS` | 256 | patient and study ids |
| :data:`MAX_QUESTION_CHARS` | 16,384 | a question (manifest, ``ask``, ``observe``) |
| :data:`MAX_TEXT_CHARS` | 131,072 | answer, report, decision, correction |
| :data:`MAX_TAG_CHARS` | 256 | view / visual tag |
| :data:`MAX_PATH_CHARS` | 4,096 | an image path |
| :data:`MAX_ROW_CHARS` | 1,048,576 | one manifest row (a JSONL line, a CSV record) |
| :data:`MAX_JSON_DEPTH` | 16 | nesting of a JSONL row (a valid row is flat: depth 1) |
| :data:`MAX_IMAGE_BYTES` | 256 MiB | an image file (PNG, JPEG, DICOM) |
| :data:`MAX_VIDEO_BYTES` | 2 GiB | a video file |
| :data:`MAX_IMAGE_PIXELS` | 33,554,432 | declared width x height (x frames), checked before decoding |
| :data:`MAX_BATCH_PIXELS` | 268,435,456 | decoded pixels ingest holds before it encodes a batch |

An id is valid when it is a non-blank string of at most :data:`MAX_ID_CHARS` characters with
no ``*`` (the consent wildcard), no control or format character (``\\x00``, newlines, tabs,
bidirectional overrides, zero-width characters) and no line or paragraph separator.
"""

from __future__ import annotations

import math
import unicodedata

from ._errors import InvalidInput

__all__ = [
    "MAX_BATCH_PIXELS",
    "MAX_ID_CHARS",
    "MAX_IMAGE_BYTES",
    "MAX_IMAGE_PIXELS",
    "MAX_JSON_DEPTH",
    "MAX_PATH_CHARS",
    "MAX_QUESTION_CHARS",
    "MAX_ROW_CHARS",
    "MAX_TAG_CHARS",
    "MAX_TEXT_CHARS",
    "MAX_VIDEO_BYTES",
    "MAX_CLOCK_SKEW_S",
    "check_id",
    "check_observation",
    "check_query_time",
    "check_path",
    "check_text",
]

MAX_ID_CHARS = 256
MAX_QUESTION_CHARS = 16_384
MAX_TEXT_CHARS = 131_072
MAX_TAG_CHARS = 256
MAX_PATH_CHARS = 4_096
MAX_ROW_CHARS = 1_048_576
MAX_JSON_DEPTH = 16
MAX_IMAGE_BYTES = 256 * 1024 * 1024
MAX_VIDEO_BYTES = 2 * 1024 * 1024 * 1024
MAX_IMAGE_PIXELS = 32 * 1024 * 1024
MAX_BATCH_PIXELS = 256 * 1024 * 1024
#: how far after the store's clock a query's time may lie (a client clock a little ahead)
MAX_CLOCK_SKEW_S = 300.0

#: control, format, surrogate and private-use characters, line and paragraph separators
_BAD_ID_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Zl", "Zp"})


def _unicode(name: str, value: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(f"{name} is not valid Unicode text (it holds a lone surrogate)") from None


def check_id(name: str, value: object, *, allow_empty: bool = False) -> str:
    """``value`` if it is a valid id (see the module docstring), else :class:`InvalidInput`
    naming ``name``; ``allow_empty`` admits ``""`` (an optional id left out)."""
    if not isinstance(value, str):
        raise InvalidInput(f"{name} must be a string, got {type(value).__name__}")
    if allow_empty and value == "":
        return value
    if not value.strip():
        raise InvalidInput(f"{name} must not be blank")
    if len(value) > MAX_ID_CHARS:
        raise InvalidInput(f"{name} is longer than {MAX_ID_CHARS} characters ({len(value)})")
    if "*" in value:
        raise InvalidInput(f"{name} must not contain '*' (the consent wildcard)")
    bad = next((ch for ch in value if unicodedata.category(ch) in _BAD_ID_CATEGORIES), None)
    if bad is not None:
        raise InvalidInput(f"{name} must not contain control or separator characters (found {bad!r})")
    return value


def check_text(name: str, value: object, limit: int, *, required: bool = False) -> str:
    """``value`` if it is a string of at most ``limit`` characters (non-blank when
    ``required``) that can be stored as UTF-8, else :class:`InvalidInput` naming ``name``."""
    if not isinstance(value, str):
        raise InvalidInput(f"{name} must be a string, got {type(value).__name__}")
    if len(value) > limit:
        raise InvalidInput(f"{name} is longer than {limit:,} characters ({len(value):,})")
    if required and not value.strip():
        raise InvalidInput(f"{name} must not be empty")
    _unicode(name, value)
    return value


def check_path(name: str, value: object) -> str:
    """``value`` if it is a path string of at most :data:`MAX_PATH_CHARS` characters without
    a NUL byte, else :class:`InvalidInput` naming ``name``."""
    text = check_text(name, value, MAX_PATH_CHARS)
    if "\x00" in text:
        raise InvalidInput(f"{name} must not contain a NUL character")
    return text


def check_observation(question: object, *, study_id: object = "", visual_tag: object = "") -> None:
    """Check what one observation brings in: a non-empty question of at most
    :data:`MAX_QUESTION_CHARS`, an optional study id, a visual tag of at most
    :data:`MAX_TAG_CHARS`; :class:`InvalidInput` names the first bad one."""
    check_text("question", question, MAX_QUESTION_CHARS, required=True)
    check_id("study_id", study_id, allow_empty=True)
    check_text("visual_tag", visual_tag, MAX_TAG_CHARS)


def check_query_time(name: str, value: object, now: float) -> float:
    """``value`` as a query's clinical time in UTC seconds: a finite number within the years
    1-9999 and not more than :data:`MAX_CLOCK_SKEW_S` after ``now`` (a query cannot be asked
    from the future: freshness would reward every record); InvalidInput naming ``name`` otherwise."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise InvalidInput(f"{name} must be a finite number of UTC seconds, got {value!r}")
    if not -62_135_596_800.0 <= value <= 253_402_300_799.0:
        raise InvalidInput(f"{name} is outside the years 1-9999, got {value!r}")
    if value > now + MAX_CLOCK_SKEW_S:
        raise InvalidInput(f"{name} lies {value - now:.0f} s after now: a query's time cannot be in the future")
    return float(value)

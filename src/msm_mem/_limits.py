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
| :data:`MAX_DECODED_BYTES` | 128 MiB | declared pixels x channels x bytes per sample, checked before decoding |
| :data:`MAX_BATCH_PIXELS` | 268,435,456 | decoded pixels ingest holds before it encodes a batch |

Text from outside is Unicode in NFC, checked here and nowhere else:

- An id (patient, study, item, consent) is a non-blank string of at most :data:`MAX_ID_CHARS`
  characters in NFC with no ``*`` (the consent wildcard), no control or format character
  (``\\x00``, newlines, tabs, C1 controls, bidirectional overrides and isolates, zero-width
  characters), no private-use character and no line or paragraph separator.
- An actor id (a principal, the ``<id>`` of a grantee ``actor:<id>``) is a short printable
  token: an ASCII letter or digit, then up to 127 of ``A-Za-z0-9._@:+-``.
- A grantee is ``actor:<actor id>`` or ``role:<role>`` of a known role.
- Free text (questions, answers, reports, decisions, corrections, tags, reasons) is normalised
  to NFC and may hold tabs and line breaks (``\\n``, ``\\r\\n``) but no other C0 or C1 control,
  no bidirectional override or isolate (U+202A-U+202E, U+2066-U+2069) and no zero-width
  formatting character (U+200B-U+200D, U+2060-U+2064, U+FEFF, U+180E).

A refusal is :class:`InvalidInput` naming the field and the character as ``U+XXXX``. Stored
content is not re-checked when it is read: a record written before a rule existed stays readable.
"""

from __future__ import annotations

import math
import re
import unicodedata

from ._errors import InvalidInput

__all__ = [
    "MAX_BATCH_PIXELS",
    "MAX_DECODED_BYTES",
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
    "ACTOR_ID_PATTERN",
    "ID_SCHEMA_PATTERN",
    "PATIENT_PATH_PATTERN",
    "REQUIRED_TEXT_SCHEMA_PATTERN",
    "TEXT_SCHEMA_PATTERN",
    "check_actor_id",
    "check_grantee",
    "check_id",
    "check_observation",
    "check_query_time",
    "check_path",
    "check_text",
    "nfc",
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
#: an image's decoded pixels (what a decoder allocates): a 16-bit RGBA 8192 x 4096 is twice this
MAX_DECODED_BYTES = 128 * 1024 * 1024
#: how far after the store's clock a query's time may lie (a client clock a little ahead)
MAX_CLOCK_SKEW_S = 300.0

#: the characters of the categories below up to U+FFFF (Unicode 14), as the body of a
#: regular-expression class, for schemas that say what check_id says. JSON Schema patterns are
#: ECMA-262, which names no code point past U+FFFF without the u flag: the format and
#: private-use characters of the other planes are refused by the server alone
_ID_BAD_CLASS = (
    r"\u0000-\u001f\u007f-\u009f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u180e"
    r"\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ue000-\uf8ff\ufeff\ufff9-\ufffb"
)
#: what free text may not hold, as a class body: C0 and C1 controls (a CR too: a schema cannot
#: say "only before a LF"), bidirectional overrides and isolates, zero-width characters
_TEXT_BAD_CLASS = (
    r"\u0000-\u0008\u000b-\u001f\u007f-\u009f\u180e\u200b-\u200d\u202a-\u202e\u2060-\u2064"
    r"\u2066-\u2069\ufeff"
)
#: an id as a schema pattern (JSON Schema, pydantic): non-blank, no ``*``, no character check_id
#: refuses; whether it is NFC is checked by the server alone
ID_SCHEMA_PATTERN = rf"^[^*{_ID_BAD_CLASS}]*[^*\s{_ID_BAD_CLASS}][^*{_ID_BAD_CLASS}]*$"
#: a patient id in a URL path: an id without blanks or commas (an API key's scope lists them)
PATIENT_PATH_PATTERN = rf"^[^*,\s{_ID_BAD_CLASS}]+$"
#: free text as a schema pattern: no character check_text refuses (nor a CR)
TEXT_SCHEMA_PATTERN = rf"^[^{_TEXT_BAD_CLASS}]*$"
#: required free text as a schema pattern: as TEXT_SCHEMA_PATTERN, and not blank
REQUIRED_TEXT_SCHEMA_PATTERN = rf"^[^{_TEXT_BAD_CLASS}]*[^\s{_TEXT_BAD_CLASS}][^{_TEXT_BAD_CLASS}]*$"
#: control, format, surrogate and private-use characters, line and paragraph separators
_BAD_ID_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Zl", "Zp"})
#: bidirectional embeddings, overrides and isolates: they reorder what a reader sees
_BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
#: zero-width formatting characters: invisible, they make equal-looking text differ
_ZERO_WIDTH = frozenset("\u200b\u200c\u200d\u2060\u2061\u2062\u2063\u2064\ufeff\u180e")
#: the controls free text may hold (a CR only as part of CRLF, checked apart)
_TEXT_CONTROLS = frozenset("\t\n\r")
#: an actor id: a short printable token (no spaces, control characters or the ``*`` wildcard)
ACTOR_ID_PATTERN = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._@:+-]{0,127}\Z")


def _codepoint(ch: str) -> str:
    return f"U+{ord(ch):04X}"


def _unicode(name: str, value: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(f"{name} is not valid Unicode text (it holds a lone surrogate)") from None


def nfc(value: str) -> str:
    """``value`` in Unicode normalisation form C (composed: ``e`` + U+0301 becomes U+00E9)."""
    return value if unicodedata.is_normalized("NFC", value) else unicodedata.normalize("NFC", value)


def check_id(name: str, value: object, *, allow_empty: bool = False) -> str:
    """``value`` if it is a valid id (see the module docstring), else :class:`InvalidInput`
    naming ``name`` (and the offending character as ``U+XXXX``); ``allow_empty`` admits ``""``
    (an optional id left out). An id is never rewritten: one not in NFC is refused, so two
    spellings of one id cannot name two patients or one patient twice."""
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
        raise InvalidInput(f"{name} must not contain control, format or separator characters (found {_codepoint(bad)})")
    if not unicodedata.is_normalized("NFC", value):
        raise InvalidInput(f"{name} is not in Unicode NFC (normalise it before use)")
    return value


def check_actor_id(name: str, value: object) -> str:
    """``value`` if it is an actor id (see the module docstring), else :class:`InvalidInput`
    naming ``name`` and the rule."""
    if not isinstance(value, str) or not ACTOR_ID_PATTERN.match(value):
        raise InvalidInput(
            f"{name} must be an ASCII letter or digit followed by at most 127 of A-Za-z0-9._@:+- "
            f"(no spaces or control characters), got {str(value)[:40]!r}"
        )
    return value


def check_grantee(value: object, *, roles: frozenset[str] | set[str]) -> str:
    """``value`` if it is a grantee: ``actor:<actor id>`` or ``role:<role>`` with a role of
    ``roles``; :class:`InvalidInput` naming the rule otherwise."""
    if not isinstance(value, str):
        raise InvalidInput(f"consent grantee must be a string, got {type(value).__name__}")
    if value.startswith("actor:"):
        check_actor_id("consent grantee actor:<id>", value[6:])
        return value
    if value.startswith("role:"):
        if value[5:] not in roles:
            raise InvalidInput(f"unknown role {value[5:]!r}: use one of {', '.join(sorted(roles))}")
        return value
    raise InvalidInput(f"consent grantee must be actor:<id> or role:<role>, got {value[:40]!r}")


def _check_characters(name: str, value: str) -> None:
    """Refuse the controls, bidirectional and zero-width characters free text must not hold."""
    for i, ch in enumerate(value):
        if ch in _BIDI:
            raise InvalidInput(f"{name} must not contain a bidirectional override or isolate (found {_codepoint(ch)})")
        if ch in _ZERO_WIDTH:
            raise InvalidInput(f"{name} must not contain a zero-width character (found {_codepoint(ch)})")
        if unicodedata.category(ch) == "Cc":
            if ch == "\r" and value[i + 1 : i + 2] == "\n":
                continue
            if ch not in _TEXT_CONTROLS or ch == "\r":
                raise InvalidInput(f"{name} must not contain a control character (found {_codepoint(ch)})")


def check_text(name: str, value: object, limit: int, *, required: bool = False) -> str:
    """``value`` in NFC if it is a string of at most ``limit`` characters (non-blank when
    ``required``) that can be stored as UTF-8 and holds no control character other than tab
    and line breaks, no bidirectional override or isolate and no zero-width character; else
    :class:`InvalidInput` naming ``name`` (and the character as ``U+XXXX``)."""
    if not isinstance(value, str):
        raise InvalidInput(f"{name} must be a string, got {type(value).__name__}")
    if len(value) > limit:
        raise InvalidInput(f"{name} is longer than {limit:,} characters ({len(value):,})")
    if required and not value.strip():
        raise InvalidInput(f"{name} must not be empty")
    _unicode(name, value)
    if not (value.isascii() and value.isprintable()):
        _check_characters(name, value)
    return nfc(value)


def check_path(name: str, value: object) -> str:
    """``value`` if it is a path string of at most :data:`MAX_PATH_CHARS` characters without
    a NUL byte, else :class:`InvalidInput` naming ``name``. A path is not normalised: it names
    a file by its bytes."""
    if not isinstance(value, str):
        raise InvalidInput(f"{name} must be a string, got {type(value).__name__}")
    if len(value) > MAX_PATH_CHARS:
        raise InvalidInput(f"{name} is longer than {MAX_PATH_CHARS:,} characters ({len(value):,})")
    _unicode(name, value)
    if "\x00" in value:
        raise InvalidInput(f"{name} must not contain a NUL character")
    return value


def check_observation(question: object, *, study_id: object = "", visual_tag: object = "") -> tuple[str, str, str]:
    """Check what one observation brings in: a non-empty question of at most
    :data:`MAX_QUESTION_CHARS`, an optional study id, a visual tag of at most
    :data:`MAX_TAG_CHARS`; returns ``(question, study_id, visual_tag)`` with the text in NFC,
    or :class:`InvalidInput` naming the first bad one."""
    return (
        check_text("question", question, MAX_QUESTION_CHARS, required=True),
        check_id("study_id", study_id, allow_empty=True),
        check_text("visual_tag", visual_tag, MAX_TAG_CHARS),
    )


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

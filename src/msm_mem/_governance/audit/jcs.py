"""RFC 8785 JSON Canonicalization Scheme (JCS) and a strict JSON reader.

:func:`canonicalize` turns a JSON-compatible Python value into the one byte string RFC 8785
allows for it: object keys sorted by their UTF-16 code units, no insignificant whitespace,
numbers in ECMAScript ``Number.prototype.toString`` form (``1e+21``, ``0.000001``, ``56``),
strings with the minimal escaping of RFC 8785 section 3.2.2.2, encoded as UTF-8. Hashes and
signatures in the audit tier are computed over these bytes.

:func:`loads_strict` is the reader to use before canonicalising untrusted text: Python's
``json.loads`` silently keeps the last of two duplicate keys, accepts ``NaN`` and lone
surrogates, and reads integers that no other JSON implementation can represent exactly; this
reader refuses all of them with :class:`~msm_mem._errors.CanonicalJSONError`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any, NoReturn

from ..._errors import CanonicalJSONError

__all__ = ["MAX_SAFE_INTEGER", "canonicalize", "loads_strict", "number_text"]

MAX_SAFE_INTEGER = 2**53 - 1
"""The largest integer magnitude that an IEEE 754 double (and so every JSON reader) keeps exact."""

# The C string encoder of the json module escapes exactly what RFC 8785 requires: '"', '\\',
# \b \t \n \f \r as two-character escapes, other controls below U+0020 as lowercase \u00xx,
# and leaves every other character (U+007F, non-ASCII) as itself.
_encode_str = json.encoder.encode_basestring

# A \uD800-\uDFFF escape; only text that contains one can decode to a lone surrogate.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def canonicalize(value: object) -> bytes:
    """Return the RFC 8785 canonical UTF-8 bytes of ``value``.

    ``value`` may nest ``dict`` (or any ``Mapping``) with ``str`` keys, ``list``/``tuple``,
    ``str``, ``int``, ``float``, ``bool`` and ``None``. Integral floats serialise without a
    fraction (``56.0`` -> ``56``), ``-0.0`` as ``0``.

    Raises :class:`CanonicalJSONError` for NaN or infinite floats, integers outside
    ``+-(2**53 - 1)``, non-``str`` keys, strings or keys holding a lone surrogate, any other
    type, and cyclic or too deeply nested structures.
    """
    try:
        text = _encode(value)
    except RecursionError:
        raise CanonicalJSONError("structure is cyclic or nested too deeply") from None
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise CanonicalJSONError(f"string contains a lone surrogate at position {exc.start}") from None


def _utf16_key(key: str) -> bytes:
    # Big-endian UTF-16 bytes compare exactly like the sequence of UTF-16 code units.
    return key.encode("utf-16-be", "surrogatepass")


def _encode(value: object) -> str:
    kind = type(value)
    if kind is str:
        return _encode_str(value)  # type: ignore[arg-type]
    if kind is int:
        return _int_text(value)  # type: ignore[arg-type]
    if kind is float:
        return number_text(value)  # type: ignore[arg-type]
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if kind is dict or isinstance(value, Mapping):
        return _encode_object(value)  # type: ignore[arg-type]
    if kind is list or kind is tuple:
        return "[" + ",".join([_encode(item) for item in value]) + "]"  # type: ignore[attr-defined]
    # Subclasses (StrEnum, IntEnum, ...) are encoded as the builtin value they hold.
    if isinstance(value, str):
        return _encode_str(str.__str__(value))
    if isinstance(value, int):
        return _int_text(int(value))
    if isinstance(value, float):
        return number_text(float(value))
    if isinstance(value, list | tuple):
        return "[" + ",".join([_encode(item) for item in value]) + "]"
    raise CanonicalJSONError(f"cannot canonicalise a value of type {kind.__name__}")


def _encode_object(value: Mapping[object, object]) -> str:
    keys: list[str] = []
    for key in value:
        if not isinstance(key, str):
            raise CanonicalJSONError(f"object key {key!r} is not a string")
        keys.append(key)
    # Code-point order equals UTF-16 order unless a key holds a character above U+FFFF.
    if "".join(keys).isascii():
        keys.sort()
    else:
        keys.sort(key=_utf16_key)
    return "{" + ",".join([_encode_str(k) + ":" + _encode(value[k]) for k in keys]) + "}"


def _int_text(value: int) -> str:
    if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
        return str(value)
    raise CanonicalJSONError(f"integer {value} is outside +-(2**53 - 1)")


def number_text(value: float) -> str:
    """The ECMAScript ``Number.prototype.toString`` form of a finite float (RFC 8785 3.2.2.3).

    Raises :class:`CanonicalJSONError` for NaN and infinities.
    """
    if value == 0.0:
        return "0"  # also -0.0
    if not math.isfinite(value):
        raise CanonicalJSONError(f"{value!r} is not valid JSON")
    # repr() gives the shortest digits that round-trip, as ECMAScript requires. Where repr
    # uses plain notation (1e-4 <= |value| < 1e16) ECMAScript does too, with the same
    # digits, except that repr marks integral values with ".0".
    text = repr(value)
    if "e" not in text:
        return text[:-2] if text.endswith(".0") else text
    sign = "-" if value < 0 else ""
    mantissa, _, exponent = text.lstrip("-").partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = whole + fraction
    point = len(whole) + int(exponent)
    significant = digits.lstrip("0")
    point -= len(digits) - len(significant)
    significant = significant.rstrip("0")
    k, n = len(significant), point  # value = 0.<significant> * 10**n
    if k <= n <= 21:
        text = significant + "0" * (n - k)
    elif 0 < n <= 21:
        text = significant[:n] + "." + significant[n:]
    elif -6 < n <= 0:
        text = "0." + "0" * (-n) + significant
    else:
        exp = n - 1
        head = significant[0] + ("." + significant[1:] if k > 1 else "")
        text = head + "e" + ("+" if exp >= 0 else "-") + str(abs(exp))
    return sign + text


# ---------------------------------------------------------------------------- strict reader


def _object_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise CanonicalJSONError(f"duplicate object key {key!r}")
            seen.add(key)
    return obj


def _reject_constant(name: str) -> NoReturn:
    raise CanonicalJSONError(f"{name} is not valid JSON")


def _strict_int(text: str) -> int:
    # The length test keeps int() away from huge digit strings (and their quadratic cost).
    if len(text) <= 17:
        value = int(text)
        if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            return value
    raise CanonicalJSONError(f"integer {text[:40]} is outside +-(2**53 - 1)")


def _strict_float(text: str) -> float:
    value = float(text)
    if math.isfinite(value):
        return value
    raise CanonicalJSONError(f"number {text[:40]} overflows a double")


def _check_strings(value: object) -> None:
    """Raise if any string or key under ``value`` holds a lone surrogate."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise CanonicalJSONError(f"string {item!r} contains a lone surrogate") from None
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def loads_strict(data: str | bytes | bytearray | memoryview) -> Any:
    """Parse one JSON text (RFC 8259), refusing what canonical JSON cannot represent.

    Bytes must be UTF-8 without a byte-order mark. Objects become ``dict``, arrays ``list``,
    integer literals ``int`` and other numbers ``float``. Raises :class:`CanonicalJSONError`
    for malformed JSON, duplicate keys at any depth, lone surrogates (raw or escaped, such as
    ``"\\ud800"``), ``NaN``/``Infinity``/``-Infinity``, integer literals outside
    ``+-(2**53 - 1)`` and numbers too large for a double.
    """
    if isinstance(data, str):
        text = data
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise CanonicalJSONError(f"text contains a lone surrogate at position {exc.start}") from None
    elif isinstance(data, bytes | bytearray | memoryview):
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CanonicalJSONError(f"not UTF-8: {exc.reason} at byte {exc.start}") from None
    else:
        raise CanonicalJSONError(f"cannot parse a value of type {type(data).__name__}")
    if text.startswith("\ufeff"):
        raise CanonicalJSONError("text starts with a byte-order mark")
    try:
        value = json.loads(
            text,
            object_pairs_hook=_object_pairs,
            parse_constant=_reject_constant,
            parse_int=_strict_int,
            parse_float=_strict_float,
        )
    except CanonicalJSONError:
        raise
    except RecursionError:
        raise CanonicalJSONError("JSON nested too deeply") from None
    except ValueError as exc:
        raise CanonicalJSONError(f"invalid JSON: {exc}") from None
    if _SURROGATE_ESCAPE.search(text):
        _check_strings(value)
    return value

"""Tests for msm_mem._governance.audit.jcs: RFC 8785 canonical JSON and the strict reader."""

from __future__ import annotations

import math
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from msm_mem._errors import CanonicalJSONError
from msm_mem._governance.audit.jcs import MAX_SAFE_INTEGER, canonicalize, loads_strict, number_text

JCS = Path(__file__).resolve().parents[1].parent / "shared" / "testvectors" / "jcs"
VECTORS = sorted(p.name for p in (JCS / "input").glob("*.json")) if JCS.is_dir() else []

# Strings without lone surrogates (utf-8 encodable), the only text canonical JSON can hold.
texts = st.text(st.characters(codec="utf-8"), max_size=12)
# Doubles from 2**53 up to 1e21 print as integer literals that loads_strict refuses.
floats = st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: abs(x) < 2**53 or abs(x) >= 1e21)
scalars = st.none() | st.booleans() | st.integers(-MAX_SAFE_INTEGER, MAX_SAFE_INTEGER) | floats | texts
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=20,
)


@pytest.mark.shared
@pytest.mark.parametrize("name", VECTORS or ["absent"])
def test_reference_vectors(name: str) -> None:
    """Each input/X.json canonicalises to exactly output/X.json and outhex/X.txt."""
    if not VECTORS:
        pytest.skip("../shared/testvectors/jcs absent")
    got = canonicalize(loads_strict((JCS / "input" / name).read_bytes()))
    assert got == (JCS / "output" / name).read_bytes()
    hex_text = (JCS / "outhex" / (Path(name).stem + ".txt")).read_text()
    assert got == bytes(int(h, 16) for h in hex_text.split())


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.0, "0"),
        (-0.0, "0"),
        (56.0, "56"),
        (-1.5, "-1.5"),
        (1e21, "1e+21"),
        (1e20, "100000000000000000000"),
        (1e16, "10000000000000000"),
        (2.0**60, "1152921504606847000"),
        (1e-6, "0.000001"),
        (1e-7, "1e-7"),
        (-1e-5, "-0.00001"),
        (123e-20, "1.23e-18"),
        (5e-324, "5e-324"),
        (1.7976931348623157e308, "1.7976931348623157e+308"),
        (0.1 + 0.2, "0.30000000000000004"),
        (333333333.33333329, "333333333.3333333"),
        (1e30, "1e+30"),
        (2.0**-24, "5.960464477539063e-8"),  # 16 digits: only the upper neighbour round-trips
        (623203260495222.75, "623203260495222.8"),  # exact tie between .7 and .8: even digit
    ],
)
def test_number_text_table(value: float, text: str) -> None:
    """Floats print in ECMAScript Number.prototype.toString form."""
    assert number_text(value) == text


def _reference_number(x: float) -> str:
    """ECMAScript formatting from an independent shortest-digits search over exact decimals."""
    if x == 0:
        return "0"
    exact = Decimal(abs(x))
    for k in range(1, 18):
        quantum = Decimal(1).scaleb(exact.adjusted() - k + 1)
        candidates = {exact.quantize(quantum, rounding=r) for r in (ROUND_FLOOR, ROUND_CEILING)}
        fits = [c for c in candidates if float(c) == abs(x)]
        if fits:  # ES: fewest digits, then closest to x, then an even last digit
            best = min(fits, key=lambda c: (abs(c - exact), int(c.as_tuple().digits[-1]) % 2))
            break
    digits = str(best.scaleb(-best.adjusted() + k - 1).to_integral_exact()).rstrip("0")
    k, n = len(digits), best.adjusted() + 1
    if k <= n <= 21:
        s = digits + "0" * (n - k)
    elif 0 < n <= 21:
        s = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        s = "0." + "0" * -n + digits
    else:
        s = digits[0] + ("." + digits[1:] if k > 1 else "") + f"e{n - 1:+d}"
    return ("-" if x < 0 else "") + s


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_number_text_matches_reference(x: float) -> None:
    """number_text agrees with an independent ES formatter and round-trips exactly."""
    assert number_text(x) == _reference_number(x)
    assert float(number_text(x)) == x


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_canonicalize_rejects_non_finite(bad: float) -> None:
    """NaN and infinities cannot be canonicalised."""
    with pytest.raises(CanonicalJSONError):
        canonicalize({"x": [bad]})


@pytest.mark.parametrize("bad", [2**53, -(2**53), 10**30])
def test_canonicalize_rejects_unsafe_integers(bad: int) -> None:
    """Integers outside +-(2**53 - 1) are refused; the bounds themselves are accepted."""
    with pytest.raises(CanonicalJSONError):
        canonicalize([bad])
    assert canonicalize([MAX_SAFE_INTEGER, -MAX_SAFE_INTEGER]) == b"[9007199254740991,-9007199254740991]"


@pytest.mark.parametrize("bad", [{1: "a"}, {None: 1}, {("a",): 1}])
def test_canonicalize_rejects_non_string_keys(bad: object) -> None:
    """Object keys must be strings."""
    with pytest.raises(CanonicalJSONError, match="not a string"):
        canonicalize(bad)


@pytest.mark.parametrize("bad", ["\ud800", ["a\udfffb"], {"\udc00": 1}])
def test_canonicalize_rejects_lone_surrogates(bad: object) -> None:
    """Lone surrogates in strings or keys are refused."""
    with pytest.raises(CanonicalJSONError, match="surrogate"):
        canonicalize(bad)


@pytest.mark.parametrize("bad", [b"x", {1, 2}, object(), 1j])
def test_canonicalize_rejects_other_types(bad: object) -> None:
    """Only JSON types are accepted."""
    with pytest.raises(CanonicalJSONError, match="cannot canonicalise"):
        canonicalize(bad)


def test_canonicalize_rejects_cycles() -> None:
    """A self-containing list raises CanonicalJSONError, not RecursionError."""
    cyclic: list[object] = []
    cyclic.append(cyclic)
    with pytest.raises(CanonicalJSONError, match="cyclic"):
        canonicalize(cyclic)


def test_keys_sort_by_utf16_code_units() -> None:
    """An astral key (surrogate pair D83D...) sorts before U+E000, unlike code-point order."""
    assert canonicalize({"\ue000": 1, "\U0001f600": 2, "a": 3}) == ('{"a":3,"\U0001f600":2,"\ue000":1}'.encode())


def test_minimal_string_escaping() -> None:
    """Only quote, backslash and controls are escaped; U+007F and non-ASCII stay literal."""
    got = canonicalize(['"\\\b\f\n\r\t\x00\x1f\x7f/é€'])
    assert got == '["\\"\\\\\\b\\f\\n\\r\\t\\u0000\\u001f\x7f/é€"]'.encode()


def test_subclasses_encode_as_builtin_values() -> None:
    """bool, StrEnum-like and int subclasses encode as the values they hold."""
    from enum import IntEnum, StrEnum

    class Colour(StrEnum):
        RED = "red"

    class Size(IntEnum):
        BIG = 7

    assert canonicalize([True, False, None, Colour.RED, Size.BIG]) == b'[true,false,null,"red",7]'


@pytest.mark.parametrize(
    "text",
    ['{"a":1,"a":2}', '[{"b":{"x":1,"x":1}}]', '{"a":"\\u0061","\\u0061":1}'],
)
def test_loads_strict_rejects_duplicate_keys(text: str) -> None:
    """Duplicate keys at any depth (also when spelled with escapes) are refused."""
    with pytest.raises(CanonicalJSONError, match="duplicate"):
        loads_strict(text)


@pytest.mark.parametrize("text", ['"\\ud800"', '["\\udc00"]', '{"\\ud83d":1}', '"a\\uDBFFb"', '"\ud800"'])
def test_loads_strict_rejects_lone_surrogates(text: str) -> None:
    """Escaped or raw lone surrogates anywhere are refused."""
    with pytest.raises(CanonicalJSONError, match="surrogate"):
        loads_strict(text)


def test_loads_strict_accepts_surrogate_pairs() -> None:
    """An escaped surrogate pair decodes to one astral character."""
    assert loads_strict('["\\ud83d\\ude02", "\\\\ud800"]') == ["\U0001f602", "\\ud800"]


@pytest.mark.parametrize("text", ["NaN", "[Infinity]", '{"x":-Infinity}'])
def test_loads_strict_rejects_non_finite_literals(text: str) -> None:
    """NaN, Infinity and -Infinity literals are refused."""
    with pytest.raises(CanonicalJSONError, match="not valid JSON"):
        loads_strict(text)


@pytest.mark.parametrize("text", ["9007199254740992", "[-9007199254740992]", "1" * 5000])
def test_loads_strict_rejects_unsafe_integers(text: str) -> None:
    """Integer literals beyond +-(2**53 - 1) are refused; the bounds are accepted."""
    with pytest.raises(CanonicalJSONError, match="2\\*\\*53"):
        loads_strict(text)
    assert loads_strict("[9007199254740991,-9007199254740991]") == [2**53 - 1, -(2**53 - 1)]


def test_loads_strict_rejects_overflowing_floats() -> None:
    """A number too large for a double is refused instead of becoming infinity."""
    with pytest.raises(CanonicalJSONError, match="overflows"):
        loads_strict("1e400")


@pytest.mark.parametrize(
    "data",
    [b"\xff", b"\xef\xbb\xbf{}", "\ufeff{}", b"{}x", b"", b"[1,]", b"{'a':1}", b'"\x01"'],
)
def test_loads_strict_rejects_malformed_input(data: str | bytes) -> None:
    """Bad UTF-8, a BOM, trailing data, trailing commas, single quotes, raw controls fail."""
    with pytest.raises(CanonicalJSONError):
        loads_strict(data)


def test_loads_strict_rejects_non_text() -> None:
    """Only str and bytes-like input is parsed."""
    with pytest.raises(CanonicalJSONError, match="cannot parse"):
        loads_strict(123)  # type: ignore[arg-type]


def test_errors_are_value_errors() -> None:
    """CanonicalJSONError keeps working for callers that catch ValueError."""
    with pytest.raises(ValueError):
        loads_strict("{")


@given(json_values)
def test_canonicalize_is_idempotent_through_loads_strict(value: object) -> None:
    """Parsing canonical bytes gives an equal value whose canonical bytes are the same."""
    once = canonicalize(value)
    parsed = loads_strict(once)
    assert parsed == value
    assert canonicalize(parsed) == once


@given(st.dictionaries(texts, json_values, max_size=8), st.randoms(use_true_random=False))
def test_key_order_does_not_matter(value: dict[str, object], rnd: object) -> None:
    """Dicts with the same items in any insertion order canonicalise identically."""
    items = list(value.items())
    rnd.shuffle(items)  # type: ignore[attr-defined]
    assert canonicalize(dict(items)) == canonicalize(value)

"""Tests for msm_mem._governance.audit.scan: the pattern of the canonical payload accepts the
payload of every event and nothing but canonical payloads, so full verification with the fast
path finds exactly what the full check of every row finds, first bad seq and reason included."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from msm_mem._governance.audit.chain import ChainBuilder
from msm_mem._governance.audit.event import GENESIS, canonical_payload, field_problem
from msm_mem._governance.audit.scan import scan
from msm_mem._governance.audit.verify import VerifyResult, row_problem, verify_chain
from tests.helpers import audit_fields, audit_rows, rehashed, verify_row_by_row
from tests.strategies import audit_event_fields, audit_payload_fields


@settings(max_examples=150, deadline=None)
@given(st.lists(audit_event_fields, min_size=1, max_size=6))
def test_fast_path_accepts_every_canonical_event(many: list[dict[str, Any]]) -> None:
    """Any event the builder writes (any text, controls and quotes included) passes the fast
    path alone, so a stored chain never needs the slow check."""
    builder = ChainBuilder()
    rows = [builder.next_row(**f) for f in many]
    assert scan(rows, 0, 1, GENESIS) == (len(rows), GENESIS, rows[-1][2], len(rows) + 1)
    assert verify_chain(rows) == verify_row_by_row(rows) == VerifyResult(True, len(rows), rows[-1][2], None, "")


#: escapes a canonical string may use or must not: the short ones, and \\uXXXX in both cases
_ESCAPES = st.sampled_from([b"\\b", b"\\f", b"\\n", b"\\r", b"\\t", b'\\"', b"\\\\", b"\\/"]) | st.builds(
    lambda n, upper: (f"\\u{n:04X}" if upper else f"\\u{n:04x}").encode(),
    st.integers(0, 0x1F) | st.integers(0, 0xFFFF),
    st.booleans(),
)

#: bytes that matter to JSON, the pattern and the time, and escapes
_NOISE = (
    st.binary(max_size=4)
    | st.text('"\\{}[],:0123456789.eE+-u/ab\x00\x1f\x7f\xe9\u2028', max_size=4).map(str.encode)
    | _ESCAPES
)


@settings(max_examples=400, deadline=None)
@given(st.lists(audit_event_fields, min_size=2, max_size=3), st.data())
def test_fast_path_accepts_nothing_the_full_check_refuses(many: list[dict[str, Any]], data: st.DataObject) -> None:
    """A payload rewritten anywhere (and rehashed) passes the fast path only if the full check
    accepts it, and verification finds exactly what the full check of every row finds."""
    builder = ChainBuilder()
    rows = [builder.next_row(**f) for f in many]
    index = data.draw(st.integers(0, len(rows) - 1))
    seq, payload, _ = rows[index]
    a = data.draw(st.integers(0, len(payload)))
    b = data.draw(st.integers(a, min(len(payload), a + 6)))
    rows[index] = rehashed(seq, payload[:a] + data.draw(_NOISE) + payload[b:])
    head = rows[index - 1][2] if index else GENESIS
    if scan(rows, index, seq, head)[0]:
        assert row_problem(rows[index], seq, head)[0] is None
    assert verify_chain(rows) == verify_row_by_row(rows)


@settings(max_examples=1000, deadline=None)
@given(audit_payload_fields, st.data())
def test_scan_accepts_exactly_the_canonical_payload(d: dict[str, Any], data: st.DataObject) -> None:
    """The pattern against the definition, both ways, over generated events: it accepts the
    canonical payload of any event (seqs of up to 15 digits; longer ones take the full check),
    and a payload rewritten anywhere and rehashed only when it is byte-equal to the canonical
    payload of what it parses to, with valid fields."""
    seq, prev = d["seq"], d["prev_hash"]
    payload = canonical_payload(d)
    row = rehashed(seq, payload)
    assert scan([row], 0, seq, prev) == ((1, prev, row[2], seq + 1) if seq < 10**15 else (0, "", prev, seq))
    if data.draw(st.booleans()):  # an escape where a string's text begins
        a = b = data.draw(st.sampled_from([m.end() for m in re.finditer(rb'(?<=[:\[,])"', payload)]))
        noise = data.draw(_ESCAPES)
    else:  # any bytes anywhere
        a = data.draw(st.integers(0, len(payload)))
        b = data.draw(st.integers(a, min(len(payload), a + 6)))
        noise = data.draw(_NOISE)
    edited = payload[:a] + noise + payload[b:]
    if scan([rehashed(seq, edited)], 0, seq, prev)[0]:
        parsed = json.loads(edited)
        assert field_problem(parsed) is None
        assert canonical_payload(parsed) == edited


@pytest.mark.parametrize(
    "time",
    [
        "0",
        "-0",
        "0.0",
        "1700000000",
        "1700000000.0",
        "1700000000.25",
        "1.5",
        "-1.5",
        "0.000001",
        "1e-7",
        "1e+21",
        "1E+21",
        "1e21",
        "100000000000000000000",
        "9007199254740991",
        "9007199254740992",
        "1.7976931348623157e+308",
        "1e+400",
        "5e-324",
        "0.1000000000000000055511151231257827",
        "01",
    ],
)
def test_every_form_of_the_time_gets_the_full_check_verdict(time: str) -> None:
    """Canonical times, other spellings of the same number, integers beyond 2**53 and
    numbers beyond a double: the verdict is the full check's, fast path or not."""
    seq, payload, _ = audit_rows(1)[0]
    first = rehashed(seq, payload[: payload.index(b'"time":') + 7] + time.encode() + b"}")
    rows = [first, ChainBuilder(1, first[2]).next_row(**audit_fields(1))]
    assert verify_chain(rows) == verify_row_by_row(rows)
    if scan(rows, 0, 1, GENESIS)[0]:
        assert verify_row_by_row(rows).ok


def test_a_seq_beyond_fifteen_digits_takes_the_full_check() -> None:
    """Seqs of 16 digits are outside the pattern: the full check verifies them, with the same result."""
    start = 10**15 - 2
    rows = audit_rows(4, start, "a" * 64)
    assert scan(rows, 0, start + 1, "a" * 64)[0] == 1  # seq 10**15 - 1 has fifteen digits
    expected = VerifyResult(True, 4, rows[-1][2], None, "")
    assert verify_chain(rows, start_seq=start + 1, start_prev="a" * 64) == expected

"""The fast path of full audit verification: each payload matched against the one canonical
form the chain allows (:func:`.event.canonical_payload`), instead of parsing it and serialising
it again.

A stored payload passes full verification (:func:`~.verify.verify_chain`) when it parses
as strict JSON with exactly the event's fields and types and equals its own canonical payload.
For this schema that is a regular language: the keys are fixed and sorted; a canonical string
(RFC 8785, the json module's encoder) holds any character but ``"``, ``\\`` and controls, and
only the escapes ``\\"``, ``\\\\``, ``\\b \\f \\n \\r \\t`` and ``\\u00xx`` (lowercase) for the
other controls, so decoding and encoding it again gives back the same bytes; ``seq`` is digits
without a leading zero. :data:`_PAYLOAD` is that language as one compiled pattern (atomic
runs, no backtracking), so a payload is checked in one C pass. What the pattern cannot say is
checked beside it: valid UTF-8 (strict decoding, which also refuses surrogates), the seq and
the link against the slot, and the time (:func:`_canonical_time`: the number ECMAScript would
print for it, finite, an integer within 2**53 - 1 if it has no fraction or exponent).

The pattern is a subset of what full verification accepts, never more: a row it does not
accept (a time in an unusual form, a seq of 16 digits, a tampered row) goes to the full check,
which accepts it or names the reason. So the verdicts, first bad seq and reasons are those of
the full check, only sooner. ``test_scan_accepts_exactly_the_canonical_payload``
(tests/test_audit_scan.py) proves both directions over generated events: the pattern accepts
the canonical payload of every event, and what it accepts is byte-equal to the canonical payload
of what it parses to. Reads no key: rows only (worker processes run :func:`scan_chunk`).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence

from .event import Row
from .jcs import MAX_SAFE_INTEGER, number_text

__all__ = ["scan", "scan_chunk"]

_CHAR = r'[^"\\\x00-\x1f]'  # a character a canonical string keeps as itself
_ESCAPE = r'\\(?:["\\bfnrt]|u00(?:0[0-7bef]|1[0-9a-f]))'  # the escapes it uses, and only those
_STR = f'"{_CHAR}*+(?:{_ESCAPE}{_CHAR}*+)*+"'
_NONEMPTY = f'"(?!"){_CHAR}*+(?:{_ESCAPE}{_CHAR}*+)*+"'
_NUMBER = r"-?(?:0|[1-9][0-9]{0,20})(?:\.[0-9]{1,30})?(?:e[+-][0-9]{1,3})?"

#: a canonical payload: groups prev_hash, seq (at most 15 digits: below 2**53) and time
_PAYLOAD = re.compile(
    f'{{"action":{_NONEMPTY},"actor":{_NONEMPTY},"consent_id":{_STR}'
    f',"outcome":"(?:success|denied|error)","patient":{_STR}'
    f',"prev_hash":"([0-9a-f]{{64}})","purpose":{_STR},"reason":{_STR}'
    f',"record_ids":\\[(?:{_STR}(?:,{_STR})*+)?\\],"role":{_STR},"seq":([1-9][0-9]{{0,14}})'
    f',"source_tier":{_STR},"target_tier":{_STR},"time":({_NUMBER})}}'
)


def _canonical_time(text: str) -> bool:
    """Whether ``text`` (a JSON number) is a time full verification accepts, in canonical form."""
    value = float(text)
    if not math.isfinite(value):
        return False
    if "." not in text and "e" not in text and abs(value) > MAX_SAFE_INTEGER:
        return False  # read back as an integer: only within the range every reader keeps exact
    return number_text(value) == text


def scan(rows: Sequence[Row], at: int, seq: int, prev: str | None, step: int = 1) -> tuple[int, str, str, int]:
    """Walk ``rows[at:]`` from slot ``seq`` while each row passes the fast path of every check
    of full verification: seq column, hash, canonical payload, payload seq and link. With
    ``step`` 1 each slot expects exactly the next seq; with a larger one (a chain of a store of
    several, :mod:`.verify`) any seq of its residue at or above it, the next slot ``step`` above.

    ``prev`` is the hash the first row must link to; None takes the first row's own link as
    given (a worker with a page from the middle: its caller checks that link). Returns ``(n,
    first_link, head, next)``: the number of rows accepted, the ``prev_hash`` of ``rows[at]``
    ("" if it was not accepted), the hash of the last row accepted (``prev``, or "", if none)
    and the seq the next slot expects. The row after them, if any, is one the full check must
    look at.
    """
    sha256 = hashlib.sha256
    match = _PAYLOAD.fullmatch
    canonical_time = _canonical_time
    head = prev
    first = ""
    i = at
    end = len(rows)
    while i < end:
        column, payload, stored = rows[i]
        if type(column) is not int or type(payload) is not bytes:
            break
        if column != seq and (step == 1 or column < seq or (column - seq) % step):
            break
        digest = sha256(payload).hexdigest()
        if digest != stored:
            break
        try:
            found = match(payload.decode("utf-8"))
        except UnicodeDecodeError:
            break
        if found is None:
            break
        link, number, when = found.groups()
        if (head is not None and link != head) or number != str(column) or not canonical_time(when):
            break
        if i == at:
            first = link
        head = digest
        seq = column + step
        i += 1
    return i - at, first, head if head is not None else "", seq


def scan_chunk(start_seq: int, rows: Sequence[Row], step: int = 1) -> tuple[int, str, str, int]:
    """A worker's task: :func:`scan` of a whole chunk of rows from slot ``start_seq``, its first
    link taken as given (the parent checks it against the chunk before)."""
    return scan(rows, 0, start_seq, None, step)

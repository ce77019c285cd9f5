"""An audit event and its stored bytes: the payload of one row of the hash chain.

:class:`AuditSpec` is an event as the governance layer records it (who, what, when, under which
consent); :class:`AuditEvent` is the same event once chained (``seq``, ``prev_hash``,
``event_hash``). :func:`canonical_payload` defines the payload: the RFC 8785 canonical JSON of
the event without ``event_hash``, with exactly :data:`PAYLOAD_FIELDS`. Its bytes are what the
chain hashes, so they never change (existing stores must still verify).

Two faster paths stand in for the definition where it is hot, each proven byte-equal to it by a
property test over generated events: :func:`payload_bytes` writes the payload (every append),
and the pattern of :mod:`.scan` recognises it (full verification). :mod:`.chain` builds chains
of events; :mod:`.verify` walks them.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..._errors import AuditChainBroken, CanonicalJSONError, InvalidInput
from .jcs import MAX_SAFE_INTEGER, canonicalize, loads_strict, number_text

__all__ = [
    "GENESIS",
    "HEX64",
    "OUTCOMES",
    "PAYLOAD_FIELDS",
    "AuditEvent",
    "AuditSpec",
    "Row",
    "canonical_payload",
    "content_problem",
    "field_problem",
    "payload_bytes",
    "strict_reason",
]

GENESIS = "0" * 64
"""The ``prev_hash`` of the first event."""

OUTCOMES = frozenset({"success", "denied", "error"})
"""Allowed values of ``AuditEvent.outcome``."""

PAYLOAD_FIELDS = tuple(
    "action actor consent_id outcome patient prev_hash purpose reason record_ids role seq"
    " source_tier target_tier time".split()
)
"""The keys of a stored payload, in canonical (sorted) order; ``event_hash`` is not one."""

_PAYLOAD_KEYS = frozenset(PAYLOAD_FIELDS)
_EVENT_KEYS = _PAYLOAD_KEYS | {"event_hash"}
_STR_FIELDS = tuple("actor role action source_tier target_tier patient consent_id purpose reason".split())
_NONEMPTY = ("actor", "action")
HEX64 = re.compile(r"[0-9a-f]{64}")
_encode_str = json.encoder.encode_basestring  # RFC 8785 string escaping (see jcs.py)

Row = tuple[int, bytes, str]
"""One stored event: ``(seq, payload, event_hash)``; ``payload`` may also be a memoryview."""


def field_problem(d: dict[str, Any], keys: frozenset[str] = _PAYLOAD_KEYS) -> str | None:
    """Why ``d`` is not a valid event mapping with exactly ``keys``, or None if it is."""
    if type(d) is not dict:
        return "payload is not a JSON object"
    if d.keys() != keys:
        missing = sorted(keys - d.keys())
        unknown = sorted(d.keys() - keys)
        return f"fields missing {missing} unknown {unknown}"
    seq = d["seq"]
    if type(seq) is not int or not 1 <= seq <= MAX_SAFE_INTEGER:
        return f"seq {seq!r} is not an integer >= 1"
    for name in ("prev_hash", "event_hash") if "event_hash" in keys else ("prev_hash",):
        value = d[name]
        if not isinstance(value, str) or HEX64.fullmatch(value) is None:
            return f"{name} is not 64 lowercase hex digits"
    return content_problem(d)


def content_problem(d: dict[str, Any]) -> str | None:
    """The part of :func:`field_problem` about what a caller supplies (time, strings, outcome,
    record ids); keys, seq and prev_hash of an event a :class:`ChainBuilder` assembles are its own."""
    when = d["time"]
    if not (
        (type(when) is float and math.isfinite(when))
        or (type(when) is int and -MAX_SAFE_INTEGER <= when <= MAX_SAFE_INTEGER)
    ):
        return f"time {when!r} is not a finite number of seconds"
    if type(when) is float and MAX_SAFE_INTEGER < abs(when) < 1e21:
        # canonical JSON writes it as an integer literal (no fraction, no exponent) beyond
        # 2**53 - 1, which the chain's reader refuses: an event it could never verify
        return f"time {when!r} is written as an integer beyond 2**53 - 1"
    for name in _STR_FIELDS:
        if not isinstance(d[name], str):
            return f"{name} is not a string"
    for name in _NONEMPTY:
        if not d[name]:
            return f"{name} is empty"
    if not isinstance(d["outcome"], str) or d["outcome"] not in OUTCOMES:
        return f"outcome {d['outcome']!r} is not one of {sorted(OUTCOMES)}"
    ids = d["record_ids"]
    if not isinstance(ids, list | tuple) or not all(isinstance(i, str) for i in ids):
        return "record_ids is not an array of strings"
    return None


def canonical_payload(fields: Mapping[str, Any]) -> bytes:
    """The stored payload of an event, by definition: the RFC 8785 canonical JSON
    (:func:`.jcs.canonicalize`) of its :data:`PAYLOAD_FIELDS`, ``event_hash`` and any other key
    left out.

    The one definition of the hashed bytes: :func:`payload_bytes` and the pattern of :mod:`.scan`
    are faster paths to the same bytes, proven equal to this by the property tests
    ``test_payload_bytes_is_the_canonical_payload`` (tests/test_audit_event.py) and
    ``test_scan_accepts_exactly_the_canonical_payload`` (tests/test_audit_scan.py). Raises
    :class:`KeyError` for a missing field and :class:`CanonicalJSONError` for a value canonical
    JSON cannot hold (a lone surrogate, a NaN).
    """
    return canonicalize({name: fields[name] for name in PAYLOAD_FIELDS})


def payload_bytes(d: dict[str, Any]) -> bytes:
    """:func:`canonical_payload` of ``d``, written out by hand (about 3x faster), for a ``d``
    whose fields passed :func:`content_problem` and whose ``seq`` and ``prev_hash`` are valid.

    The keys are fixed and ASCII, so their canonical order is :data:`PAYLOAD_FIELDS`; the string
    escaping is the json module's, which is RFC 8785's (see :mod:`.jcs`).
    Raises :class:`CanonicalJSONError` if a string holds a lone surrogate.
    """
    e = _encode_str
    ids = ",".join(map(e, d["record_ids"]))
    text = (
        f'{{"action":{e(d["action"])},"actor":{e(d["actor"])},"consent_id":{e(d["consent_id"])}'
        f',"outcome":{e(d["outcome"])},"patient":{e(d["patient"])}'
        f',"prev_hash":"{d["prev_hash"]}","purpose":{e(d["purpose"])},"reason":{e(d["reason"])}'
        f',"record_ids":[{ids}],"role":{e(d["role"])},"seq":{d["seq"]:d}'
        f',"source_tier":{e(d["source_tier"])},"target_tier":{e(d["target_tier"])}'
        f',"time":{number_text(float(d["time"]))}}}'
    )
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise CanonicalJSONError(f"a string holds a lone surrogate at {exc.start}") from None


def strict_reason(payload: bytes) -> str:
    """The most precise reason a non-canonical ``payload`` fails (only on the failure path)."""
    try:
        loads_strict(payload)
    except CanonicalJSONError as exc:
        return f"payload is not strict JSON: {exc}"
    return "payload is not in canonical form"


@dataclass(frozen=True, slots=True)
class AuditSpec:
    """An audit event before it is chained: what happened, fixed when it happened.

    ``time`` is UTC seconds; ``role`` and ``purpose`` may be the :class:`~msm_mem._principal.Role`
    and :class:`~msm_mem._principal.Purpose` enums or their string values (the stored bytes are
    the same); ``patient`` is the patient's pseudonym, never an identifier. ``seq``,
    ``prev_hash`` and ``event_hash`` come when :class:`~.chain.ChainBuilder`
    chains it; the fields are checked then (:class:`InvalidInput` for a bad one).
    """

    time: float
    actor: str
    role: str
    action: str
    source_tier: str
    target_tier: str
    purpose: str
    outcome: str = "success"
    record_ids: tuple[str, ...] = ()
    patient: str = ""
    consent_id: str = ""
    reason: str = ""
    #: the patient's id, never chained or stored: it picks the lane whose chain the event joins
    #: in a store of several lanes (:mod:`msm_mem._storage.lanes`)
    lane_key: str = field(default="", repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class AuditEvent:
    """One audit event. Ids and pseudonyms only, never narrative text.

    ``seq`` starts at 1; ``prev_hash`` and ``event_hash`` are 64 lowercase hex digits;
    ``time`` is UTC seconds; ``outcome`` is one of :data:`OUTCOMES`; ``reason`` is a short code
    (may be empty); ``patient`` and ``consent_id`` are empty when not applicable. Construction
    checks types and formats (raising :class:`InvalidInput`) but not that ``event_hash`` is
    the hash of the payload: :meth:`from_json` and :meth:`from_row` check that.
    """

    seq: int
    prev_hash: str
    event_hash: str
    time: float
    actor: str
    role: str
    action: str
    source_tier: str
    target_tier: str
    record_ids: tuple[str, ...]
    patient: str
    consent_id: str
    purpose: str
    outcome: str
    reason: str

    def __post_init__(self) -> None:
        if isinstance(self.record_ids, list):
            object.__setattr__(self, "record_ids", tuple(self.record_ids))
        if type(self.time) is int:
            object.__setattr__(self, "time", float(self.time))
        problem = field_problem(self._as_dict(), _EVENT_KEYS)
        if problem is not None:
            raise InvalidInput(f"invalid audit event: {problem}")

    def _as_dict(self, *, with_hash: bool = True) -> dict[str, Any]:
        d: dict[str, Any] = {name: getattr(self, name) for name in PAYLOAD_FIELDS}
        if with_hash:
            d["event_hash"] = self.event_hash
        return d

    def payload(self) -> bytes:
        """Canonical JSON of the event without ``event_hash``: the stored, hashed bytes."""
        return payload_bytes(self._as_dict(with_hash=False))

    def row(self) -> Row:
        """The ``(seq, payload, event_hash)`` row to store."""
        return (self.seq, self.payload(), self.event_hash)

    def to_json(self) -> bytes:
        """Canonical JSON of the whole event, ``event_hash`` included (for export)."""
        return canonicalize(self._as_dict())

    @classmethod
    def from_json(cls, data: str | bytes) -> AuditEvent:
        """Parse :meth:`to_json` output strictly and check ``event_hash`` against the content.

        Raises :class:`CanonicalJSONError` for bad JSON, :class:`InvalidInput` for missing,
        unknown or mistyped fields, :class:`AuditChainBroken` when the hash does not match.
        """
        d = loads_strict(data)
        problem = field_problem(d, _EVENT_KEYS)
        if problem is not None:
            raise InvalidInput(f"invalid audit event: {problem}")
        event = cls(**d)
        if hashlib.sha256(event.payload()).hexdigest() != event.event_hash:
            raise AuditChainBroken("event_hash does not match the event", seq=event.seq)
        return event

    @classmethod
    def from_row(cls, seq: int, payload: bytes | memoryview, event_hash: str) -> AuditEvent:
        """Rebuild an event from its stored row, checking hash, seq column and canonical form.

        Raises :class:`AuditChainBroken` (with ``seq``) for any disagreement.
        """
        raw = bytes(payload)
        if hashlib.sha256(raw).hexdigest() != event_hash:
            raise AuditChainBroken("payload does not match its event_hash", seq=seq)
        try:
            d = loads_strict(raw)
        except CanonicalJSONError as exc:
            raise AuditChainBroken(f"payload is not strict JSON: {exc}", seq=seq) from None
        problem = field_problem(d)
        if problem is not None or d["seq"] != seq or payload_bytes(d) != raw:
            reason = problem or "payload seq or canonical form disagrees with the row"
            raise AuditChainBroken(reason, seq=seq)
        return cls(event_hash=event_hash, **d)

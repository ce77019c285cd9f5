"""Tests for msm_mem._governance.audit.event: the event records, the canonical payload defined
once (canonical_payload), and the hand-written encoder proven byte-equal to that definition."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from msm_mem._errors import AuditChainBroken, CanonicalJSONError, InvalidInput
from msm_mem._governance.audit.chain import ChainBuilder
from msm_mem._governance.audit.event import (
    GENESIS,
    PAYLOAD_FIELDS,
    AuditEvent,
    canonical_payload,
    content_problem,
    payload_bytes,
)
from msm_mem._governance.audit.jcs import MAX_SAFE_INTEGER, canonicalize
from tests.helpers import audit_fields
from tests.strategies import audit_event_fields, audit_payload_fields, audit_texts


def test_event_hash_is_sha256_of_the_canonical_payload() -> None:
    """event_hash = sha256(canonical_payload(event)), the RFC 8785 bytes of the event without
    event_hash, and the row stores exactly those bytes."""
    event = ChainBuilder().next(**audit_fields())
    d = json.loads(event.to_json())
    assert set(d) == set(PAYLOAD_FIELDS) | {"event_hash"}
    assert d.pop("event_hash") == event.event_hash
    assert canonical_payload(d) == canonicalize(d) == event.payload()
    assert hashlib.sha256(canonical_payload(d)).hexdigest() == event.event_hash
    assert event.row() == (1, canonical_payload(d), event.event_hash)
    assert event.seq == 1 and event.prev_hash == GENESIS and event.record_ids == ("E-0000",)


def test_event_json_round_trip() -> None:
    """from_json(to_json()) gives the same event; an integral time stays a float."""
    event = ChainBuilder().next(**audit_fields(0, time=1_700_000_000.0, record_ids=()))
    assert b'"time":1700000000}' in event.to_json()
    again = AuditEvent.from_json(event.to_json())
    assert again == event and isinstance(again.time, float)
    assert AuditEvent.from_row(*event.row()) == event


def test_from_json_rejects_bad_events() -> None:
    """Unknown, missing or mistyped fields, duplicate keys and a wrong hash are refused."""
    d = json.loads(ChainBuilder().next(**audit_fields()).to_json())
    for bad in (
        {**d, "extra": 1},
        {k: v for k, v in d.items() if k != "reason"},
        {**d, "seq": "1"},
    ):
        with pytest.raises(InvalidInput):
            AuditEvent.from_json(canonicalize(bad))
    with pytest.raises(CanonicalJSONError, match="duplicate"):
        AuditEvent.from_json(b'{"seq":1,"seq":1}')
    with pytest.raises(AuditChainBroken):
        AuditEvent.from_json(canonicalize({**d, "actor": "someone-else"}))


def test_from_row_rejects_tampering() -> None:
    """from_row raises AuditChainBroken naming the seq for a wrong hash or seq column."""
    seq, payload, digest = ChainBuilder().next(**audit_fields()).row()
    with pytest.raises(AuditChainBroken) as info:
        AuditEvent.from_row(seq, payload + b" ", digest)
    assert info.value.seq == 1
    with pytest.raises(AuditChainBroken):
        AuditEvent.from_row(2, payload, digest)


@settings(max_examples=1000)
@given(audit_payload_fields)
def test_payload_bytes_is_the_canonical_payload(d: dict[str, Any]) -> None:
    """payload_bytes, the hand-written encoder of every append, gives byte for byte the
    definition (canonical_payload: RFC 8785 of the payload fields) for any valid event: ids,
    any text (quotes, controls, U+2028, astral, empty), times of every magnitude and form,
    integral times, enum roles and purposes, any seq and link."""
    assert content_problem(d) is None
    assert payload_bytes(d) == canonical_payload(d)


@given(audit_payload_fields, st.dictionaries(audit_texts, audit_texts, max_size=3))
def test_the_canonical_payload_holds_the_payload_fields_only(d: dict[str, Any], extra: dict[str, str]) -> None:
    """event_hash and any other key beside the payload fields leave the payload unchanged."""
    others = {k: v for k, v in extra.items() if k not in PAYLOAD_FIELDS}
    assert canonical_payload({**others, **d, "event_hash": "f" * 64}) == canonical_payload(d)
    assert list(json.loads(canonical_payload(d))) == list(PAYLOAD_FIELDS)


@settings(max_examples=200)
@given(st.lists(audit_event_fields, min_size=1, max_size=4))
def test_every_event_reads_back_from_its_row_and_its_json(many: list[dict[str, Any]]) -> None:
    """What the builder writes is the canonical payload of the event, and reads back as the same
    event from its stored row and from its exported JSON."""
    builder = ChainBuilder()
    for f in many:
        seq, payload, digest = builder.next_row(**f)
        event = AuditEvent.from_row(seq, payload, digest)
        assert payload == canonical_payload(dataclasses.asdict(event)) == event.payload()
        assert AuditEvent.from_json(event.to_json()) == event


@pytest.mark.parametrize("time", [2.0**53, 1e16, 1e20, -1e17, 9.99e20])
def test_a_time_written_as_an_integer_beyond_2_53_is_refused(time: float) -> None:
    """A float time that canonical JSON writes as an integer literal beyond 2**53 - 1 is refused
    at write (InvalidInput, the head unmoved), since the chain's reader could not verify it."""
    builder = ChainBuilder()
    with pytest.raises(InvalidInput, match="beyond 2"):
        builder.next_row(**audit_fields(time=time))
    assert builder.head_seq == 0


@pytest.mark.parametrize("time", [float(MAX_SAFE_INTEGER), -float(MAX_SAFE_INTEGER), 1e21, -1e21, 1e300, 5e-324])
def test_times_at_the_edges_of_the_number_forms_verify(time: float) -> None:
    """The largest exact integer and the first exponent form are written and read back."""
    seq, payload, digest = ChainBuilder().next_row(**audit_fields(time=time))
    assert AuditEvent.from_row(seq, payload, digest).time == time

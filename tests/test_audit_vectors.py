"""Fixed vectors of the audit chain: the stored bytes of an event never change, so existing
stores must still verify (known events chain to known payload bytes and sha256 hashes)."""

from __future__ import annotations

from typing import Any

import pytest

from msm_mem._governance.audit.chain import ChainBuilder
from msm_mem._governance.audit.event import GENESIS, AuditSpec
from msm_mem._governance.audit.verify import verify_chain
from msm_mem._principal import Purpose, Role

#: two events chained from GENESIS, with their payloads and hashes as stores hold them
VECTORS: list[tuple[dict[str, Any], bytes, str]] = [
    (
        {
            "time": 1700000000.25,
            "actor": "dr-lee",
            "role": "clinician",
            "action": "read",
            "source_tier": "ltm",
            "target_tier": "stm",
            "purpose": "treatment",
            "outcome": "success",
            "record_ids": ("ep-1", "vi-2"),
            "patient": "pt-00112233445566778899aabb",
            "consent_id": "c-7",
            "reason": "",
        },
        b'{"action":"read","actor":"dr-lee","consent_id":"c-7","outcome":"success",'
        b'"patient":"pt-00112233445566778899aabb","prev_hash":"' + GENESIS.encode() + b'","purpose":"treatment",'
        b'"reason":"","record_ids":["ep-1","vi-2"],"role":"clinician","seq":1,"source_tier":"ltm",'
        b'"target_tier":"stm","time":1700000000.25}',
        "d5aa483a1efc6ff2231bfd2d01f543fb0b67c80885de881bdfb5ffdc7f19e20f",
    ),
    (
        {
            "time": 1700000060,
            "actor": "admin-1",
            "role": "admin",
            "action": "purge_expired",
            "source_tier": "audit",
            "target_tier": "audit",
            "purpose": "operations",
            "outcome": "denied",
            "reason": 'retention \u00e9t\u00e9 "ok"',
        },
        b'{"action":"purge_expired","actor":"admin-1","consent_id":"","outcome":"denied","patient":"",'
        b'"prev_hash":"d5aa483a1efc6ff2231bfd2d01f543fb0b67c80885de881bdfb5ffdc7f19e20f","purpose":"operations",'
        b'"reason":"retention \xc3\xa9t\xc3\xa9 \\"ok\\"","record_ids":[],"role":"admin","seq":2,'
        b'"source_tier":"audit","target_tier":"audit","time":1700000060}',
        "12ddeb5fb14d1b45b24075a4bc8170e08e2cce380ebe3003b9cd2820a87cb450",
    ),
]


def test_fixed_vectors_pin_payload_bytes_and_hashes() -> None:
    """Known events chain to known payload bytes and sha256 hashes, and verify."""
    builder = ChainBuilder()
    rows = [builder.next_row(**fields) for fields, _, _ in VECTORS]
    assert rows == [(seq, payload, digest) for seq, (_, payload, digest) in enumerate(VECTORS, 1)]
    assert verify_chain(rows).ok and verify_chain(rows).head_hash == VECTORS[-1][2]


def test_a_spec_chains_to_the_pinned_bytes() -> None:
    """An AuditSpec chains to the pinned bytes, with role and purpose as enums or as strings."""
    first = {**VECTORS[0][0], "role": Role.CLINICIAN, "purpose": Purpose.TREATMENT}
    builder = ChainBuilder()
    rows = [builder.next_row_of(AuditSpec(**first)), builder.next_row_of(AuditSpec(**VECTORS[1][0]))]
    assert rows == [(seq, payload, digest) for seq, (_, payload, digest) in enumerate(VECTORS, 1)]


def test_a_spec_is_frozen() -> None:
    """An AuditSpec cannot be changed once made."""
    spec = AuditSpec(**VECTORS[1][0])
    with pytest.raises(AttributeError):
        spec.action = "read"  # type: ignore[misc]

"""Tests of the erasure receipt as bytes (``_governance/audit/erasure.py``): its JSON form, its
signature, and what :func:`check_receipt` says of a receipt against an audit row."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from msm_mem import ErasureReceipt, InvalidInput
from msm_mem._governance.audit.checkpoint_signer import CheckpointSigner
from msm_mem._governance.audit.erasure import DOMAIN, check_receipt, erased_ids
from msm_mem._governance.audit.jcs import canonicalize

KEY = Ed25519PrivateKey.generate()
SIGNER = CheckpointSigner(KEY)
COUNTS = (("episodic", 2), ("visual", 1), ("semantic", 0), ("stm", 1), ("keys", 1))
IDS = ["E-1", "E-2", "V-1", "T-1"]


def _event(seq: int = 7, **override: object) -> tuple[int, bytes, str]:
    fields = {
        "action": "retract",
        "purpose": "erasure",
        "patient": "pt-abc",
        "time": 1_700_000_000.5,
        "outcome": "success",
        "record_ids": IDS,
        "seq": seq,
        **override,
    }
    payload = canonicalize(fields)
    return seq, payload, hashlib.sha256(payload).hexdigest()


def _receipt(row: tuple[int, bytes, str]) -> ErasureReceipt:
    unsigned = ErasureReceipt("pt-abc", row[0], row[2], 1_700_000_000.5, COUNTS, 3)
    return replace(unsigned, signature=SIGNER.sign_bytes(DOMAIN, unsigned.message()))


def test_a_signed_receipt_holds_against_its_row() -> None:
    """A receipt signed over its fields holds against the row it names; its record ids cut
    into tables in its order; ``records`` leaves the key out."""
    row = _event()
    receipt = _receipt(row)
    assert check_receipt(receipt, KEY.public_key(), row) == ""
    assert receipt.records == 4 and receipt.count("keys") == 1 and receipt.count("claims") == 0
    assert erased_ids(receipt, IDS) == {"episodic": ["E-1", "E-2"], "visual": ["V-1"], "semantic": [], "stm": ["T-1"]}


def test_json_round_trips_and_refuses_other_shapes() -> None:
    """to_json / from_json give the same receipt; a missing field, a wrong type or bad JSON is
    InvalidInput."""
    receipt = _receipt(_event())
    assert ErasureReceipt.from_json(receipt.to_json()) == receipt
    data = receipt.to_dict()
    for bad in ({k: v for k, v in data.items() if k != "seq"}, {**data, "seq": "7"}, {**data, "counts": {"a": -1}}):
        with pytest.raises(InvalidInput):
            ErasureReceipt.from_dict(bad)
    with pytest.raises(InvalidInput):
        ErasureReceipt.from_json("{not json")


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda r, row: (replace(r, signature="zz"), row), "signature"),
        (lambda r, row: (replace(r, derived=4), row), "signature"),
        (lambda r, row: (r, None), "no event"),
        (lambda r, row: (r, (row[0], row[1] + b" ", row[2])), "not the one"),
        (lambda r, row: (r, _event(action="read")), "not the one"),
    ],
)
def test_what_does_not_hold_is_named(change: object, says: str) -> None:
    """A changed field, a forged signature, a missing or changed row: the check says which."""
    row = _event()
    receipt, against = change(_receipt(row), row)  # type: ignore[operator]
    assert says in check_receipt(receipt, KEY.public_key(), against)


def test_the_event_must_be_the_erasure_the_receipt_names() -> None:
    """An event of another action, pseudonym or number of records fails even when the receipt
    is signed over it."""
    for override in ({"action": "read"}, {"patient": "pt-other"}, {"record_ids": IDS[:3]}):
        row = _event(**override)
        assert check_receipt(_receipt(row), KEY.public_key(), row) != ""

"""The erasure receipt: a signed statement of what shredding one patient destroyed, and its check
against the audit chain.

A receipt names the erasure's audit event (``seq`` and ``event_hash``), the patient only by the
audit pseudonym (no longer linked to anyone), the rows destroyed per table, and how many
records of other patients derived from the patient's were retracted. It is signed with the
checkpoint key (Ed25519, domain ``msm-mem erasure receipt v1``) over the RFC 8785 canonical
JSON of every field but the signature.

:func:`check_receipt` is pure: given the receipt, the public key and the stored audit row at
its ``seq``, it says what does not hold: the signature; the row's hash; the event's action
(``retract``), purpose (``erasure``), patient (the pseudonym), time, and its record ids, one
per row destroyed, table after table in :data:`~msm_mem._storage.batch.ERASED_TABLES` order.
The caller checks the chain itself (:meth:`AuditLog.verify`) and that the episodic and visual
rows those ids name are empty rows now.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..._errors import InvalidInput
from .checkpoint import PublicKeyLike, ed25519_verify
from .event import HEX64
from .jcs import canonicalize, loads_strict

__all__ = ["DOMAIN", "ErasureReceipt", "check_receipt", "erased_ids"]

#: what a receipt's signature is made over, before a NUL and the canonical JSON
DOMAIN = b"msm-mem erasure receipt v1"


@dataclass(frozen=True, slots=True)
class ErasureReceipt:
    """What shredding one patient destroyed, signed (see the module).

    ``pseudonym`` is the patient's audit pseudonym (unlinked: nobody can tell whose it is);
    ``seq`` and ``event_hash`` the audit event of the erasure; ``time`` its time (UTC
    seconds); ``counts`` the rows destroyed per table, in the order of the event's record ids,
    then ``keys`` (the data key destroyed: 1, or 0 for a patient without one); ``derived`` the
    records of other patients derived from the patient's that were retracted (their own audit
    events precede this one); ``signature`` 128 hex digits."""

    pseudonym: str
    seq: int
    event_hash: str
    time: float
    counts: tuple[tuple[str, int], ...]
    derived: int
    signature: str = ""

    @property
    def records(self) -> int:
        """Rows destroyed in every table (the data key not counted)."""
        return sum(n for table, n in self.counts if table != "keys")

    def count(self, table: str) -> int:
        """Rows destroyed in ``table`` (0 for a table not named)."""
        return dict(self.counts).get(table, 0)

    def message(self) -> bytes:
        """The bytes the signature covers: the canonical JSON of every field but the signature."""
        return canonicalize({k: v for k, v in self.to_dict().items() if k != "signature"})

    def to_dict(self) -> dict[str, Any]:
        """The receipt as plain JSON values (``counts`` an object, tables in order)."""
        return {
            "pseudonym": self.pseudonym,
            "seq": self.seq,
            "event_hash": self.event_hash,
            "time": self.time,
            "counts": dict(self.counts),
            "derived": self.derived,
            "signature": self.signature,
        }

    def to_json(self) -> str:
        """The receipt as one line of JSON (what :meth:`from_json` reads)."""
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ErasureReceipt:
        """A receipt from :meth:`to_dict`'s form; InvalidInput for anything else."""
        keys = {"pseudonym", "seq", "event_hash", "time", "counts", "derived", "signature"}
        if not isinstance(data, Mapping) or set(data) != keys:
            raise InvalidInput(f"an erasure receipt has exactly the fields {sorted(keys)}")
        counts = data["counts"]
        ok = (
            isinstance(data["pseudonym"], str)
            and type(data["seq"]) is int
            and data["seq"] >= 1
            and isinstance(data["event_hash"], str)
            and HEX64.fullmatch(data["event_hash"]) is not None
            and type(data["time"]) in (int, float)
            and isinstance(counts, Mapping)
            and all(isinstance(k, str) and type(v) is int and v >= 0 for k, v in counts.items())
            and type(data["derived"]) is int
            and data["derived"] >= 0
            and isinstance(data["signature"], str)
        )
        if not ok:
            raise InvalidInput("an erasure receipt field has the wrong type")
        return cls(
            data["pseudonym"],
            data["seq"],
            data["event_hash"],
            float(data["time"]),
            tuple((str(k), int(v)) for k, v in counts.items()),
            data["derived"],
            data["signature"],
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> ErasureReceipt:
        """A receipt from :meth:`to_json`; InvalidInput for anything else."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise InvalidInput(f"an erasure receipt is JSON: {exc}") from exc
        return cls.from_dict(data)


def erased_ids(receipt: ErasureReceipt, record_ids: list[str]) -> dict[str, list[str]]:
    """The event's ``record_ids`` cut into the tables of ``receipt.counts`` (in their order)."""
    out: dict[str, list[str]] = {}
    at = 0
    for table, n in receipt.counts:
        if table == "keys":
            continue
        out[table] = record_ids[at : at + n]
        at += n
    return out


def check_receipt(receipt: ErasureReceipt, public_key: PublicKeyLike, row: tuple[int, bytes, str] | None) -> str:
    """Why ``receipt`` does not hold against its audit ``row`` (``(seq, payload, event_hash)``,
    None when the chain has no such event) and the checkpoint ``public_key``; "" when it holds."""
    try:
        signature = bytes.fromhex(receipt.signature)
    except ValueError:
        signature = b""
    if not ed25519_verify(public_key, DOMAIN + b"\x00" + receipt.message(), signature):
        return "the receipt's signature does not verify under the checkpoint key"
    if row is None or row[0] != receipt.seq:
        return f"the audit chain holds no event seq {receipt.seq}"
    seq, payload, event_hash = row
    if event_hash != receipt.event_hash or hashlib.sha256(bytes(payload)).hexdigest() != event_hash:
        return f"audit event seq {seq} is not the one the receipt names"
    event = loads_strict(bytes(payload))
    if not isinstance(event, dict):
        return f"audit event seq {seq} is not an object"
    expected = {
        "action": "retract",
        "purpose": "erasure",
        "patient": receipt.pseudonym,
        "time": receipt.time,
        "outcome": "success",
    }
    for name, value in expected.items():
        if event.get(name) != value:
            return f"audit event seq {seq}: {name} is {event.get(name)!r}, the receipt says {value!r}"
    ids = event.get("record_ids")
    if not isinstance(ids, list) or len(ids) != receipt.records:
        return f"audit event seq {seq} names {len(ids) if isinstance(ids, list) else 0} records, not {receipt.records}"
    return ""

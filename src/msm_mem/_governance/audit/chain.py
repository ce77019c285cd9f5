"""The hash chain of the audit tier: one event per read, write, transition or consent decision.

Stored row format (one row per event; the store keeps exactly these three columns)::

    seq         INTEGER  primary key, 1, 2, 3, ... with no gaps
    payload     BYTES    the event's canonical payload (:func:`.event.canonical_payload`)
    event_hash  TEXT     sha256(payload) as 64 lowercase hex digits

The payload holds ``seq`` and ``prev_hash`` (the ``event_hash`` of event ``seq - 1``, or
:data:`~.event.GENESIS` for the first event), so each event commits to the whole history
before it. Rows are read back ``ORDER BY seq``. :class:`ChainBuilder` makes the rows;
:mod:`.verify` walks them. A store of ``n`` chains (:mod:`.lanes`) numbers chain ``c`` with
seqs of the residue ``c`` modulo ``n``: each write's first event takes the first such seq
above every seq stored (``after``), so seqs follow the order of writing across the chains,
and the events of one write follow one another ``n`` apart. The first event of every chain
links to :data:`~.event.GENESIS`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from ..._errors import InvalidInput
from .event import GENESIS, HEX64, AuditEvent, AuditSpec, Row, content_problem, payload_bytes

__all__ = ["ChainBuilder"]


class ChainBuilder:
    """Builds consecutive events from a known head (``head_seq``, ``head_hash``), ``step``
    seqs apart (1 for a store of one chain).

    A new, empty chain starts at ``(0, GENESIS)`` (chain ``c`` of several: ``(c, GENESIS)``);
    to continue a stored chain pass its last seq and event_hash (and, in a store of several,
    ``after``: the highest seq stored in any chain). :meth:`next` advances the head as soon as
    it returns: if storing the event fails, rebuild the builder from the stored head.
    """

    def __init__(self, head_seq: int = 0, head_hash: str = GENESIS, step: int = 1, after: int = 0) -> None:
        if type(head_seq) is not int or head_seq < 0:
            raise InvalidInput(f"head_seq {head_seq!r} is not an integer >= 0")
        if type(step) is not int or step < 1:
            raise InvalidInput(f"step {step!r} is not an integer >= 1")
        if not isinstance(head_hash, str) or HEX64.fullmatch(head_hash) is None:
            raise InvalidInput("head_hash is not 64 lowercase hex digits")
        if head_seq < step and head_hash != GENESIS:
            raise InvalidInput("an empty chain's head_hash must be GENESIS")
        if type(after) is not int or after < 0:
            raise InvalidInput(f"after {after!r} is not an integer >= 0")
        if after > head_seq:  # the first event takes the first seq of its residue above ``after``
            head_seq = after - (after - head_seq) % step
        self._seq = head_seq
        self._hash = head_hash
        self._step = step

    @property
    def head_seq(self) -> int:
        """Seq of the last event built (0 for an empty chain)."""
        return self._seq

    @property
    def head_hash(self) -> str:
        """event_hash of the last event built (:data:`GENESIS` for an empty chain)."""
        return self._hash

    def next(self, **fields: Any) -> AuditEvent:
        """Build the event after the head and advance the head (fields as :meth:`next_row`).

        Raises :class:`InvalidInput` (or its subclass :class:`CanonicalJSONError`) for invalid
        fields; the head does not move then.
        """
        seq, payload, digest = self.next_row(**fields)
        return AuditEvent.from_row(seq, payload, digest)

    def next_row_of(self, spec: AuditSpec) -> Row:
        """:meth:`next_row` with the fields of ``spec``."""
        return self.next_row(
            time=spec.time,
            actor=spec.actor,
            role=spec.role,
            action=spec.action,
            source_tier=spec.source_tier,
            target_tier=spec.target_tier,
            purpose=spec.purpose,
            outcome=spec.outcome,
            record_ids=spec.record_ids,
            patient=spec.patient,
            consent_id=spec.consent_id,
            reason=spec.reason,
        )

    def next_row(
        self,
        *,
        time: float,
        actor: str,
        role: str,
        action: str,
        source_tier: str,
        target_tier: str,
        purpose: str,
        outcome: str,
        record_ids: Sequence[str] = (),
        patient: str = "",
        consent_id: str = "",
        reason: str = "",
    ) -> Row:
        """The stored row ``(seq, payload, event_hash)`` of the event after the head (``time``
        in UTC seconds), validated and canonicalised once; the head advances.

        Raises :class:`InvalidInput` (or its subclass :class:`CanonicalJSONError`) for invalid
        fields; the head does not move then.
        """
        d: dict[str, Any] = {
            "action": action,
            "actor": actor,
            "consent_id": consent_id,
            "outcome": outcome,
            "patient": patient,
            "prev_hash": self._hash,
            "purpose": purpose,
            "reason": reason,
            "record_ids": tuple(record_ids) if not isinstance(record_ids, str) else record_ids,
            "role": role,
            "seq": self._seq + self._step,
            "source_tier": source_tier,
            "target_tier": target_tier,
            "time": float(time) if type(time) is int else time,
        }
        problem = content_problem(d)
        if problem is not None:
            raise InvalidInput(f"invalid audit event: {problem}")
        payload = payload_bytes(d)
        digest = hashlib.sha256(payload).hexdigest()
        self._seq, self._hash = d["seq"], digest
        return d["seq"], payload, digest

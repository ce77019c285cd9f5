"""Reading the audit tier event by event: :meth:`MsmMem.audit_trail`.

The audit roles (auditor, admin) read the whole chain; a care role (agent, clinician, critic)
reads only the events of one patient it may read (consent-checked like any read of the
patient, the patient named by its pseudonym in the events). Events hold ids, pseudonyms and
closed vocabularies only, never narrative. The read is itself audited.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass

from .._errors import AuditChainBroken, InvalidInput
from .._governance.audit.checkpoint import Checkpoint, CheckpointLog
from .._governance.audit.event import AuditEvent
from .._principal import Principal, Role
from .access import Operation
from .base import _Base

__all__ = ["AuditTrail"]

#: the most events one call returns
MAX_EVENTS = 5000
#: the most recent signed checkpoints a trail carries
CHECKPOINTS = 20
_AUDIT_ROLES = frozenset({Role.AUDITOR, Role.ADMIN})
#: a pseudonym that canonical JSON writes as it is (no escapes)
_VERBATIM = re.compile(r"[A-Za-z0-9_.:-]+")


@dataclass(frozen=True, slots=True)
class AuditTrail:
    """A page of the audit tier.

    ``events`` are the events with ``seq > after_seq`` (of one patient, for a care role), at
    most ``limit``, ascending; ``next_after`` is the ``after_seq`` of the next page (None on
    the last); ``head_seq`` is the chain's last seq; ``unreadable_seq`` is the first stored
    event that does not parse or match its hash (the page stops there; in a patient's view the
    other patients' events are checked against their hash only), None when all read;
    ``checkpoints`` are the latest signed checkpoints, newest last.
    """

    events: tuple[AuditEvent, ...]
    head_seq: int
    next_after: int | None
    unreadable_seq: int | None
    checkpoints: tuple[Checkpoint, ...]


class _Trail(_Base):
    def audit_trail(
        self,
        principal: Principal,
        patient_id: str | None = None,
        *,
        after_seq: int = 0,
        limit: int = 1000,
        tail: bool = False,
    ) -> AuditTrail:
        """The audit events after ``after_seq`` (at most ``limit``, 1..5000: the first ones, or
        with ``tail`` the last ones) and the latest signed checkpoints. Auditor or admin: every
        event (``patient_id`` must be None: the audit tier names patients by pseudonym only).
        Agent, clinician or critic: the events of ``patient_id`` only, after a consent check
        for reading that patient. Audited."""
        p = self._allow(principal, Operation.AUDIT_READ, tier="audit")
        if type(after_seq) is not int or after_seq < 0:
            raise InvalidInput(f"after_seq must be an integer >= 0, got {after_seq!r}")
        if type(limit) is not int or not 1 <= limit <= MAX_EVENTS:
            raise InvalidInput(f"limit must be an integer in 1..{MAX_EVENTS}, got {limit!r}")
        pseudonym: str | None = None
        turn = None
        if p.role in _AUDIT_ROLES:
            if patient_id is not None:
                raise InvalidInput("the audit roles read the whole chain: patients appear by pseudonym only")
        else:
            if patient_id is None:
                raise InvalidInput(f"role {p.role.value!r} reads the audit events of one patient: name patient_id")
            turn = self._gm.begin(p, patient_id)
            pseudonym = self._audit.pseudonym(patient_id)
        self._store.sync()
        heads = self._store.audit_heads()
        head = max(seq for seq, _ in heads)
        if tail and pseudonym is None:
            # with several chains seqs have gaps: the last ``limit`` events span at most
            # ``limit`` seqs a chain (each write starts at the first seq of its residue above all)
            after_seq = max(after_seq, head - limit * len(heads))
        kept: deque[AuditEvent] | list[AuditEvent] = deque(maxlen=limit) if tail else []
        unreadable: int | None = None
        more = False
        # a patient's events name its pseudonym verbatim (canonical JSON of "pt-" and hex), so
        # an event whose bytes do not hold it is another patient's: the store checks its hash
        # and leaves it out (parsing every event of a long chain cost a care role's read most)
        rows = (
            self._store.iter_audit_naming(pseudonym.encode(), after_seq + 1)
            if pseudonym is not None and _VERBATIM.fullmatch(pseudonym)
            else self._store.iter_audit(after_seq + 1)
        )
        for row in rows:
            try:
                event = AuditEvent.from_row(row.seq, row.payload, row.event_hash)
            except AuditChainBroken:
                unreadable = row.seq
                break
            if pseudonym is not None and event.patient != pseudonym:
                continue
            if not tail and len(kept) == limit:
                more = True
                break
            kept.append(event)
        events = list(kept)
        checkpoints = tuple(CheckpointLog(self._audit.place.log).all()[-CHECKPOINTS:])
        span = f"audit events {events[0].seq}-{events[-1].seq}" if events else "no audit events"
        if turn is not None:
            self._gm._event(turn, "read", "audit", "source", [], reason=span)
            self._gm.commit(turn)
        else:
            self._event(p, "audit_read", "audit", "source", reason=span)
        return AuditTrail(tuple(events), head, events[-1].seq if more else None, unreadable, checkpoints)

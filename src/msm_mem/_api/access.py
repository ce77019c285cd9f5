"""Who may call which operation of :class:`MsmMem`: one table, checked before anything runs.

Patient-data operations are further checked per move by the transition table and per patient
by consent; this table adds what those cannot see: which roles may run governance operations
(consent, keys, audit, maintenance, import/export) and that the auditor reads the audit tier
only, never patient data. A refusal is :class:`AccessDenied` and is itself audited.
"""

from __future__ import annotations

from enum import StrEnum

from .._errors import AccessDenied, InvalidInput
from .._principal import Principal, Role

__all__ = ["OPERATIONS", "Operation", "require"]


class Operation(StrEnum):
    """Every operation of the governed API."""

    INIT = "init"
    INGEST = "ingest"
    ASK = "ask"
    RETRIEVE = "retrieve"
    OBSERVE = "observe"
    CONSOLIDATE = "consolidate"
    FEEDBACK = "feedback"
    READ = "read"
    CONSENT_GRANT = "consent_grant"
    CONSENT_REVOKE = "consent_revoke"
    CONSENT_LIST = "consent_list"
    KEY_ROTATE = "key_rotate"
    SHRED = "shred"
    AUDIT_VERIFY = "audit_verify"
    AUDIT_CHECKPOINT = "audit_checkpoint"
    AUDIT_EXPORT = "audit_export"
    AUDIT_READ = "audit_read"
    MAINTAIN = "maintain"
    EXPORT = "export"
    IMPORT = "import"
    BREAK_GLASS = "break_glass"
    STORE_UPGRADE = "store_upgrade"


_CARE = frozenset({Role.AGENT, Role.CLINICIAN})
_READERS = frozenset({Role.AGENT, Role.CLINICIAN, Role.CRITIC, Role.SYSTEM})
_AUDIT = frozenset({Role.AUDITOR, Role.ADMIN})

#: the roles allowed to call each operation
OPERATIONS: dict[Operation, frozenset[Role]] = {
    Operation.INIT: frozenset({Role.ADMIN}),
    Operation.INGEST: frozenset({Role.SYSTEM, Role.CLINICIAN}),
    Operation.ASK: _CARE,
    Operation.RETRIEVE: _READERS,
    Operation.OBSERVE: _CARE | {Role.SYSTEM},
    Operation.CONSOLIDATE: _CARE | {Role.SYSTEM},
    Operation.FEEDBACK: frozenset({Role.CRITIC, Role.CLINICIAN}),
    Operation.READ: _READERS,
    Operation.CONSENT_GRANT: frozenset({Role.ADMIN}),
    Operation.CONSENT_REVOKE: frozenset({Role.ADMIN}),
    Operation.CONSENT_LIST: frozenset({Role.ADMIN, Role.AUDITOR}),
    Operation.KEY_ROTATE: frozenset({Role.ADMIN}),
    Operation.SHRED: frozenset({Role.ADMIN}),
    Operation.AUDIT_VERIFY: _AUDIT,
    Operation.AUDIT_CHECKPOINT: _AUDIT | {Role.SYSTEM},
    Operation.AUDIT_EXPORT: _AUDIT,
    # a care role reads only the events of a patient it may read (see _api/trail.py)
    Operation.AUDIT_READ: _AUDIT | {Role.AGENT, Role.CLINICIAN, Role.CRITIC},
    Operation.MAINTAIN: frozenset({Role.SYSTEM}),
    Operation.EXPORT: frozenset({Role.CLINICIAN, Role.ADMIN}),
    Operation.IMPORT: frozenset({Role.ADMIN, Role.SYSTEM}),
    # an interface's record that an admin overrides its credential's patient scope
    Operation.BREAK_GLASS: frozenset({Role.ADMIN}),
    Operation.STORE_UPGRADE: frozenset({Role.ADMIN}),
}


def require(principal: object, op: Operation) -> Principal:
    """``principal`` when its role may call ``op``; InvalidInput for something that is not a
    :class:`Principal`, AccessDenied naming the roles that may (the caller audits it)."""
    if not isinstance(principal, Principal):
        raise InvalidInput(f"{op.value} needs a Principal (id, role, purpose), got {type(principal).__name__}")
    allowed = OPERATIONS[op]
    if principal.role not in allowed:
        names = ", ".join(sorted(r.value for r in allowed))
        raise AccessDenied(f"role {principal.role.value!r} may not {op.value}: only {names}")
    return principal

"""Who may call which operation of :class:`MsmMem`: one table, checked before anything runs.

Patient-data operations are further checked per move by the transition table and per patient
by consent; this table adds what those cannot see: which roles may run governance operations
(consent, keys, audit, maintenance, import/export) and that the auditor reads the audit tier
only, never patient data. A refusal is :class:`AccessDenied` and is itself audited.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from enum import StrEnum
from types import MappingProxyType

from .._errors import AccessDenied, InvalidInput
from .._principal import Principal, Role

__all__ = ["OPERATIONS", "Operation", "OperationTable", "require"]


class Operation(StrEnum):
    """Every operation of the governed API."""

    INIT = "init"
    INGEST = "ingest"
    ASK = "ask"
    RETRIEVE = "retrieve"
    CONTEXT = "context"
    RECORD_ANSWER = "record_answer"
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


class OperationTable(Mapping[Operation, frozenset[Role]]):
    """The roles allowed to call each operation: read-only (no item or attribute can be set),
    so an importer cannot widen a role."""

    __slots__ = ("_roles",)
    _roles: Mapping[Operation, frozenset[Role]]

    def __init__(self, roles: Mapping[Operation, frozenset[Role]]) -> None:
        object.__setattr__(self, "_roles", MappingProxyType(dict(roles)))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("the operation table is read-only")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("the operation table is read-only")

    def __getitem__(self, op: Operation) -> frozenset[Role]:
        return self._roles[op]

    def __iter__(self) -> Iterator[Operation]:
        return iter(self._roles)

    def __len__(self) -> int:
        return len(self._roles)

    def __repr__(self) -> str:
        return f"OperationTable({dict(self._roles)!r})"


#: the roles allowed to call each operation
OPERATIONS = OperationTable(
    {
        Operation.INIT: frozenset({Role.ADMIN}),
        Operation.INGEST: frozenset({Role.SYSTEM, Role.CLINICIAN}),
        Operation.ASK: _CARE,
        Operation.RETRIEVE: _READERS,
        # the two halves of ask for an agent's own model: the same roles as ask
        Operation.CONTEXT: _CARE,
        Operation.RECORD_ANSWER: _CARE,
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
)


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

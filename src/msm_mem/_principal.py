"""Who is asking and why: the principal every governed call names (shared by every layer).

A :class:`Principal` is an id (never a patient identifier), a :class:`Role` from the transition
table and a :class:`Purpose` of use from a closed set. Anything else is refused with
:class:`InvalidInput` naming the allowed values: a typo such as ``"reserch"`` never passes.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

from ._errors import InvalidInput
from ._limits import ACTOR_ID_PATTERN

__all__ = ["Principal", "Purpose", "Role"]

#: ids are short printable tokens: no spaces, control characters, newlines or the ``*`` wildcard
_ID = ACTOR_ID_PATTERN


class Role(StrEnum):
    """The roles known to the transition table."""

    AGENT = "agent"
    CLINICIAN = "clinician"
    CRITIC = "critic"
    SYSTEM = "system"
    ADMIN = "admin"
    AUDITOR = "auditor"


class Purpose(StrEnum):
    """Purposes of use (mapped to HL7 v3 ActReason codes in the FHIR export)."""

    TREATMENT = "treatment"
    EMERGENCY = "emergency"
    RESEARCH = "research"
    OPERATIONS = "operations"
    EXPORT = "export"
    ERASURE = "erasure"
    AUDIT = "audit"
    PUBLIC_HEALTH = "public_health"


_E = TypeVar("_E", bound=StrEnum)


def _enum(kind: type[_E], value: object, what: str) -> _E:
    if isinstance(value, kind):
        return value
    if isinstance(value, str):
        try:
            return kind(value)
        except ValueError:
            pass
    allowed = ", ".join(m.value for m in kind)
    raise InvalidInput(f"unknown {what} {value!r}: use one of {allowed}")


def as_role(value: object) -> Role:
    """``value`` as a :class:`Role`; InvalidInput naming the roles otherwise."""
    return _enum(Role, value, "role")


def as_purpose(value: object) -> Purpose:
    """``value`` as a :class:`Purpose`; InvalidInput naming the purposes otherwise."""
    return _enum(Purpose, value, "purpose")


@dataclass(frozen=True, slots=True)
class Principal:
    """The acting principal of one call: ``id``, ``role`` and ``purpose`` (immutable).

    Strings are accepted for ``role`` and ``purpose`` and converted to the enums; an unknown
    value, an empty id or an id with spaces, control characters or ``*`` is InvalidInput.
    """

    id: str
    role: Role
    purpose: Purpose = Purpose.TREATMENT

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not _ID.match(self.id):
            raise InvalidInput(
                f"principal id {self.id!r} must be 1-128 characters of letters, digits and ._@:+- "
                "(starting with a letter or digit)"
            )
        object.__setattr__(self, "role", as_role(self.role))
        object.__setattr__(self, "purpose", as_purpose(self.purpose))

    def acting_for(self, purpose: Purpose | str) -> Principal:
        """The same id and role for another purpose."""
        return Principal(self.id, self.role, as_purpose(purpose))

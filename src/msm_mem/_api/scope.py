"""What an interface that authenticates its callers (the HTTP server) records through
:class:`~msm_mem.MsmMem`: a refusal it decided itself (a patient outside the patient scope of the
caller's credential), an administrator's break-glass override of that scope, and a failed login
(a credential that did not verify). They are audit events naming the principal (a failed login:
``unauthenticated``) and, for a failed login, no patient; none reads or writes patient data."""

from __future__ import annotations

from typing import NoReturn

from .._errors import AccessDenied, InvalidInput
from .._principal import Principal, Purpose, Role
from .access import Operation
from .base import _Base, stated_reason

__all__: list[str] = []

#: whom a failed login is recorded as: the request proved no principal
UNAUTHENTICATED = Principal("unauthenticated", Role.SYSTEM, Purpose.OPERATIONS)
#: what a failed login may say of itself: the kind of credential it presented
_CREDENTIALS = frozenset({"none", "api-key", "jwt", "other"})


def _operation(operation: Operation | str) -> Operation:
    try:
        return Operation(operation)
    except ValueError:
        raise InvalidInput(f"unknown operation {operation!r}") from None


class _Scope(_Base):
    def refuse(
        self,
        principal: Principal,
        operation: Operation | str,
        patient_id: str = "",
        *,
        reason: str = "patient_out_of_scope",
    ) -> NoReturn:
        """Audit, then raise as :class:`AccessDenied`, the refusal of ``operation`` for
        ``principal`` on ``patient_id`` ("" for none, "*" for every patient) that an interface
        decided (for example: the patient lies outside its credential's scope). Any principal
        may be refused; ``reason`` is a short code without identifiers. Always raises."""
        if not isinstance(principal, Principal):
            raise InvalidInput(f"refuse needs a Principal, got {type(principal).__name__}")
        op = _operation(operation)
        self._event(principal, op.value, "ltm", "ltm", outcome="denied", patient=patient_id, reason=reason)
        raise AccessDenied(f"{op.value} refused: {reason}")

    def break_glass(self, principal: Principal, operation: Operation | str, patient_id: str, reason: str) -> None:
        """Record that ``principal`` (an admin) overrides its credential's patient scope for
        ``operation`` on ``patient_id`` ("*": every patient), with a stated ``reason`` (a short
        phrase without identifiers). Audited as ``break_glass``; any other role is refused (and
        that refusal is audited). The operation itself is still checked when it is called."""
        p = self._allow(principal, Operation.BREAK_GLASS)
        op = _operation(operation)
        reason = stated_reason(reason, "break-glass")
        note = f"{op.value}: {' '.join(reason.split())}"[:120]
        self._event(p, "break_glass", "ltm", "ltm", patient=patient_id, reason=note)

    def refuse_login(self, credential: str) -> None:
        """Audit a request whose credential did not verify (a failed login): action
        ``authenticate``, outcome ``denied``, actor ``unauthenticated`` (role ``system``: the
        service records it), no patient; ``credential`` is the kind presented (``none``,
        ``api-key``, ``jwt`` or ``other``), never the token. Returns after the event is written."""
        if credential not in _CREDENTIALS:
            raise InvalidInput(f"unknown credential kind {credential!r}: use one of {', '.join(sorted(_CREDENTIALS))}")
        self._event(
            UNAUTHENTICATED, "authenticate", "ltm", "ltm", outcome="denied", reason=f"bad credential {credential}"
        )

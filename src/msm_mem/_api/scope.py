"""What an interface that authenticates its callers (the HTTP server) records through
:class:`~msm_mem.MsmMem`: a refusal it decided itself (a patient outside the patient scope of the
caller's credential) and an administrator's break-glass override of that scope. Both are audit
events naming the principal; neither reads nor writes patient data."""

from __future__ import annotations

from typing import NoReturn

from .._errors import AccessDenied, InvalidInput
from .._principal import Principal
from .access import Operation
from .base import _Base, stated_reason

__all__: list[str] = []


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

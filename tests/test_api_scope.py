"""MsmMem.refuse and MsmMem.break_glass: an interface's own refusals and an admin's override of a
credential's patient scope, both in the audit trail with the principal and no patient id."""

from __future__ import annotations

from pathlib import Path

import pytest

from msm_mem import AccessDenied, InvalidInput, MsmMem
from tests.helpers import ADMIN, AGENT, audit_events


def test_refuse_audits_the_denial_with_the_actor_and_a_pseudonym(tmp_path: Path) -> None:
    """refuse raises AccessDenied after one denied event naming the actor; the patient appears
    only as its pseudonym."""
    with MsmMem.init(tmp_path / "m", ADMIN) as mem:
        with pytest.raises(AccessDenied, match="patient_out_of_scope"):
            mem.refuse(AGENT, "read", "P7")
        event = audit_events(mem)[-1]
        assert (event.actor, event.action, event.outcome, event.reason) == (
            AGENT.id,
            "read",
            "denied",
            "patient_out_of_scope",
        )
        assert event.patient.startswith("pt-") and b"P7" not in event.payload()


def test_break_glass_is_the_admins_and_needs_a_reason(tmp_path: Path) -> None:
    """An admin's override is audited as break_glass with its reason; an agent's is refused
    and audited; an empty reason or an unknown operation is InvalidInput."""
    with MsmMem.init(tmp_path / "m", ADMIN) as mem:
        mem.break_glass(ADMIN, "shred", "P1", "erasure request on call")
        event = audit_events(mem)[-1]
        assert (event.action, event.outcome, event.reason) == (
            "break_glass",
            "success",
            "shred: erasure request on call",
        )
        with pytest.raises(AccessDenied):
            mem.break_glass(AGENT, "read", "P1", "curious")
        assert audit_events(mem)[-1].outcome == "denied"
        with pytest.raises(InvalidInput):
            mem.break_glass(ADMIN, "read", "P1", "  ")
        with pytest.raises(InvalidInput):
            mem.break_glass(ADMIN, "peek", "P1", "why not")
        assert mem.verify_audit(ADMIN).ok

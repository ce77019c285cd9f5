"""Tests of the transition table (msm_mem._governance.transitions): legal flows, roles, fail closed."""

from __future__ import annotations

import itertools

import pytest

from msm_mem._errors import AccessDenied, IllegalTransition
from msm_mem._governance import transitions
from msm_mem._governance.transitions import ROLES, TRANSITIONS, Flow, check, find
from msm_mem._records import State
from msm_mem._tier_records import StmState

#: every tier:state the memory knows ("-" for tiers without states)
TIER_STATES = ["source:-", "audit:-"] + [f"stm:{s.value}" for s in StmState] + [f"ltm:{s.value}" for s in State]
TRIGGERS = sorted({f.trigger for f in TRANSITIONS} | {"rewrite", "patch", "update", "replay", "copy"})
#: every role of the table, plus one the table does not know
ALL_ROLES = sorted(ROLES | {"intruder"})
LEGAL = {(f.source, f.target, f.trigger) for f in TRANSITIONS}


def _legal_call(flow: Flow, role: str) -> Flow:
    return check(flow.source, flow.target, flow.trigger, role, reason="audited reason" if flow.needs_reason else "")


def test_table_has_no_duplicate_keys() -> None:
    """Each (source, target, trigger) appears once, so find() is unambiguous."""
    assert len(LEGAL) == len(TRANSITIONS)


def test_every_flow_uses_known_tier_states_and_roles() -> None:
    """Sources and targets are tier:state values of the model; roles are from ROLES."""
    for f in TRANSITIONS:
        assert f.source in TIER_STATES, f
        assert f.target in TIER_STATES, f
        assert f.roles and f.roles <= ROLES, f


def test_illegal_transition_is_access_denied() -> None:
    """A refused move is also an AccessDenied and a PermissionError for generic callers."""
    with pytest.raises(PermissionError):
        check("source:-", "ltm:active", "write", "admin")
    assert issubclass(IllegalTransition, AccessDenied)


def test_every_tuple_not_in_table_is_refused_for_every_role() -> None:
    """All (source, target, trigger) outside the table fail closed whatever the role or reason."""
    refused = 0
    for source, target, trigger in itertools.product(TIER_STATES, TIER_STATES, TRIGGERS):
        if (source, target, trigger) in LEGAL:
            continue
        assert find(source, target, trigger) is None
        for role in ALL_ROLES:
            with pytest.raises(IllegalTransition):
                check(source, target, trigger, role, reason="any reason at all")
            refused += 1
    assert refused == (len(TIER_STATES) ** 2 * len(TRIGGERS) - len(LEGAL)) * len(ALL_ROLES)


@pytest.mark.parametrize("trigger", TRIGGERS)
@pytest.mark.parametrize("target", ["ltm:active", "ltm:superseded", "ltm:anonymized", "audit:-"])
def test_illegal_source_to_ltm_or_audit_skipping_stm(target: str, trigger: str) -> None:
    """Illegal move 1: nothing goes from the source straight to LTM or the audit tier."""
    for role in ALL_ROLES:
        with pytest.raises(IllegalTransition):
            check("source:-", target, trigger, role, reason="r")


def test_source_lands_only_in_stm() -> None:
    """Every flow out of the source tier ends in short-term memory."""
    assert {f.target for f in TRANSITIONS if f.source == "source:-"} == {"stm:active"}


def test_illegal_stm_cross_scope_without_admin_or_reason() -> None:
    """Illegal move 2: STM -> STM across scope needs the admin role and a stated reason."""
    for role in sorted(ROLES - {"admin"}):
        with pytest.raises(IllegalTransition, match="may not"):
            check("stm:active", "stm:active", "cross_scope_copy", role, reason="consult")
    for blank in ("", "   ", "\n\t"):
        with pytest.raises(IllegalTransition, match="reason"):
            check("stm:active", "stm:active", "cross_scope_copy", "admin", reason=blank)
    flow = check("stm:active", "stm:active", "cross_scope_copy", "admin", reason="tumour board consult")
    assert flow.needs_reason


@pytest.mark.parametrize("trigger", [t for t in TRIGGERS if t != "read"])
def test_illegal_ltm_active_in_place_rewrite(trigger: str) -> None:
    """Illegal move 3: no ltm:active -> ltm:active flow except a read, for any role."""
    for role in ALL_ROLES:
        with pytest.raises(IllegalTransition):
            check("ltm:active", "ltm:active", trigger, role, reason="r")


def test_corrections_are_supersessions() -> None:
    """The only ways out of ltm:active are supersede, critic_reject, decay, retract (and read)."""
    out = {f.trigger for f in TRANSITIONS if f.source == "ltm:active" and f.target != "ltm:active"}
    assert out == {"supersede", "critic_reject", "decay", "retract"}
    assert all(f.target != "ltm:active" for f in TRANSITIONS if f.source.startswith("ltm:") and f.trigger != "read")


@pytest.mark.parametrize("target", [s for s in TIER_STATES if not s.startswith("audit")])
def test_illegal_anything_from_audit_to_writable_tiers(target: str) -> None:
    """Illegal move 4: the audit tier never writes into stm, ltm or the source, by any trigger."""
    for trigger, role in itertools.product(TRIGGERS, ALL_ROLES):
        with pytest.raises(IllegalTransition):
            check("audit:-", target, trigger, role, reason="replay")


def test_audit_tier_only_purges_itself() -> None:
    """The single flow out of the audit tier is the admin's purge past retention, with a reason."""
    flows = [f for f in TRANSITIONS if f.source.startswith("audit")]
    assert [(f.target, f.trigger, f.roles, f.needs_reason) for f in flows] == [
        ("audit:-", "purge_expired", frozenset({"admin"}), True)
    ]


@pytest.mark.parametrize("flow", TRANSITIONS, ids=lambda f: f"{f.source}>{f.target}:{f.trigger}")
def test_roles_of_each_legal_flow(flow: Flow) -> None:
    """A legal flow passes for exactly its roles and is refused, naming the role, for the others."""
    for role in ALL_ROLES:
        if role in flow.roles:
            assert _legal_call(flow, role) is flow
        else:
            with pytest.raises(IllegalTransition, match=repr(role)):
                _legal_call(flow, role)


@pytest.mark.parametrize("flow", [f for f in TRANSITIONS if f.needs_reason], ids=lambda f: f.trigger)
def test_needs_reason_flows_refuse_blank_reason(flow: Flow) -> None:
    """A flow marked needs_reason is refused without a non-blank reason even for an allowed role."""
    role = sorted(flow.roles)[0]
    with pytest.raises(IllegalTransition, match="reason"):
        check(flow.source, flow.target, flow.trigger, role)
    with pytest.raises(IllegalTransition, match="reason"):
        check(flow.source, flow.target, flow.trigger, role, reason="  ")
    assert check(flow.source, flow.target, flow.trigger, role, reason="retention reached") is flow


def test_flows_without_needs_reason_ignore_the_reason() -> None:
    """Ordinary flows pass with or without a reason."""
    for flow in TRANSITIONS:
        if flow.needs_reason:
            continue
        role = sorted(flow.roles)[0]
        assert check(flow.source, flow.target, flow.trigger, role) is flow
        assert check(flow.source, flow.target, flow.trigger, role, reason="why") is flow


def test_role_specific_limits() -> None:
    """Expiry and decay are the system's, critic verdicts the critic's or clinician's, retraction the admin's."""
    assert find("stm:active", "stm:expired", "expire").roles == frozenset({"system"})  # type: ignore[union-attr]
    assert find("ltm:active", "ltm:anonymized", "decay").roles == frozenset({"system"})  # type: ignore[union-attr]
    assert find("ltm:active", "ltm:superseded", "critic_reject").roles == {"critic", "clinician"}  # type: ignore[union-attr]
    assert find("stm:active", "ltm:active", "critic_promote").roles == {"critic", "clinician"}  # type: ignore[union-attr]
    assert find("ltm:active", "ltm:retracted", "retract").roles == frozenset({"admin"})  # type: ignore[union-attr]
    assert "auditor" not in find("source:-", "stm:active", "write").roles  # type: ignore[union-attr]
    assert "auditor" in find("ltm:active", "ltm:active", "read").roles  # type: ignore[union-attr]


def test_terminal_states_have_no_way_out() -> None:
    """Retracted LTM and consolidated/expired/discarded STM items never move again."""
    terminal = ["ltm:retracted", "stm:consolidated", "stm:expired", "stm:discarded"]
    assert not [f for f in TRANSITIONS if f.source in terminal]


def test_module_exports() -> None:
    """The module's public names are the table, its lookup functions and the roles."""
    assert set(transitions.__all__) == {"ROLES", "TRANSITIONS", "Flow", "check", "find"}

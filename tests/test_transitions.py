"""Tests of the typed transition table (msm_mem._transitions): legal flows, roles, fail closed."""

from __future__ import annotations

import itertools
import re

import pytest

from msm_mem import _transitions as transitions
from msm_mem._errors import AccessDenied, IllegalTransition
from msm_mem._principal import Role
from msm_mem._records import State
from msm_mem._tier_records import StmState
from msm_mem._transitions import (
    AUDIT,
    LTM_ACTIVE,
    LTM_ANONYMIZED,
    LTM_RETRACTED,
    LTM_STATE_CHANGES,
    LTM_SUPERSEDED,
    ROLES,
    SOURCE,
    STM_ACTIVE,
    STM_DISCARDED,
    STM_EXPIRED,
    STM_STATE_CHANGES,
    TRANSITIONS,
    Flow,
    Place,
    Tier,
    Trigger,
    check,
    find,
)

#: every tier:state place the memory knows (no state for the source and audit tiers)
PLACES = [SOURCE, AUDIT] + [Place(Tier.STM, s) for s in StmState] + [Place(Tier.LTM, s) for s in State]
TRIGGERS = list(Trigger)
#: every role of the table, plus one the table does not know
INTRUDER = "intruder"
ALL_ROLES: list[Role | str] = [*sorted(ROLES), INTRUDER]
LEGAL = {(f.source, f.target, f.trigger) for f in TRANSITIONS}


def _legal_call(flow: Flow, role: Role | str) -> Flow:
    return check(flow.source, flow.target, flow.trigger, role, reason="audited reason" if flow.needs_reason else "")  # type: ignore[arg-type]


def _role_pattern(role: Role | str) -> str:
    return re.escape(repr(role))


def test_table_has_twenty_flows() -> None:
    """The table holds exactly the twenty flows of the model."""
    assert len(TRANSITIONS) == 20


def test_table_has_no_duplicate_keys() -> None:
    """Each (source, target, trigger) appears once, so find() is unambiguous."""
    assert len(LEGAL) == len(TRANSITIONS)


def test_every_flow_uses_known_places_triggers_and_roles() -> None:
    """Sources and targets are places of the model, triggers are Triggers, roles come from ROLES."""
    for f in TRANSITIONS:
        assert f.source in PLACES, f
        assert f.target in PLACES, f
        assert isinstance(f.trigger, Trigger), f
        assert f.roles and f.roles <= ROLES, f
        assert all(isinstance(r, Role) for r in f.roles), f


def test_roles_are_the_role_enum() -> None:
    """ROLES is a frozenset of every Role."""
    assert isinstance(ROLES, frozenset)
    assert ROLES == frozenset(Role)


@pytest.mark.parametrize(
    ("tier", "state"),
    [
        (Tier.SOURCE, State.ACTIVE),
        (Tier.AUDIT, StmState.ACTIVE),
        (Tier.STM, None),
        (Tier.LTM, None),
        (Tier.STM, State.SUPERSEDED),
        (Tier.LTM, StmState.EXPIRED),
    ],
)
def test_a_place_needs_a_state_of_its_own_tier(tier: Tier, state: State | StmState | None) -> None:
    """A Place pairs a tier with a state of that tier; any other pairing is refused."""
    with pytest.raises(ValueError, match="no state"):
        Place(tier, state)


def test_places_print_as_tier_and_state() -> None:
    """A place reads as ``tier:state`` (``-`` for the stateless tiers)."""
    assert [str(p) for p in (SOURCE, AUDIT, STM_ACTIVE, LTM_ANONYMIZED)] == [
        "source:-",
        "audit:-",
        "stm:active",
        "ltm:anonymized",
    ]


def test_illegal_transition_is_access_denied() -> None:
    """A refused move is also an AccessDenied and a PermissionError for generic callers."""
    with pytest.raises(PermissionError):
        check(SOURCE, LTM_ACTIVE, Trigger.WRITE, Role.ADMIN)
    assert issubclass(IllegalTransition, AccessDenied)


def test_refusal_names_the_move() -> None:
    """The refusal of a move outside the table names both places and the trigger."""
    with pytest.raises(IllegalTransition, match=re.escape("no legal transition source:- -> ltm:active by 'write'")):
        check(SOURCE, LTM_ACTIVE, Trigger.WRITE, Role.ADMIN)


def test_every_tuple_not_in_table_is_refused_for_every_role() -> None:
    """All (source, target, trigger) outside the table fail closed whatever the role or reason."""
    refused = 0
    for source, target, trigger in itertools.product(PLACES, PLACES, TRIGGERS):
        if (source, target, trigger) in LEGAL:
            continue
        assert find(source, target, trigger) is None
        for role in ALL_ROLES:
            with pytest.raises(IllegalTransition):
                check(source, target, trigger, role, reason="any reason at all")  # type: ignore[arg-type]
            refused += 1
    assert refused == (len(PLACES) ** 2 * len(TRIGGERS) - len(LEGAL)) * len(ALL_ROLES)


def test_an_unknown_role_is_refused_on_every_legal_flow() -> None:
    """A role the table does not know passes no flow, even with a reason."""
    for flow in TRANSITIONS:
        with pytest.raises(IllegalTransition, match=_role_pattern(INTRUDER)):
            check(flow.source, flow.target, flow.trigger, INTRUDER, reason="any reason")  # type: ignore[arg-type]


@pytest.mark.parametrize("trigger", TRIGGERS)
@pytest.mark.parametrize("target", [LTM_ACTIVE, LTM_SUPERSEDED, LTM_ANONYMIZED, AUDIT], ids=str)
def test_illegal_source_to_ltm_or_audit_skipping_stm(target: Place, trigger: Trigger) -> None:
    """Illegal move 1: nothing goes from the source straight to LTM or the audit tier."""
    for role in ALL_ROLES:
        with pytest.raises(IllegalTransition):
            check(SOURCE, target, trigger, role, reason="r")  # type: ignore[arg-type]


def test_source_lands_only_in_stm() -> None:
    """Every flow out of the source tier ends in short-term memory."""
    assert {f.target for f in TRANSITIONS if f.source == SOURCE} == {STM_ACTIVE}


def test_illegal_stm_cross_scope_without_admin_or_reason() -> None:
    """Illegal move 2: STM -> STM across scope needs the admin role and a stated reason."""
    for role in sorted(ROLES - {Role.ADMIN}):
        with pytest.raises(IllegalTransition, match="may not"):
            check(STM_ACTIVE, STM_ACTIVE, Trigger.CROSS_SCOPE_COPY, role, reason="consult")
    for blank in ("", "   ", "\n\t"):
        with pytest.raises(IllegalTransition, match="reason"):
            check(STM_ACTIVE, STM_ACTIVE, Trigger.CROSS_SCOPE_COPY, Role.ADMIN, reason=blank)
    flow = check(STM_ACTIVE, STM_ACTIVE, Trigger.CROSS_SCOPE_COPY, Role.ADMIN, reason="tumour board consult")
    assert flow.needs_reason


@pytest.mark.parametrize("trigger", [t for t in TRIGGERS if t is not Trigger.READ])
def test_illegal_ltm_active_in_place_rewrite(trigger: Trigger) -> None:
    """Illegal move 3: no ltm:active -> ltm:active flow except a read, for any role."""
    for role in ALL_ROLES:
        with pytest.raises(IllegalTransition):
            check(LTM_ACTIVE, LTM_ACTIVE, trigger, role, reason="r")  # type: ignore[arg-type]


def test_corrections_are_supersessions() -> None:
    """The only ways out of ltm:active are supersede, critic_reject, decay, retract (and read)."""
    out = {f.trigger for f in TRANSITIONS if f.source == LTM_ACTIVE and f.target != LTM_ACTIVE}
    assert out == {Trigger.SUPERSEDE, Trigger.CRITIC_REJECT, Trigger.DECAY, Trigger.RETRACT}
    assert all(
        f.target != LTM_ACTIVE for f in TRANSITIONS if f.source.tier is Tier.LTM and f.trigger is not Trigger.READ
    )


def test_ltm_state_changes_exclude_in_place_rewrites() -> None:
    """The store's LTM state changes are the table's LTM moves; active -> active is not one."""
    assert (State.ACTIVE, State.ACTIVE) not in LTM_STATE_CHANGES
    assert all(old != new for old, new in LTM_STATE_CHANGES)
    assert LTM_STATE_CHANGES == {
        (State.ACTIVE, State.SUPERSEDED),
        (State.ACTIVE, State.ANONYMIZED),
        (State.ACTIVE, State.RETRACTED),
        (State.SUPERSEDED, State.RETRACTED),
    }


def test_stm_state_changes() -> None:
    """The store's STM state changes: refresh, consolidation out of STM, expiry and discard."""
    assert STM_STATE_CHANGES == {
        (StmState.ACTIVE, StmState.ACTIVE),
        (StmState.ACTIVE, StmState.CONSOLIDATED),
        (StmState.ACTIVE, StmState.EXPIRED),
        (StmState.ACTIVE, StmState.DISCARDED),
    }


@pytest.mark.parametrize("target", [p for p in PLACES if p.tier is not Tier.AUDIT], ids=str)
def test_illegal_anything_from_audit_to_writable_tiers(target: Place) -> None:
    """Illegal move 4: the audit tier never writes into stm, ltm or the source, by any trigger."""
    for trigger, role in itertools.product(TRIGGERS, ALL_ROLES):
        with pytest.raises(IllegalTransition):
            check(AUDIT, target, trigger, role, reason="replay")  # type: ignore[arg-type]


def test_audit_tier_only_purges_itself() -> None:
    """The single flow out of the audit tier is the admin's purge past retention, with a reason."""
    flows = [f for f in TRANSITIONS if f.source.tier is Tier.AUDIT]
    assert [(f.target, f.trigger, f.roles, f.needs_reason) for f in flows] == [
        (AUDIT, Trigger.PURGE_EXPIRED, frozenset({Role.ADMIN}), True)
    ]


@pytest.mark.parametrize("flow", TRANSITIONS, ids=lambda f: f"{f.source}>{f.target}:{f.trigger.value}")
def test_roles_of_each_legal_flow(flow: Flow) -> None:
    """A legal flow passes for exactly its roles and is refused, naming the role, for the others."""
    for role in ALL_ROLES:
        if role in flow.roles:
            assert _legal_call(flow, role) is flow
        else:
            with pytest.raises(IllegalTransition, match=_role_pattern(role)):
                _legal_call(flow, role)


@pytest.mark.parametrize("flow", [f for f in TRANSITIONS if f.needs_reason], ids=lambda f: f.trigger.value)
def test_needs_reason_flows_refuse_blank_reason(flow: Flow) -> None:
    """A flow marked needs_reason is refused without a non-blank reason even for an allowed role."""
    role = sorted(flow.roles)[0]
    with pytest.raises(IllegalTransition, match="reason"):
        check(flow.source, flow.target, flow.trigger, role)
    with pytest.raises(IllegalTransition, match="reason"):
        check(flow.source, flow.target, flow.trigger, role, reason="  ")
    assert check(flow.source, flow.target, flow.trigger, role, reason="retention reached") is flow


def test_only_cross_scope_copy_and_audit_purge_need_a_reason() -> None:
    """The two flows that demand a stated reason are the cross-scope copy and the audit purge."""
    assert {f.trigger for f in TRANSITIONS if f.needs_reason} == {Trigger.CROSS_SCOPE_COPY, Trigger.PURGE_EXPIRED}


def test_flows_without_needs_reason_ignore_the_reason() -> None:
    """Ordinary flows pass with or without a reason."""
    for flow in TRANSITIONS:
        if flow.needs_reason:
            continue
        role = sorted(flow.roles)[0]
        assert check(flow.source, flow.target, flow.trigger, role) is flow
        assert check(flow.source, flow.target, flow.trigger, role, reason="why") is flow


def _roles(source: Place, target: Place, trigger: Trigger) -> frozenset[Role]:
    flow = find(source, target, trigger)
    assert flow is not None, (source, target, trigger)
    return flow.roles


def test_role_specific_limits() -> None:
    """Expiry and decay are the system's, critic verdicts the critic's or clinician's, retraction the admin's."""
    assert _roles(STM_ACTIVE, STM_EXPIRED, Trigger.EXPIRE) == frozenset({Role.SYSTEM})
    assert _roles(LTM_ACTIVE, LTM_ANONYMIZED, Trigger.DECAY) == frozenset({Role.SYSTEM})
    assert _roles(LTM_ACTIVE, LTM_SUPERSEDED, Trigger.CRITIC_REJECT) == {Role.CRITIC, Role.CLINICIAN}
    assert _roles(STM_ACTIVE, LTM_ACTIVE, Trigger.CRITIC_PROMOTE) == {Role.CRITIC, Role.CLINICIAN}
    assert _roles(LTM_ACTIVE, LTM_RETRACTED, Trigger.RETRACT) == frozenset({Role.ADMIN})
    assert _roles(STM_ACTIVE, STM_DISCARDED, Trigger.RETRACT) == frozenset({Role.ADMIN})
    assert Role.AUDITOR not in _roles(SOURCE, STM_ACTIVE, Trigger.WRITE)
    assert Role.AUDITOR in _roles(LTM_ACTIVE, LTM_ACTIVE, Trigger.READ)


def test_terminal_states_have_no_way_out() -> None:
    """Retracted LTM and consolidated/expired/discarded STM items never move again."""
    terminal = {
        LTM_RETRACTED,
        Place(Tier.STM, StmState.CONSOLIDATED),
        STM_EXPIRED,
        STM_DISCARDED,
    }
    assert not [f for f in TRANSITIONS if f.source in terminal]


def test_module_exports() -> None:
    """The module's public names are the table, its types, its lookup functions and the roles."""
    assert set(transitions.__all__) == {
        "LTM_STATE_CHANGES",
        "ROLES",
        "STM_STATE_CHANGES",
        "TRANSITIONS",
        "Flow",
        "Place",
        "Tier",
        "Trigger",
        "check",
        "find",
    }

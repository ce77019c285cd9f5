"""The legal transitions between tiers and states: one declarative table, fail closed.

It sits with the shared records because two layers enforce it: the governance layer checks
every move before it stages anything, and the storage layer refuses any write the table does
not allow (so a caller that reaches the store still cannot rewrite long-term content in place).

Tiers: ``source`` (outside the memory: a user, a device, a data set), ``stm`` (short-term),
``ltm`` (long-term) and ``audit``. A flow is ``(from place, to place, trigger, roles allowed)``
where a :class:`Place` is a tier and a state. :func:`check` accepts exactly the flows in
:data:`TRANSITIONS`; anything else raises :class:`IllegalTransition` (the caller writes nothing
and audits the denial).

The seed's four illegal moves are absent from the table by construction:
- a write that skips its originating tier: ``source -> ltm`` (it must land in STM first);
- STM to STM across patient scope: only the ``cross_scope_copy`` trigger, admin only, and
  :func:`check` demands a reason for it;
- an in-place LTM content rewrite: no ``ltm:active -> ltm:active`` flow changes anything
  (corrections are ``supersede``: a new active row and the old one to ``superseded``);
- anything that writes from the audit tier: no flow has ``audit`` as its source except the
  append-only ``audit -> audit`` purge of events past retention.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ._errors import IllegalTransition
from ._principal import Role
from ._records import State
from ._tier_records import StmState

__all__ = [
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
]


class Tier(StrEnum):
    """Where a record is: outside the memory, short-term, long-term or the audit trail."""

    SOURCE = "source"
    STM = "stm"
    LTM = "ltm"
    AUDIT = "audit"


class Trigger(StrEnum):
    """What moves a record (the seed's flow names)."""

    WRITE = "write"
    REFRESH = "refresh"
    EXPIRE = "expire"
    DISCARD = "discard"
    CROSS_SCOPE_COPY = "cross_scope_copy"
    CONSOLIDATE = "consolidate"
    AGE_THRESHOLD = "age_threshold"
    CRITIC_PROMOTE = "critic_promote"
    SEMANTIC_UPDATE = "semantic_update"
    SUPERSEDE = "supersede"
    CRITIC_REJECT = "critic_reject"
    DECAY = "decay"
    RETRACT = "retract"
    READ = "read"
    PURGE_EXPIRED = "purge_expired"


@dataclass(frozen=True, slots=True)
class Place:
    """A tier and a state in it (``state`` is None outside the memory and in the audit tier)."""

    tier: Tier
    state: State | StmState | None = None

    def __post_init__(self) -> None:
        expected = {Tier.STM: StmState, Tier.LTM: State}.get(self.tier)
        if (expected is None) != (self.state is None) or (expected and not isinstance(self.state, expected)):
            raise ValueError(f"no state {self.state!r} in tier {self.tier.value}")

    def __str__(self) -> str:
        return f"{self.tier.value}:{self.state.value if self.state else '-'}"


SOURCE = Place(Tier.SOURCE)
AUDIT = Place(Tier.AUDIT)
STM_ACTIVE = Place(Tier.STM, StmState.ACTIVE)
STM_EXPIRED = Place(Tier.STM, StmState.EXPIRED)
STM_DISCARDED = Place(Tier.STM, StmState.DISCARDED)
LTM_ACTIVE = Place(Tier.LTM, State.ACTIVE)
LTM_SUPERSEDED = Place(Tier.LTM, State.SUPERSEDED)
LTM_ANONYMIZED = Place(Tier.LTM, State.ANONYMIZED)
LTM_RETRACTED = Place(Tier.LTM, State.RETRACTED)

#: the roles known to the table
ROLES = frozenset(Role)
_WRITERS = frozenset({Role.AGENT, Role.CLINICIAN, Role.SYSTEM})
_SYSTEM = frozenset({Role.SYSTEM})
_ADMIN = frozenset({Role.ADMIN})
_CRITICS = frozenset({Role.CRITIC, Role.CLINICIAN})
_READERS = _WRITERS | {Role.CRITIC, Role.AUDITOR}


@dataclass(frozen=True, slots=True)
class Flow:
    """One legal transition."""

    source: Place
    target: Place
    trigger: Trigger
    roles: frozenset[Role]
    needs_reason: bool = False


T = Trigger
TRANSITIONS: tuple[Flow, ...] = (
    # arrival: everything lands in short-term memory first
    Flow(SOURCE, STM_ACTIVE, T.WRITE, _WRITERS),
    Flow(STM_ACTIVE, STM_ACTIVE, T.REFRESH, _WRITERS),
    Flow(STM_ACTIVE, STM_EXPIRED, T.EXPIRE, _SYSTEM),
    Flow(STM_ACTIVE, STM_DISCARDED, T.DISCARD, _WRITERS | {Role.CRITIC}),
    Flow(STM_ACTIVE, STM_ACTIVE, T.CROSS_SCOPE_COPY, _ADMIN, needs_reason=True),
    # consolidation: three triggers, one rule set (the write-back gate)
    Flow(STM_ACTIVE, LTM_ACTIVE, T.CONSOLIDATE, _WRITERS),
    Flow(STM_ACTIVE, LTM_ACTIVE, T.AGE_THRESHOLD, _SYSTEM),
    Flow(STM_ACTIVE, LTM_ACTIVE, T.CRITIC_PROMOTE, _CRITICS),
    # semantic state is versioned after every interaction (supersede the previous version)
    Flow(STM_ACTIVE, LTM_SUPERSEDED, T.SEMANTIC_UPDATE, _WRITERS | {Role.CRITIC}),
    # corrections: supersession only, never an in-place rewrite
    Flow(LTM_ACTIVE, LTM_SUPERSEDED, T.SUPERSEDE, _WRITERS | {Role.CRITIC}),
    Flow(LTM_ACTIVE, LTM_SUPERSEDED, T.CRITIC_REJECT, _CRITICS),
    # decay at decay_at: active content is anonymised in place and joins the population pool;
    # superseded content (corrected, so wrong or outdated) and per-patient semantic state have
    # nothing left to share without the patient, so they are blanked and retracted
    Flow(LTM_ACTIVE, LTM_ANONYMIZED, T.DECAY, _SYSTEM),
    Flow(LTM_SUPERSEDED, LTM_RETRACTED, T.DECAY, _SYSTEM),
    Flow(LTM_ACTIVE, LTM_RETRACTED, T.DECAY, _SYSTEM),
    # erasure: crypto-shredding makes a patient's data unreadable
    Flow(LTM_ACTIVE, LTM_RETRACTED, T.RETRACT, _ADMIN),
    Flow(LTM_SUPERSEDED, LTM_RETRACTED, T.RETRACT, _ADMIN),
    Flow(STM_ACTIVE, STM_DISCARDED, T.RETRACT, _ADMIN),
    # reads (no state change, still checked and audited)
    Flow(LTM_ACTIVE, LTM_ACTIVE, T.READ, _READERS),
    Flow(LTM_ANONYMIZED, LTM_ANONYMIZED, T.READ, _READERS),
    # the audit tier only grows; purge only past the retention period
    Flow(AUDIT, AUDIT, T.PURGE_EXPIRED, _ADMIN, needs_reason=True),
)
del T

_INDEX: dict[tuple[Place, Place, Trigger], Flow] = {(f.source, f.target, f.trigger): f for f in TRANSITIONS}

#: the long-term state changes a store may apply to an existing row (``expect -> to``); an
#: ``active -> active`` change (an in-place rewrite) is not among them
LTM_STATE_CHANGES: frozenset[tuple[State, State]] = frozenset(
    (source, target)
    for f in TRANSITIONS
    if f.source.tier is Tier.LTM
    and f.target.tier is Tier.LTM
    and f.source != f.target
    and isinstance(source := f.source.state, State)
    and isinstance(target := f.target.state, State)
)

#: the short-term state changes a store may apply (``refresh`` keeps ``active``; consolidation
#: moves an item out of short-term memory, which the table writes as ``stm -> ltm``)
STM_STATE_CHANGES: frozenset[tuple[StmState, StmState]] = frozenset(
    {(StmState.ACTIVE, StmState.ACTIVE), (StmState.ACTIVE, StmState.CONSOLIDATED)}
    | {
        (source, target)
        for f in TRANSITIONS
        if f.source.tier is Tier.STM
        and f.target.tier is Tier.STM
        and isinstance(source := f.source.state, StmState)
        and isinstance(target := f.target.state, StmState)
    }
)


def find(source: Place, target: Place, trigger: Trigger) -> Flow | None:
    """The flow for ``(source, target, trigger)``, or None when it is not legal for anyone."""
    return _INDEX.get((source, target, trigger))


def check(source: Place, target: Place, trigger: Trigger, role: Role, *, reason: str = "") -> Flow:
    """Return the legal flow or raise :class:`IllegalTransition` naming what was refused."""
    flow = _INDEX.get((source, target, Trigger(trigger)))
    if flow is None:
        raise IllegalTransition(f"no legal transition {source} -> {target} by {trigger.value!r}")
    if role not in flow.roles:
        raise IllegalTransition(f"role {role!r} may not {trigger.value} {source} -> {target}")
    if flow.needs_reason and not reason.strip():
        raise IllegalTransition(f"{trigger.value} {source} -> {target} needs a stated reason")
    return flow

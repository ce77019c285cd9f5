"""The legal transitions between tiers and states: one declarative table, fail closed.

Tiers: ``source`` (outside the memory: a user, a device, a data set), ``stm`` (short-term),
``ltm`` (long-term) and ``audit``. A flow is ``(from tier/state, to tier/state, trigger,
roles allowed)``. :func:`check` accepts exactly the flows in :data:`TRANSITIONS`; anything else
raises :class:`IllegalTransition` (the caller writes nothing and audits the denial).

The seed's four illegal moves are absent from the table by construction:
- a write that skips its originating tier: ``source -> ltm`` (it must land in STM first);
- STM to STM across patient scope: only the ``cross_scope_copy`` trigger, admin only, and
  :func:`check` demands a reason for it;
- an in-place LTM content rewrite: no ``ltm:active -> ltm:active`` flow exists (corrections are
  ``supersede``: a new active row and the old one to ``superseded``);
- anything that writes from the audit tier: no flow has ``audit`` as its source except the
  append-only ``audit -> audit`` purge of events past retention.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._errors import IllegalTransition

__all__ = ["ROLES", "TRANSITIONS", "Flow", "check", "find"]

#: the roles known to the table
ROLES = frozenset({"agent", "clinician", "critic", "system", "admin", "auditor"})
_WRITERS = frozenset({"agent", "clinician", "system"})


@dataclass(frozen=True, slots=True)
class Flow:
    """One legal transition."""

    source: str  # "tier:state"
    target: str
    trigger: str
    roles: frozenset[str]
    needs_reason: bool = False


TRANSITIONS: tuple[Flow, ...] = (
    # arrival: everything lands in short-term memory first
    Flow("source:-", "stm:active", "write", _WRITERS),
    Flow("stm:active", "stm:active", "refresh", _WRITERS),
    Flow("stm:active", "stm:expired", "expire", frozenset({"system"})),
    Flow("stm:active", "stm:discarded", "discard", _WRITERS | {"critic"}),
    Flow("stm:active", "stm:active", "cross_scope_copy", frozenset({"admin"}), needs_reason=True),
    # consolidation: three triggers, one rule set (the write-back gate)
    Flow("stm:active", "ltm:active", "consolidate", _WRITERS),
    Flow("stm:active", "ltm:active", "age_threshold", frozenset({"system"})),
    Flow("stm:active", "ltm:active", "critic_promote", frozenset({"critic", "clinician"})),
    # semantic state is versioned after every interaction (supersede the previous version)
    Flow("stm:active", "ltm:superseded", "semantic_update", _WRITERS | {"critic"}),
    # corrections: supersession only, never an in-place rewrite
    Flow("ltm:active", "ltm:superseded", "supersede", _WRITERS | {"critic"}),
    Flow("ltm:active", "ltm:superseded", "critic_reject", frozenset({"critic", "clinician"})),
    # decay at decay_at: active content is anonymised in place and joins the population pool;
    # superseded content (corrected, so wrong or outdated) and per-patient semantic state have
    # nothing left to share without the patient, so they are blanked and retracted
    Flow("ltm:active", "ltm:anonymized", "decay", frozenset({"system"})),
    Flow("ltm:superseded", "ltm:retracted", "decay", frozenset({"system"})),
    Flow("ltm:active", "ltm:retracted", "decay", frozenset({"system"})),
    # erasure: crypto-shredding makes a patient's data unreadable
    Flow("ltm:active", "ltm:retracted", "retract", frozenset({"admin"})),
    Flow("ltm:superseded", "ltm:retracted", "retract", frozenset({"admin"})),
    Flow("stm:active", "stm:discarded", "retract", frozenset({"admin"})),
    # reads (no state change, still checked and audited)
    Flow("ltm:active", "ltm:active", "read", _WRITERS | {"critic", "auditor"}),
    Flow("ltm:anonymized", "ltm:anonymized", "read", _WRITERS | {"critic", "auditor"}),
    # the audit tier only grows; purge only past the retention period
    Flow("audit:-", "audit:-", "purge_expired", frozenset({"admin"}), needs_reason=True),
)

_INDEX: dict[tuple[str, str, str], Flow] = {(f.source, f.target, f.trigger): f for f in TRANSITIONS}


def find(source: str, target: str, trigger: str) -> Flow | None:
    """The flow for ``(source, target, trigger)``, or None when it is not legal for anyone."""
    return _INDEX.get((source, target, trigger))


def check(source: str, target: str, trigger: str, role: str, *, reason: str = "") -> Flow:
    """Return the legal flow or raise :class:`IllegalTransition` naming what was refused."""
    flow = _INDEX.get((source, target, trigger))
    if flow is None:
        raise IllegalTransition(f"no legal transition {source} -> {target} by {trigger!r}")
    if role not in flow.roles:
        raise IllegalTransition(f"role {role!r} may not {trigger} {source} -> {target}")
    if flow.needs_reason and not reason.strip():
        raise IllegalTransition(f"{trigger} {source} -> {target} needs a stated reason")
    return flow

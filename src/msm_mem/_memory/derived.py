"""Copies derived from a patient's records: what shredding the patient must remove elsewhere.

An answer the agent derived from population experience is written back under the asking
patient with ``source = "population:<ids>"`` (:mod:`msm_mem._memory.population`): its episodic
and visual records carry that source, its study claim carries it in its provenance (``by``),
and its semantic state and held short-term item hold its text. :func:`derived_copies` finds,
across every other patient and transitively (an answer derived from a derived answer), each
record whose source names one of the given ids, and returns the changes that retract and blank
it: the records, the semantic versions holding their text, the claim's relationships and the
held short-term item.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from .._records import State
from .._storage.base import PII_FIELDS, StateChange, Store
from .._tier_records import StmChange, StmState
from .population import derived_from

__all__ = ["Derived", "derived_copies"]

_LIVE = (State.ACTIVE, State.SUPERSEDED)


@dataclass
class Derived:
    """The retractions of the derived copies, per patient (``ids``: the record ids changed)."""

    changes: list[StateChange] = field(default_factory=list)
    stm_changes: list[StmChange] = field(default_factory=list)
    ids: dict[str, list[str]] = field(default_factory=dict)

    def _retract(self, patient: str, table: str, record_id: str, state: State) -> None:
        blank = tuple((f, "") for f in PII_FIELDS.get(table, ()))
        self.changes.append(StateChange(table, record_id, state, State.RETRACTED, fields=blank))  # type: ignore[arg-type]
        self.ids.setdefault(patient, []).append(record_id)


@dataclass(frozen=True, slots=True)
class _Rec:
    table: str
    id: str
    patient: str
    state: State
    refs: frozenset[str]
    text: str = ""
    stm: str = ""


def _by(source: str) -> tuple[str, str]:
    """(``by``, ``stm``) of a claim's provenance; empty when it is not the JSON a claim keeps."""
    try:
        prov = json.loads(source)
    except ValueError:
        return "", ""
    if not isinstance(prov, dict):
        return "", ""
    by, stm = prov.get("by", ""), prov.get("stm", "")
    return (by if isinstance(by, str) else ""), (stm if isinstance(stm, str) else "")


def _records(store: Store, skip: str) -> list[_Rec]:
    out: list[_Rec] = []
    for pid in store.patients():
        if pid == skip:
            continue
        for e in store.get_episodes(store.record_ids("episodic", pid)):
            out.append(_Rec("episodic", e.episode_id, pid, e.state, derived_from(e.source), e.answer))
        for v in store.get_visuals(store.record_ids("visual", pid)):
            out.append(_Rec("visual", v.visual_id, pid, v.state, derived_from(v.source)))
        for c in store.get_claims(store.record_ids("claims", pid)):
            by, stm = _by(c.source)
            out.append(_Rec("claims", c.claim_id, pid, c.state, derived_from(by), c.content, stm))
    return [r for r in out if r.state in _LIVE and r.refs]


def derived_copies(store: Store, sources: Iterable[str], *, skip_patient: str) -> Derived:
    """The retractions of every live copy derived, directly or not, from the records ``sources``
    (ids), outside ``skip_patient`` (the patient being shredded, retracted by the caller)."""
    found = set(sources)
    candidates = _records(store, skip_patient)
    hit: dict[str, _Rec] = {}
    grew = True
    while grew:
        grew = False
        for r in candidates:
            if r.id not in hit and r.refs & found:
                hit[r.id] = r
                found.add(r.id)
                grew = True
    out = Derived()
    texts: dict[str, set[str]] = {}
    claims: dict[str, set[str]] = {}
    for r in hit.values():
        out._retract(r.patient, r.table, r.id, r.state)
        if r.text:
            texts.setdefault(r.patient, set()).add(r.text)
        if r.table == "claims":
            claims.setdefault(r.patient, set()).add(r.id)
            if r.stm:
                _discard_stm(store, out, r.patient, r.stm)
    for s in store.iter_semantic():
        if s.state in _LIVE and any(i.text in texts.get(s.patient_id, ()) for i in s.impressions):
            out._retract(s.patient_id, "semantic", s.state_id, s.state)
    for pid, ids in claims.items():
        for rel in store.relationships(pid):
            if rel.source_id in ids and rel.state == State.ACTIVE:
                out._retract(pid, "relationships", rel.relationship_id, rel.state)
    return out


def _discard_stm(store: Store, out: Derived, patient: str, item_id: str) -> None:
    for item in store.stm_list(patient_id=patient, state=StmState.ACTIVE):
        if item.item_id == item_id:
            out.stm_changes.append(StmChange(item_id, StmState.ACTIVE, StmState.DISCARDED, purge=True))
            out.ids.setdefault(patient, []).append(item_id)

"""Reads of one patient's memory through :class:`~msm_mem.MsmMem`: semantic state and its
history, episodes, visual records, claims and their supersession chains, short-term items.

Each read is a consent-checked turn for the data class it touches and leaves one audit event
naming the ids it returned: with ``offset`` and ``limit``, those of the page only. Records are
immutable; the auditor role reads none of them.

An episodic, visual or claim record's ``decay_at`` is when the maintenance sweep will decay
it as the store stands now (:func:`~msm_mem._memory.ranking.decay_at`: the patient's last
activity plus the retention setting x confidence x tier weight), computed at the read exactly
as the sweep does; None for a record that no longer decays (anonymised, retracted)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from .. import _transitions as tr
from .._errors import InvalidInput
from .._memory.ranking import decay_at
from .._principal import Principal
from .._records import EpisodicRecord, SemanticState, State, VisualRecord
from .._tier_records import Claim, StmItem, StmState
from .access import Operation
from .base import _Base

__all__ = ["RecordPage"]

_R = TypeVar("_R")


class RecordPage(list[_R]):
    """One page of a read: the records from ``offset`` on (at most the ``limit`` asked for),
    a plain list of them, with ``total``, how many records the whole read holds. The read's
    audit event names the records of the page only."""

    __slots__ = ("offset", "total")

    def __init__(self, records: Iterable[_R], offset: int, total: int) -> None:
        super().__init__(records)
        self.offset = offset
        self.total = total

    @property
    def next_offset(self) -> int | None:
        """Where the next page starts; None when this page is the last."""
        end = self.offset + len(self)
        return end if end < self.total else None


def _check_page(offset: object, limit: object) -> tuple[int, int | None]:
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise InvalidInput(f"offset must be an integer >= 0, got {offset!r}")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise InvalidInput(f"limit must be an integer >= 1 or None (every record), got {limit!r}")
    return offset, limit


def _id(record: object) -> str:
    for name in ("episode_id", "visual_id", "state_id", "claim_id", "item_id"):
        value = getattr(record, name, None)
        if isinstance(value, str):
            return value
    raise TypeError(f"not a memory record: {type(record).__name__}")


def _all(listed: Sequence[Any]) -> Sequence[Any]:
    return listed


class _Reads(_Base):
    def _read(
        self,
        principal: Principal,
        patient_id: str,
        data_class: str,
        listing: Callable[[], Sequence[Any]],
        load: Callable[[Sequence[Any]], Sequence[_R]] = _all,
        *,
        offset: int = 0,
        limit: int | None = None,
    ) -> RecordPage[_R]:
        """A consent-checked read of one page: ``listing()`` lists the whole read cheaply (ids,
        or records a cache holds), ``load`` turns the page's part of it into records."""
        offset, limit = _check_page(offset, limit)
        p = self._allow(principal, Operation.READ)
        turn = self._gm.begin(p, patient_id, classes=(data_class,))
        self._gm._check(turn, tr.LTM_ACTIVE, tr.LTM_ACTIVE, tr.Trigger.READ)
        listed = listing()
        records = list(load(listed[offset : None if limit is None else offset + limit]))
        if data_class in ("episodic", "visual", "claims"):
            records = self._with_decay(patient_id, records)
        source = "stm" if data_class == "stm" else "ltm"
        self._gm._event(turn, "read", source, "source", [_id(r) for r in records])
        self._gm.commit(turn)
        return RecordPage(records, offset, len(listed))

    def _with_decay(self, patient_id: str, records: list[_R]) -> list[_R]:
        """``records`` with ``decay_at`` as the sweep would decide it now (module docstring)."""
        last = self._store.last_activity(patient_id)
        keep = self._settings.retention_s
        out: list[_R] = []
        for rec in records:
            if isinstance(rec, (EpisodicRecord, VisualRecord, Claim)):
                live = last is not None and rec.state in (State.ACTIVE, State.SUPERSEDED)
                when = decay_at(last, rec.confidence, rec.evidence_tier, keep) if live and last is not None else None
                rec = replace(rec, decay_at=when)
            out.append(rec)
        return out

    def semantic_state(
        self,
        principal: Principal,
        patient_id: str,
        category: str | None = None,
        *,
        offset: int = 0,
        limit: int | None = None,
    ) -> RecordPage[SemanticState]:
        """The patient's active semantic state (one version per category, or just ``category``).
        ``offset`` and ``limit`` (None: every record) choose the page, as for every read here."""
        return self._read(
            principal,
            patient_id,
            "semantic",
            lambda: self._store.semantic_active(patient_id, category),
            offset=offset,
            limit=limit,
        )

    def semantic_history(
        self,
        principal: Principal,
        patient_id: str,
        category: str = "impression",
        *,
        offset: int = 0,
        limit: int | None = None,
    ) -> RecordPage[SemanticState]:
        """Every version of the patient's semantic state in ``category``, oldest first, each
        naming the version it supersedes."""
        return self._read(
            principal,
            patient_id,
            "semantic",
            lambda: self._store.semantic_history(patient_id, category),
            offset=offset,
            limit=limit,
        )

    def episodes(
        self, principal: Principal, patient_id: str, *, offset: int = 0, limit: int | None = None
    ) -> RecordPage[EpisodicRecord]:
        """The patient's episodic records (every state; superseded ones name their successor
        through ``supersedes`` of the newer record); only the page's records are loaded."""
        return self._read(
            principal,
            patient_id,
            "episodic",
            lambda: self._store.record_ids("episodic", patient_id),
            self._store.get_episodes,
            offset=offset,
            limit=limit,
        )

    def visuals(
        self, principal: Principal, patient_id: str, *, offset: int = 0, limit: int | None = None
    ) -> RecordPage[VisualRecord]:
        """The patient's visual records; only the page's records are loaded."""
        return self._read(
            principal,
            patient_id,
            "visual",
            lambda: self._store.record_ids("visual", patient_id),
            self._store.get_visuals,
            offset=offset,
            limit=limit,
        )

    def claims(
        self,
        principal: Principal,
        patient_id: str,
        key: str | None = None,
        *,
        offset: int = 0,
        limit: int | None = None,
    ) -> RecordPage[Claim]:
        """The patient's active claims (or those under ``key``, e.g. ``study:<id>``)."""
        return self._read(
            principal,
            patient_id,
            "claims",
            lambda: self._store.claims_active(patient_id, key),
            offset=offset,
            limit=limit,
        )

    def claim_history(
        self, principal: Principal, patient_id: str, key: str, *, offset: int = 0, limit: int | None = None
    ) -> RecordPage[Claim]:
        """The supersession chain of one claim key, oldest first."""
        return self._read(
            principal,
            patient_id,
            "claims",
            lambda: self._store.claim_history(patient_id, key),
            offset=offset,
            limit=limit,
        )

    def stm_items(
        self,
        principal: Principal,
        patient_id: str,
        state: StmState | None = None,
        *,
        offset: int = 0,
        limit: int | None = None,
    ) -> RecordPage[StmItem]:
        """The patient's short-term items (every state, or just ``state``), with their expiry."""
        return self._read(
            principal,
            patient_id,
            "stm",
            lambda: self._store.stm_list(patient_id=patient_id, state=state),
            offset=offset,
            limit=limit,
        )

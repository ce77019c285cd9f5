"""Maintenance and corrections of the governed tiers: expiry, age-threshold consolidation,
decay (anonymisation in place), critic verdicts and erasure (crypto-shredding).

All of them run as a role from the transition table, check every move, and write each step's
records and audit events in one transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from .. import _transitions as tr
from .._errors import InvalidInput
from .._governance.anonymise import anonymise
from .._governance.audit.erasure import ErasureReceipt
from .._governance.crypto import EnvelopeCipher
from .._principal import Principal, Purpose, Role
from .._records import State, new_id
from .._settings import DEFAULT_RETENTION_S
from .._storage.base import PII_FIELDS, StateChange, WriteBatch
from .._storage.batch import ERASED_TABLES, Erasure
from .._tier_records import Claim, StmChange, StmState
from .corrections import Corrections
from .derived import derived_copies
from .ranking import DEFAULT_TIER_WEIGHT, TIER_WEIGHTS, decay_at
from .tiers import GovernedMemory

__all__ = ["DecayPlan", "MaintenanceReport", "Maintainer"]

SYSTEM = Principal("msm-mem", Role.SYSTEM, Purpose.OPERATIONS)


def _kept(text: str) -> str:
    """Decayed content: IDs stripped, content kept (the common-vocabulary anonymiser)."""
    return anonymise(text).text


def _year(t: float) -> str:
    """UTC seconds of 1 January of ``t``'s year (Safe Harbor keeps the year only)."""
    return str(datetime(datetime.fromtimestamp(t, UTC).year, 1, 1, tzinfo=UTC).timestamp())


@dataclass(frozen=True, slots=True)
class DecayPlan:
    """One long-term record a sweep decays (or, in a dry run, would decay), and why.

    ``kind`` is ``episodic``, ``visual``, ``semantic`` or ``claims``; ``record_id`` its id
    and ``state`` its state (ACTIVE or SUPERSEDED) before decay; ``last_activity`` the
    patient's newest long-term write (UTC seconds, the store's clock); ``retention_s`` what
    this record keeps after it: the retention setting x ``confidence`` x the weight of
    ``evidence_tier`` (a semantic version: the whole setting); ``due_at = last_activity +
    retention_s`` (at or before the sweep's time); ``to`` is ANONYMIZED or RETRACTED."""

    kind: str
    record_id: str
    state: State
    confidence: float
    evidence_tier: str
    last_activity: float
    retention_s: float
    due_at: float
    to: State


@dataclass(frozen=True, slots=True)
class MaintenanceReport:
    """What one maintenance pass did: counts, the checkpoint, and ``decay``, each record
    decayed. A dry run (``dry_run``) counts what decay would anonymise and retract and lists
    it in ``decay``; it expires, consolidates and checkpoints nothing (those stay 0 / None)."""

    expired: int = 0
    consolidated: int = 0
    discarded: int = 0
    anonymized: int = 0
    retracted: int = 0
    checkpoint: tuple[int, str] | None = None
    notes: tuple[str, ...] = ()
    dry_run: bool = False
    decay: tuple[DecayPlan, ...] = ()


class Maintainer:
    """Runs the system-role sweeps and the critic / erasure operations."""

    def __init__(
        self,
        gm: GovernedMemory,
        cipher: EnvelopeCipher,
        *,
        consolidate_after_s: float = 3600.0,
        system: Principal = SYSTEM,
        at: float | None = None,
        retention_s: float = DEFAULT_RETENTION_S,
    ) -> None:
        """``system`` is the principal the sweeps run as (role system); ``at`` the UTC time the
        sweeps run as of (default: the store's clock), for replays and tests. Audit events keep
        the store's clock: they record when the sweep really ran. ``retention_s`` is the
        retention setting of :meth:`decay`."""
        self.retention_s = retention_s
        self.system = system
        self.at = at
        self.gm = gm
        self.store = gm.store
        self.cipher = cipher
        self.consolidate_after_s = consolidate_after_s

    def now(self) -> float:
        """The time the sweeps run as of."""
        return self.gm.clock.now() if self.at is None else self.at

    # sweeps --------------------------------------------------------------------------------

    def expire(self) -> int:
        """STM items past ``expires_at`` become EXPIRED and are forgotten (payload purged)."""
        now = self.now()
        due = self.store.stm_list(state=StmState.ACTIVE, expires_before=now)
        for item in due:
            tr.check(tr.STM_ACTIVE, tr.STM_EXPIRED, tr.Trigger.EXPIRE, self.system.role)
            spec = self.gm.audit.spec(
                actor=self.system.id,
                role=self.system.role.value,
                action="expire",
                source_tier="stm",
                target_tier="stm",
                purpose="operations",
                record_ids=[item.item_id],
                patient=item.patient_id,
            )
            batch = WriteBatch(stm_changes=[StmChange(item.item_id, StmState.ACTIVE, StmState.EXPIRED, purge=True)])
            self.gm.audit.write(batch, [spec])
        return len(due)

    def consolidate_aged(self) -> tuple[int, int]:
        """Age threshold trigger: answered STM items older than the threshold go through the
        gate once more; passing ones are consolidated, the rest discarded (returns counts)."""
        now = self.now()
        done = discarded = 0
        for item in self.store.stm_list(state=StmState.ACTIVE, created_before=now - self.consolidate_after_s):
            info = item.payload
            if info is None or info.answer is None:
                continue
            turn = self.gm.begin(self.system, item.patient_id)
            # the turn that held the item recorded nothing in long-term memory: an answer the gate
            # now lets through supersedes the semantic state and its question's claim, as at ask
            result = self.gm.consolidate(
                turn,
                item,
                info.answer,
                decision=info.decision,
                trigger=tr.Trigger.AGE_THRESHOLD,
            )
            if not result.gate.written:
                turn.batch.stm_changes.append(StmChange(item.item_id, StmState.ACTIVE, StmState.DISCARDED, purge=True))
                self.gm._event(turn, "discard", "stm", "stm", [item.item_id], reason=",".join(result.gate.reasons))
                discarded += 1
            else:
                done += 1
            self.gm.commit(turn)
        return done, discarded

    def decay_plan(self) -> list[DecayPlan]:
        """The long-term records due for decay now, with why (see :class:`DecayPlan`); writes
        nothing. Due means ``last_activity + retention_s x confidence x tier_weight <= now``
        (a semantic version: ``last_activity + retention_s <= now``)
        (:func:`~msm_mem._memory.ranking.decay_at`), ``last_activity`` the newest long-term
        write of the record's patient; the anonymised pool (no patient) never decays again."""
        now = self.now()
        plan: list[DecayPlan] = []
        for d in self.store.decay_due(now, self.retention_s, TIER_WEIGHTS, DEFAULT_TIER_WEIGHT):
            due = decay_at(d.last_activity, d.confidence, d.evidence_tier, self.retention_s, d.table)
            if due > now:  # the store's arithmetic is the same; this keeps the rule in one place
                continue
            to = State.ANONYMIZED if d.state == State.ACTIVE and d.table != "semantic" else State.RETRACTED
            plan.append(
                DecayPlan(
                    d.table,
                    d.record_id,
                    d.state,
                    d.confidence,
                    d.evidence_tier,
                    d.last_activity,
                    due - d.last_activity,
                    due,
                    to,
                )
            )
        return plan

    def decay(self, plan: list[DecayPlan] | None = None) -> tuple[int, int]:
        """Decay every long-term record due (:meth:`decay_plan`, or ``plan`` when given).

        ACTIVE episodic, visual and claim records are anonymised in place: a random new id,
        patient, source, study and supersession links removed, times coarsened to the year,
        content kept through the allow-list anonymiser (:mod:`msm_mem._governance.anonymise`,
        common vocabulary: a word outside it becomes its category); they join the population pool. SUPERSEDED
        records and semantic state (wrong, outdated, or meaningless without the patient) are
        blanked and RETRACTED instead. The audit event names the old id only. Returns the
        counts (anonymised, retracted).
        """
        counts = {State.ANONYMIZED: 0, State.RETRACTED: 0}
        for item in self.decay_plan() if plan is None else plan:
            change = self._decayed(item.kind, item.record_id, item.state)
            tr.check(
                tr.Place(tr.Tier.LTM, change.expect),
                tr.Place(tr.Tier.LTM, change.to),
                tr.Trigger.DECAY,
                self.system.role,
            )
            spec = self.gm.audit.spec(
                actor=self.system.id,
                role=self.system.role.value,
                action="decay",
                source_tier="ltm",
                target_tier="ltm",
                purpose="operations",
                record_ids=[item.record_id],
                reason=change.to.value,
            )
            self.gm.audit.write(WriteBatch(changes=[change]), [spec])
            counts[change.to] += 1
        return counts[State.ANONYMIZED], counts[State.RETRACTED]

    def _decayed(self, table: str, record_id: str, known: State) -> StateChange:
        values: dict[str, str]
        if table == "episodic":
            e = self.store.get_episodes([record_id])[0]
            values = {f: _kept(getattr(e, f)) for f in PII_FIELDS["episodic"]}
            values.update(media_path="", study_id="", source="", supersedes="", timestamp=_year(e.timestamp))
            prefix, state = "E", e.state
        elif table == "visual":
            v = self.store.get_visuals([record_id])[0]
            values = {
                "media_path": "",
                "visual_tag": _kept(v.visual_tag),
                "source": "",
                "source_episode_id": "",
                "supersedes": "",
                "timestamp": _year(v.timestamp),
            }
            prefix, state = "V", v.state
        elif table == "claims":
            c = self.store.get_claims([record_id])[0]
            values = {"content": _kept(c.content), "source": "", "key": new_id("anon"), "supersedes": ""}
            prefix, state = "C", c.state
        else:
            values, prefix, state = {"impressions": "", "supersedes": ""}, "S", known
        to = State.ANONYMIZED if state == State.ACTIVE and table != "semantic" else State.RETRACTED
        if to == State.RETRACTED:
            values = {k: "" if k in PII_FIELDS.get(table, ()) else v for k, v in values.items()}
        values["created_at"] = _year(self.now())
        if table != "semantic":
            values["decay_at"] = ""
        return StateChange(
            table,  # type: ignore[arg-type]  # one of the decaying tables (decay_due names them)
            record_id,
            state,
            to,
            new_id=new_id(prefix),
            new_patient_id="",
            fields=tuple(values.items()),
        )

    def run(self, *, dry_run: bool = False) -> MaintenanceReport:
        """expire, consolidate by age, decay, then checkpoint the audit chain; with ``dry_run``
        only :meth:`decay_plan` (nothing written)."""
        if dry_run:
            plan = tuple(self.decay_plan())
            anonymized = sum(1 for p in plan if p.to == State.ANONYMIZED)
            return MaintenanceReport(anonymized=anonymized, retracted=len(plan) - anonymized, dry_run=True, decay=plan)
        expired = self.expire()
        consolidated, discarded = self.consolidate_aged()
        # planned after consolidation: a record it wrote is the patient's newest activity
        done = self.decay_plan()
        anonymized, retracted = self.decay(done)
        checkpoint = self.gm.audit.checkpoint()
        return MaintenanceReport(expired, consolidated, discarded, anonymized, retracted, checkpoint, decay=tuple(done))

    # corrections ---------------------------------------------------------------------------

    def critic_verdict(
        self,
        actor: Principal,
        patient_id: str,
        study_id: str,
        *,
        accept: bool,
        correction: str = "",
        decision: str = "",
        question: str | None = None,
    ) -> Claim:
        """See :meth:`Corrections.critic_verdict`."""
        return Corrections(self.gm).critic_verdict(
            actor, patient_id, study_id, accept=accept, correction=correction, decision=decision, question=question
        )

    # erasure -------------------------------------------------------------------------------

    def shred(self, actor: Principal, patient_id: str, reason: str) -> ErasureReceipt:
        """Erase a patient: every row of theirs destroyed (:class:`~msm_mem._storage.batch.Erasure`:
        the episodic and visual rows left as empty rows at their vector position, every other
        row deleted: semantic versions, claims, entities, relationships, short-term items and
        consent records, in every state), the data key destroyed and its row left with a keyed
        digest of the id, the pseudonym link deleted; every copy other patients' answers derived
        from the patient's records (:mod:`msm_mem._memory.derived`) retracted and blanked. One
        transaction, with one audit event for the patient (the last; its record ids are the rows
        destroyed, table after table) and one per other patient touched. Nothing is written when
        any of it fails.

        A patient whose key was shredded before (by a version that left their rows) is erased
        the same way; their event and receipt name no pseudonym (its link is gone).

        Returns the signed :class:`~msm_mem._governance.audit.erasure.ErasureReceipt`; the audit
        chain still verifies, and verifies the receipt."""
        tr.check(tr.LTM_ACTIVE, tr.LTM_RETRACTED, tr.Trigger.RETRACT, actor.role)
        if not reason.strip():
            raise InvalidInput("shredding a patient needs a stated reason")
        # a patient crypto-shredded before erasure destroyed rows: their rows are erased now, and
        # the event names no pseudonym (its link was destroyed with the key)
        already = self.cipher.is_shredded(patient_id)
        found = self.store.patient_rows(patient_id)
        erasure = Erasure(
            patient_id,
            self.cipher.tomb_ref(patient_id),
            tuple((table, tuple(found.get(table, ()))) for table in ERASED_TABLES),
        )
        batch = WriteBatch(erase=[erasure])
        sources = found.get("episodic", []) + found.get("visual", [])
        derived = derived_copies(self.store, sources, skip_patient=patient_id)
        batch.changes += derived.changes
        batch.stm_changes += derived.stm_changes
        specs = [
            self.gm.audit.spec(
                actor=actor.id,
                role=actor.role.value,
                action="retract",
                source_tier="ltm",
                target_tier="ltm",
                purpose="erasure",
                record_ids=copies,
                patient=other,
                reason="derived from a shredded patient",
            )
            for other, copies in sorted(derived.ids.items())
        ]
        spec = self.gm.audit.spec(
            actor=actor.id,
            role=actor.role.value,
            action="retract",
            source_tier="ltm",
            target_tier="ltm",
            purpose="erasure",
            record_ids=erasure.ids(),
            patient="" if already else patient_id,
            reason=reason,
        )
        had_key = not already and self.store.keys().get(patient_id) is not None
        head = self.gm.audit.write(batch, [*specs, spec])  # the patient's event last: the receipt names it
        self.cipher.shred(patient_id)  # drops the cached key; a tombstone for a patient without one
        self.gm.audit.forget(patient_id)
        assert head is not None  # the write appended the events
        counts = (*erasure.counts().items(), ("keys", int(had_key)))
        receipt = ErasureReceipt(spec.patient, head[0], head[1], spec.time, counts, len(derived.changes))
        return self.gm.audit.sign_receipt(receipt)

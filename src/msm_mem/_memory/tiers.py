"""The governed tiers over the memory core: consent, short-term memory, ranked reads,
consolidation into long-term memory, all audited and written atomically per turn.

One clinical turn (DESIGN.md section 2)::

    turn = gm.begin(actor, patient, purpose)        consent check (audited; deny -> ConsentDenied)
    item = gm.observe(turn, z, question, ...)       source -> STM (scope required, TTL)
    ranked = gm.retrieve(turn, z, ...)              LTM read, reranked by cosine x composite_k
    result = gm.consolidate(turn, item, answer)     STM -> LTM through the write-back gate;
                                                    semantic state and claim superseded
    gm.commit(turn)                                 one transaction: STM, LTM, audit rows

A held item (the gate said no) stays in STM until a critic promotes it or its TTL ends. A
failing turn still records its reads and the failure in the audit tier, and nothing else.
Every move is checked against :mod:`msm_mem._transitions` (fail closed).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import replace

from .. import _transitions as tr
from .._errors import IllegalTransition, InvalidInput, MsmMemError
from .._governance.audit.event import AuditSpec
from .._governance.audit.group_commit import GroupCommit
from .._governance.audit.log import AuditLog
from .._limits import MAX_TEXT_CHARS, check_observation, check_path, check_text
from .._records import Vector, new_id
from .._storage.base import WriteBatch
from .._tier_records import Claim, StmChange, StmItem, StmPayload, StmState
from .beginning import TurnBeginning
from .claims import link_findings, stage_study_claim
from .msm import Interaction, Memory, WriteResult
from .population import consented
from .ranking import rerank
from .retrieval import Retrieval, Scope
from .turn import Ranked, Turn

__all__ = ["GovernedMemory", "Ranked", "Turn", "link_findings"]


class GovernedMemory(TurnBeginning):
    """Consent, tiers, transitions and audit around a :class:`Memory`."""

    def __init__(self, memory: Memory, audit: AuditLog) -> None:
        self.memory = memory
        self.store = memory.store
        self.audit = audit
        self.reads = GroupCommit(audit)  # the audit events of concurrent reads, committed together
        self.clock = memory.clock
        self.settings = memory.settings
        self._ingest_key: bytes | None = None

    def ingest_key(self) -> bytes:
        """The secret of ingested rows' keyed ids (:func:`~msm_mem._records.keyed_id`): derived
        from the checkpoint key's row key, so only a holder of that key can recompute an id."""
        if self._ingest_key is None:
            row_key = self.audit.signer.row_key(self.store.store_id)
            self._ingest_key = hmac.new(row_key, b"msm-mem ingest ids v1", hashlib.sha256).digest()
        return self._ingest_key

    # audit events of the turn ---------------------------------------------------------------

    def _event(
        self,
        turn: Turn,
        action: str,
        source: str,
        target: str,
        ids: Sequence[str],
        *,
        outcome: str = "success",
        reason: str = "",
    ) -> None:
        turn.audit.append(
            self.audit.spec(
                actor=turn.actor.id,
                role=turn.actor.role.value,
                action=action,
                source_tier=source,
                target_tier=target,
                purpose=turn.purpose,
                outcome=outcome,
                record_ids=ids,
                patient=turn.patient_id,
                consent_id=turn.consent_id,
                reason=reason,
            )
        )

    def _check(self, turn: Turn, source: tr.Place, target: tr.Place, trigger: tr.Trigger, reason: str = "") -> None:
        name = trigger.value if isinstance(trigger, tr.Trigger) else str(trigger)
        try:
            if not isinstance(trigger, tr.Trigger):  # fail closed on an untyped trigger too
                raise IllegalTransition(f"unknown trigger {trigger!r}: use a Trigger of the transition table")
            tr.check(source, target, trigger, turn.actor.role, reason=reason)
        except IllegalTransition:
            self._event(
                turn,
                name,
                source.tier.value,
                target.tier.value,
                (),
                outcome="denied",
                reason="illegal_transition",
            )
            denied = list(turn.audit)
            turn.audit.clear()
            self._write_audit_only(denied)
            raise

    # short-term ----------------------------------------------------------------------------

    def observe(
        self,
        turn: Turn,
        z: object,
        question: str,
        *,
        timestamp: float | None = None,
        media_path: str = "",
        visual_tag: str = "",
        study_id: str = "",
        media_description: str = "",
        kind: str = "interaction",
    ) -> StmItem:
        """Write the current interaction into short-term memory (source -> STM)."""
        self._check(turn, tr.SOURCE, tr.STM_ACTIVE, tr.Trigger.WRITE)
        question, study_id, visual_tag = check_observation(question, study_id=study_id, visual_tag=visual_tag)
        check_path("media_path", media_path)
        media_description = check_text("media_description", media_description, MAX_TEXT_CHARS)
        now = self.clock.now()
        payload = StmPayload(
            question,
            now if timestamp is None else timestamp,
            media_path=media_path,
            visual_tag=visual_tag,
            study_id=study_id,
            media_description=media_description,
        )
        item = StmItem(
            new_id("M"),
            turn.patient_id,
            kind,
            payload,
            created_at=now,
            expires_at=now + self.settings.stm_ttl_s,
            z=self.memory.vector(z),
            actor=turn.actor.id,
        )
        turn.batch.stm.append(item)
        self._event(turn, "write", "source", "stm", [item.item_id])
        return item

    def _novelty_query(self, z: object) -> Vector:
        # observe keeps z normalised in the short-term item, and staging the consolidation
        # validates (normalises) the item's vector again: the vector its novelty search takes
        return self.memory.vector(self.memory.vector(z))

    def refresh(self, turn: Turn, item_id: str, *, ttl_s: float | None = None) -> float:
        """Extend an active STM item of the turn's patient by ``ttl_s`` (default: the setting)
        from now; returns the new ``expires_at``."""
        self._check(turn, tr.STM_ACTIVE, tr.STM_ACTIVE, tr.Trigger.REFRESH)
        (item,) = self.store.stm_get([item_id])
        if item.patient_id != turn.patient_id or item.state != StmState.ACTIVE:
            raise IllegalTransition(f"short-term item {item_id!r} is not active in this patient's scope")
        ttl = self.settings.stm_ttl_s if ttl_s is None else ttl_s
        if not 0 < ttl < float("inf"):
            raise InvalidInput(f"ttl_s must be a positive number of seconds, got {ttl_s!r}")
        expires = self.clock.now() + ttl
        turn.batch.stm_changes.append(StmChange(item_id, StmState.ACTIVE, StmState.ACTIVE, expires_at=expires))
        self._event(turn, "refresh", "stm", "stm", [item_id])
        return expires

    def cross_scope_copy(self, turn: Turn, item_id: str, *, reason: str) -> StmItem:
        """Copy another patient's active STM item into the turn's patient scope: admin only,
        with a stated reason (the seed's override of the STM -> STM cross-scope rule)."""
        self._check(turn, tr.STM_ACTIVE, tr.STM_ACTIVE, tr.Trigger.CROSS_SCOPE_COPY, reason=reason)
        (item,) = self.store.stm_get([item_id])
        if item.state != StmState.ACTIVE:
            raise IllegalTransition(f"short-term item {item_id!r} is {item.state.value}, not active")
        now = self.clock.now()
        copy = StmItem(
            new_id("M"),
            turn.patient_id,
            item.kind,
            item.payload,
            now,
            now + self.settings.stm_ttl_s,
            z=item.z,
            actor=turn.actor.id,
        )
        turn.batch.stm.append(copy)
        self._event(turn, "cross_scope_copy", "stm", "stm", [item_id, copy.item_id], reason=reason)
        return copy

    # reads ---------------------------------------------------------------------------------

    def retrieve(
        self,
        turn: Turn,
        z: object,
        *,
        at: float | None = None,
        use_sem: bool = True,
        use_epi: bool = True,
        use_vis: bool = True,
        scope: Scope = "patient",
        use_claims: bool = False,
    ) -> Ranked:
        """Read S, E, V (and with ``use_claims`` the study claims) for the turn's patient; rerank
        by cosine x composite_k at the query's clinical time ``at`` (default now); audit the ids."""
        self._check(turn, tr.LTM_ACTIVE, tr.LTM_ACTIVE, tr.Trigger.READ)
        r = self.memory.retrieve(
            turn.patient_id, z, use_sem=use_sem, use_epi=use_epi, use_vis=use_vis, scope=scope, use_claims=use_claims
        )
        if scope != "patient":  # other patients' and anonymised records: consented, de-identified
            r = self._consented(turn, r)
        ranked = rerank(r.evidence(), self.clock.now() if at is None else at)
        self._event(turn, "read", "ltm", "stm", [h.id for h, _ in ranked])
        return Ranked(r, tuple(ranked))

    def _consented(self, turn: Turn, r: Retrieval) -> Retrieval:
        """The patient's own hits, and other patients' as :func:`population.consented` allows."""
        a = turn.actor
        return consented(self.store, r, turn.patient_id, a.id, a.role.value, turn.purpose, self.clock.now())

    # consolidation -------------------------------------------------------------------------

    def consolidate(
        self,
        turn: Turn,
        item: StmItem,
        answer: str,
        *,
        decision: str = "",
        trigger: tr.Trigger = tr.Trigger.CONSOLIDATE,
        evidence_tier: str = "agent",
        confidence: float = 0.6,
        source: str = "agent",
        force: bool = False,
        derive: bool = True,
        visual: bool = True,
        keyed: tuple[str, str] = ("", ""),
    ) -> WriteResult:
        """STM -> LTM through the write-back gate; a held item stays in STM.

        The gate decides what reaches long-term memory: a written answer supersedes, with
        ``derive`` (the default), the semantic state and the claim of its question about its
        study; a held answer stays in STM with its answer (audited as ``hold``) and becomes
        neither a claim nor evidence. Without ``derive`` (an item a verdict promotes, whose
        claim the verdict writes itself) only the gate and the consolidation run. ``visual=False`` writes the
        episode without a visual record (another question about a study whose image has one);
        ``keyed`` are the episode's and visual record's ids when they are the row's own (ingest's
        keyed ids), random when empty."""
        self._check(turn, tr.STM_ACTIVE, tr.LTM_ACTIVE, trigger)
        if derive:
            self._check(turn, tr.STM_ACTIVE, tr.LTM_SUPERSEDED, tr.Trigger.SEMANTIC_UPDATE)
        info = item.payload
        if info is None:
            raise IllegalTransition(f"short-term item {item.item_id} was forgotten: nothing to consolidate")
        if item.z is None:
            raise InvalidInput(f"short-term item {item.item_id} has no embedding to consolidate")
        it = Interaction(
            patient_id=item.patient_id,
            z=item.z,
            question=info.question,
            answer=answer,
            timestamp=float(info.timestamp),
            decision=decision,
            media_path=info.media_path,
            visual_tag=info.visual_tag,
            study_id=info.study_id,
            media_description=info.media_description,
            evidence_tier=evidence_tier,
            confidence=confidence,
            source=source,
            visual=visual,
            episode_id=keyed[0],
            visual_id=keyed[1],
        )
        result = self.memory.stage(it, turn.staging, force=force, semantic=derive)
        if result.gate.written:
            # the item moved: long-term memory holds it now and decays or shreds it by its own
            # rules, so the short-term copy keeps no content (no second, undecayed copy of PHI)
            turn.batch.stm_changes.append(StmChange(item.item_id, StmState.ACTIVE, StmState.CONSOLIDATED, purge=True))
            ids = [item.item_id, result.episode_id or "", result.visual_id or ""]
            self._event(turn, trigger.value, "stm", "ltm", ids, reason=",".join(result.gate.reasons))
        else:
            # a held item carries its answer, for a later critic or age sweep: staged in this
            # turn, or (observed earlier) stored, its content replaced while it stays active
            held = info.answered(answer, decision)
            staged = [i for i, s in enumerate(turn.batch.stm) if s.item_id == item.item_id]
            for i in staged:
                turn.batch.stm[i] = replace(turn.batch.stm[i], payload=held)
            if not staged and held != info:
                turn.batch.stm_changes.append(StmChange(item.item_id, StmState.ACTIVE, StmState.ACTIVE, payload=held))
            self._event(turn, "hold", "stm", "stm", [item.item_id], reason=",".join(result.gate.reasons))
        if result.semantic is not None:
            claim = self._claim(turn, it, item, result)
            ids = [result.semantic.state_id, claim.claim_id]
            ids += [x for x in (result.semantic.supersedes, claim.supersedes) if x]
            self._event(turn, "semantic_update", "stm", "ltm", ids)
        return result

    def _claim(self, turn: Turn, it: Interaction, item: StmItem, result: WriteResult) -> Claim:
        return stage_study_claim(self.store, turn.batch, it, item.item_id, result.episode_id, self.clock.now())

    # committing ----------------------------------------------------------------------------

    def commit(self, turn: Turn) -> None:
        """Write the turn's batch and its audit events in one transaction.

        When the write fails, the turn's consent decision and reads (which did happen) and the
        error are audited in a transaction of their own, and the error is raised.
        """
        try:
            if turn.batch:
                self.audit.write(turn.batch, turn.audit)
            else:  # a read: its audit events may share a transaction with other threads' reads
                self.reads.write(turn.audit)
        except MsmMemError as exc:
            self.fail(turn, exc)
            raise
        turn.audit.clear()

    def commit_many(self, turns: Sequence[Turn]) -> None:
        """Commit several turns of different patients in one transaction, in order.

        Each turn was staged against the store as it is (its patient's active semantic state,
        claims, novelty), so two turns of one patient cannot share a transaction: InvalidInput,
        and nothing is written.
        """
        patients = [t.patient_id for t in turns]
        if len(set(patients)) != len(patients):
            raise InvalidInput("commit_many takes turns of different patients; commit one patient's turns in order")
        merged, specs = WriteBatch(), []
        for turn in turns:
            for name in merged.__dataclass_fields__:
                if name not in ("restore", "audit"):
                    getattr(merged, name).extend(getattr(turn.batch, name))
            specs.extend(turn.audit)
        self.audit.write(merged, specs)
        for turn in turns:
            turn.audit.clear()

    def fail(self, turn: Turn, exc: BaseException) -> None:
        """Record a turn that failed (for example a backbone timeout): its consent decision and
        reads, then the error; nothing else of the turn is written."""
        kept = [e for e in turn.audit if e.action in ("consent", "read")]
        kept.append(
            self.audit.spec(
                actor=turn.actor.id,
                role=turn.actor.role.value,
                action="turn",
                source_tier="stm",
                target_tier="ltm",
                purpose=turn.purpose,
                outcome="error",
                patient=turn.patient_id,
                consent_id=turn.consent_id,
                reason=type(exc).__name__,
            )
        )
        turn.audit.clear()
        self._write_audit_only(kept)

    def _write_audit_only(self, specs: list[AuditSpec]) -> None:
        self.reads.write(specs)

"""Corrections: a critic's verdict (for example the signed radiology report arriving later)
supersedes the agent's claim, semantic state and consolidated episode at the critic's evidence
tier, in one audited transaction: the self-improvement loop."""

from __future__ import annotations

import json

from .. import _transitions as tr
from .._errors import InvalidInput, NotFound
from .._limits import MAX_TEXT_CHARS, check_id, check_text
from .._principal import Principal
from .._records import EpisodicRecord, Impression, SemanticState, State, new_id
from .._storage.base import StateChange, WriteBatch
from .._tier_records import Claim, StmState
from .claims import link_findings
from .population import derived_from
from .ranking import decay_at
from .tiers import GovernedMemory

__all__ = ["Corrections"]


class Corrections:
    """Critic verdicts over one governed memory."""

    def __init__(self, gm: GovernedMemory) -> None:
        self.gm = gm
        self.store = gm.store

    def critic_verdict(
        self,
        actor: Principal,
        patient_id: str,
        study_id: str,
        *,
        accept: bool,
        correction: str = "",
        decision: str = "",
    ) -> Claim:
        """A critic's verdict on the agent's impression of one study (for example the signed
        report): accept, or reject with a correction. The claim and the semantic state are
        superseded at the critic's evidence tier; a consolidated episode is superseded by a
        corrected copy; a held STM item is promoted with the correction (forced past the gate).
        Only the critic and clinician roles may give a verdict, accepting or rejecting."""
        check_id("study_id", study_id)
        check_text("correction", correction, MAX_TEXT_CHARS)
        check_text("decision", decision, MAX_TEXT_CHARS)
        if not accept and not correction.strip():
            raise InvalidInput("a rejecting verdict needs the correction")
        turn = self.gm.begin(actor, patient_id)
        trigger = tr.Trigger.SUPERSEDE if accept else tr.Trigger.CRITIC_REJECT
        # any verdict, an acceptance too, lifts the claim to the critic's evidence tier: only the
        # roles that may reject may give one (checked before revealing whether the claim exists)
        self.gm._check(turn, tr.LTM_ACTIVE, tr.LTM_SUPERSEDED, tr.Trigger.CRITIC_REJECT)
        self.gm._check(turn, tr.LTM_ACTIVE, tr.LTM_SUPERSEDED, trigger)
        active = self.store.claims_active(patient_id, f"study:{study_id}")
        if not active:
            raise NotFound(f"no active claim for study {study_id!r} of this patient")
        old = active[0]
        text = old.content if accept else correction
        now = self.gm.clock.now()
        provenance = {**json.loads(old.source), "by": actor.id}
        ids: list[str] = []
        episode_id = provenance.get("episode") or ""
        if episode_id and not accept:
            fixed = self._supersede_episode(turn.batch, episode_id, text, decision, now, actor.id)
            if fixed:  # a later verdict on this study corrects the corrected copy
                provenance["episode"] = fixed[0]
            ids += fixed
        item_id = provenance.get("stm") or ""
        if item_id and not episode_id:
            items = [
                i for i in self.store.stm_list(patient_id=patient_id, state=StmState.ACTIVE) if i.item_id == item_id
            ]
            if items:
                # the critic's verdict is the outcome the held item waited for: it is promoted even
                # when the gate held it (a repeat image is never novel); the audit keeps "forced"
                result = self.gm.consolidate(
                    turn,
                    items[0],
                    text,
                    decision=decision,
                    trigger=tr.Trigger.CRITIC_PROMOTE,
                    evidence_tier="critic",
                    confidence=1.0,
                    source=actor.id,
                    force=True,
                    derive=False,
                )
                if result.episode_id:
                    provenance["episode"] = result.episode_id
                ids += [x for x in (result.episode_id, result.visual_id) if x]
        claim = Claim(
            new_id("C"),
            patient_id,
            old.key,
            text,
            json.dumps(provenance),
            1.0,
            "critic",
            now,
            decay_at(now, 1.0, "critic", "claims"),
            supersedes=old.claim_id,
        )
        turn.batch.claims.append(claim)
        link_findings(self.store, turn.batch, claim)
        ids = [claim.claim_id, old.claim_id, *ids]
        ids += self._semantic_correction(turn.batch, patient_id, study_id, text, decision, now)
        self.gm._event(turn, trigger.value, "ltm", "ltm", ids)
        self.gm.commit(turn)
        return claim

    def _supersede_episode(
        self, batch: WriteBatch, episode_id: str, text: str, decision: str, now: float, critic: str
    ) -> list[str]:
        try:
            e = self.store.get_episodes([episode_id])[0]
        except NotFound:
            return []
        if e.state != State.ACTIVE:
            return []
        fixed = EpisodicRecord(
            episode_id=new_id("E"),
            patient_id=e.patient_id,
            timestamp=e.timestamp,
            z=e.z,
            question=e.question,
            answer=text,
            decision=decision or e.decision,
            media_path=e.media_path,
            media_description=e.media_description,
            study_id=e.study_id,
            confidence=1.0,
            evidence_tier="critic",
            # the critic's text is no copy of population experience: the corrected copy is the critic's
            source=critic if derived_from(e.source) else e.source,
            created_at=now,
            decay_at=decay_at(now, 1.0, "critic", "episodic"),
            supersedes=e.episode_id,
        )
        batch.changes.append(StateChange("episodic", e.episode_id, State.ACTIVE, State.SUPERSEDED))
        batch.episodes.append(fixed)
        return [fixed.episode_id, e.episode_id]

    def _semantic_correction(
        self, batch: WriteBatch, patient_id: str, study_id: str, text: str, decision: str, now: float
    ) -> list[str]:
        pending = [s for s in batch.semantic if s.patient_id == patient_id]
        current: SemanticState | None = (
            pending[-1] if pending else next(iter(self.store.semantic_active(patient_id)), None)
        )
        if current is None:
            return []
        study_time = self._study_time(patient_id, study_id)
        impressions = [i for i in current.impressions if study_time is None or i.timestamp != study_time]
        when = study_time if study_time is not None else now
        impressions.append(Impression(when, text, decision))
        impressions.sort(key=lambda i: i.timestamp)
        new = SemanticState(
            new_id("S"),
            patient_id,
            current.category,
            tuple(impressions[-self.gm.settings.semantic_history :]),
            version=current.version + 1,
            created_at=now,
            supersedes=current.state_id,
            evidence_tier="critic",
        )
        batch.semantic.append(new)
        return [new.state_id, current.state_id]

    def _study_time(self, patient_id: str, study_id: str) -> float | None:
        for item in self.store.stm_list(patient_id=patient_id):
            if item.payload is not None and item.payload.study_id == study_id:
                return float(item.payload.timestamp)
        for e in self.store.get_episodes(self.store.record_ids("episodic", patient_id)):
            if e.study_id == study_id:
                return e.timestamp
        return None

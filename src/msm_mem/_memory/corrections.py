"""Corrections: a critic's verdict (for example the signed radiology report arriving later)
supersedes the agent's claim, semantic state, episodes and visual records of the study (and
the claim's findings) at the critic's evidence tier, in one audited transaction: the
self-improvement loop. What is superseded with the claim is :mod:`msm_mem._memory.propagation`."""

from __future__ import annotations

import json

from .. import _transitions as tr
from .._errors import InvalidInput, NotFound
from .._limits import MAX_TEXT_CHARS, check_id, check_text
from .._principal import Principal
from .._records import Impression, SemanticState, new_id
from .._storage.base import WriteBatch
from .._tier_records import Claim, StmState
from .claim_evidence import provenance
from .claims import link_findings, retire_findings
from .propagation import discard_held, supersede_study
from .ranking import decay_at
from .studies import study_time
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
        superseded at the critic's evidence tier, and so is every record derived from the
        judged answer (:mod:`msm_mem._memory.propagation`): the episode by the critic's copy,
        its visual record by a copy pointing at it, the study's other unverified episodes and
        visual records, the claim's relationships and orphaned finding entities; a held STM
        item is promoted with the verdict's text (forced past the gate) and the study's other
        held items are discarded. Only the critic and clinician roles may give a verdict."""
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
        known = provenance(old)
        when = known.time if known.time is not None else study_time(self.store, patient_id, study_id)
        prov: dict[str, object] = {**json.loads(old.source), "by": actor.id}
        if when is not None:
            prov["time"] = when
        # every record holding the judged answer is superseded at the critic's tier (propagation.py)
        done = supersede_study(
            self.store, turn.batch, patient_id, study_id, known.episode, text, decision, now, actor.id
        )
        ids = list(done.ids)
        if done.episode_id:  # a later verdict on this study judges the critic's copy
            prov["episode"] = done.episode_id
        item_id = known.stm
        if item_id and done.episode_id is None:
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
                    prov["episode"] = result.episode_id
                ids += [x for x in (result.episode_id, result.visual_id) if x]
        held = discard_held(self.store, turn.batch, patient_id, study_id, keep=item_id)
        if held:
            self.gm._check(turn, tr.STM_ACTIVE, tr.STM_DISCARDED, tr.Trigger.DISCARD)
            ids += held
        claim = Claim(
            new_id("C"),
            patient_id,
            old.key,
            text,
            json.dumps(prov),
            1.0,
            "critic",
            now,
            decay_at(now if when is None else when, 1.0, "critic", "claims"),
            supersedes=old.claim_id,
        )
        turn.batch.claims.append(claim)
        link_findings(self.store, turn.batch, claim)
        ids = [claim.claim_id, old.claim_id, *ids]
        ids += retire_findings(self.store, turn.batch, patient_id, old.claim_id)
        ids += self._semantic_correction(turn.batch, patient_id, study_id, text, decision, now, when)
        self.gm._event(turn, trigger.value, "ltm", "ltm", ids)
        self.gm.commit(turn)
        return claim

    def _semantic_correction(
        self,
        batch: WriteBatch,
        patient_id: str,
        study_id: str,
        text: str,
        decision: str,
        now: float,
        at: float | None,
    ) -> list[str]:
        pending = [s for s in batch.semantic if s.patient_id == patient_id]
        current: SemanticState | None = (
            pending[-1] if pending else next(iter(self.store.semantic_active(patient_id)), None)
        )
        if current is None:
            return []
        impressions = [i for i in current.impressions if at is None or i.timestamp != at]
        when = at if at is not None else now
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

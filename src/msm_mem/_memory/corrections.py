"""Corrections: a critic's verdict (for example the signed radiology report arriving later)
supersedes the agent's answer to one question about a study (its claim, its impression in the
semantic state, its episodes and visual records, the claim's findings) at the critic's
evidence tier, in one audited transaction: the self-improvement loop. What is superseded with
the claim is :mod:`msm_mem._memory.propagation`."""

from __future__ import annotations

import json
from dataclasses import dataclass

from .. import _transitions as tr
from .._errors import InvalidInput, NotFound
from .._limits import MAX_QUESTION_CHARS, MAX_TEXT_CHARS, check_id, check_text
from .._principal import Principal
from .._records import Impression, SemanticState, new_id
from .._storage.base import WriteBatch
from .._tier_records import Claim, StmItem, StmState
from .claim_evidence import (
    QUESTION_SEPARATOR,
    STUDY_PREFIX,
    Provenance,
    claim_key,
    provenance,
    question_key,
    question_of,
    study_of,
)
from .claims import link_findings, retire_findings
from .propagation import discard_held, supersede_study
from .studies import study_time
from .tiers import GovernedMemory

__all__ = ["Corrections"]


def claim_key_of(study_id: str, question: str) -> str:
    """The claim key of a question key ("": the study's key in a store of an earlier version)."""
    return f"{STUDY_PREFIX}{study_id}" + (f"{QUESTION_SEPARATOR}{question}" if question else "")


@dataclass
class _Judged:
    """The question a verdict judges (its key, "" for a claim naming none), its active claim
    and its newest held answer."""

    key: str
    claim: Claim | None = None
    held: StmItem | None = None


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
        question: str | None = None,
    ) -> Claim:
        """A critic's verdict on the agent's answer to one question about one study (for
        example the signed report): accept, or reject with a correction. ``question`` names the
        question judged; without it the study must hold answers to one question only (else
        :class:`InvalidInput` lists them). The judged answer is the newest the agent gave: a
        held short-term item of the question (the gate kept it out of long-term memory), else
        the question's active claim; :class:`NotFound` when there is neither.

        The question's claim (a new one when only a held answer existed) and the semantic
        state's impression of the answer are superseded at the critic's evidence tier, and so
        is every record derived from the judged answer (:mod:`msm_mem._memory.propagation`):
        the claim's episode by the critic's copy, its visual record by a copy pointing at it,
        the other unverified episodes of the same question and their visual records, the
        claim's relationships and orphaned finding entities; the held item is promoted with
        the verdict's text (forced past the gate) when no episode holds it, and the question's
        other held items are discarded. Answers to the study's other questions are left as
        they are. Only the critic and clinician roles may give a verdict."""
        check_id("study_id", study_id)
        correction = check_text("correction", correction, MAX_TEXT_CHARS)
        decision = check_text("decision", decision, MAX_TEXT_CHARS)
        if question is not None:
            question = check_text("question", question, MAX_QUESTION_CHARS, required=True)
        if not accept and not correction.strip():
            raise InvalidInput("a rejecting verdict needs the correction")
        turn = self.gm.begin(actor, patient_id)
        trigger = tr.Trigger.SUPERSEDE if accept else tr.Trigger.CRITIC_REJECT
        # any verdict, an acceptance too, lifts the claim to the critic's evidence tier: only the
        # roles that may reject may give one (checked before revealing whether the claim exists)
        self.gm._check(turn, tr.LTM_ACTIVE, tr.LTM_SUPERSEDED, tr.Trigger.CRITIC_REJECT)
        self.gm._check(turn, tr.LTM_ACTIVE, tr.LTM_SUPERSEDED, trigger)
        judged = self._judged(patient_id, study_id, question)
        old, item = judged.claim, judged.held
        judged_text = item.payload.answer if item is not None and item.payload is not None else None
        if judged_text is None:
            assert old is not None  # _judged found a claim or a held item
            judged_text = old.content
        text = judged_text if accept else correction
        now = self.gm.clock.now()
        known = provenance(old) if old is not None else Provenance()
        when = known.time if known.time is not None else study_time(self.store, patient_id, study_id)
        prov: dict[str, object] = {**json.loads(old.source)} if old is not None else {}
        prov["by"] = actor.id
        if when is not None:
            prov["time"] = when
        # every record holding the judged answer is superseded at the critic's tier (propagation.py)
        done = supersede_study(
            self.store,
            turn.batch,
            patient_id,
            study_id,
            known.episode,
            text,
            decision,
            now,
            actor.id,
            question=judged.key,
        )
        ids = list(done.ids)
        if done.episode_id:  # a later verdict on this study judges the critic's copy
            prov["episode"] = done.episode_id
        if item is None and old is not None and known.stm and not known.episode:
            # a claim written from a held answer (a store of an earlier version): its item
            active = self.store.stm_list(patient_id=patient_id, state=StmState.ACTIVE)
            item = next((i for i in active if i.item_id == known.stm), None)
        promoted = ""
        if item is not None and done.episode_id is None:
            # the critic's verdict is the outcome the held item waited for: it is promoted even
            # when the gate held it (a repeat image is never novel); the audit keeps "forced"
            result = self.gm.consolidate(
                turn,
                item,
                text,
                decision=decision,
                trigger=tr.Trigger.CRITIC_PROMOTE,
                evidence_tier="critic",
                confidence=1.0,
                source=actor.id,
                force=True,
                derive=False,
            )
            promoted = item.item_id
            prov["stm"] = item.item_id
            if result.episode_id:
                prov["episode"] = result.episode_id
            ids += [x for x in (result.episode_id, result.visual_id) if x]
        held = discard_held(self.store, turn.batch, patient_id, study_id, keep=promoted, question=judged.key)
        if held:
            self.gm._check(turn, tr.STM_ACTIVE, tr.STM_DISCARDED, tr.Trigger.DISCARD)
            ids += held
        key = (
            old.key if old is not None else claim_key(study_id, item.payload.question if item and item.payload else "")
        )
        claim = Claim(
            new_id("C"),
            patient_id,
            key,
            text,
            json.dumps(prov),
            1.0,
            "critic",
            now,
            None,  # decided at sweep time from the patient's last activity (ranking.decay_at)
            supersedes=old.claim_id if old is not None else None,
        )
        turn.batch.claims.append(claim)
        link_findings(self.store, turn.batch, claim)
        ids = [claim.claim_id, *([old.claim_id] if old is not None else []), *ids]
        if old is not None:
            ids += retire_findings(self.store, turn.batch, patient_id, old.claim_id)
        judged_texts = {judged_text, *done.answers}
        ids += self._semantic_correction(turn.batch, patient_id, judged_texts, text, decision, now, when)
        self.gm._event(turn, trigger.value, "ltm", "ltm", ids)
        self.gm.commit(turn)
        return claim

    def _judged(self, patient_id: str, study_id: str, question: str | None) -> _Judged:
        """The question a verdict judges, with its active claim and newest held item."""
        claims = [c for c in self.store.claims_active(patient_id) if study_of(c) == study_id]
        held = [
            i
            for i in self.store.stm_list(patient_id=patient_id, state=StmState.ACTIVE)
            if i.payload is not None and i.payload.study_id == study_id and i.payload.answer is not None
        ]
        by_key: dict[str, _Judged] = {}
        for c in claims:
            by_key.setdefault(question_of(c), _Judged(question_of(c))).claim = c
        for i in sorted(held, key=lambda i: (i.created_at, i.item_id)):
            assert i.payload is not None
            by_key.setdefault(question_key(i.payload.question), _Judged(question_key(i.payload.question))).held = i
        if question is not None:
            wanted = question_key(question)
            found = by_key.get(wanted)
            if found is None:  # a claim of a store of an earlier version names no question
                found = by_key.get("")
            if found is None:
                raise NotFound(f"no answer to that question about study {study_id!r} of this patient")
            return found
        if not by_key:
            raise NotFound(f"no active claim for study {study_id!r} of this patient")
        if len(by_key) > 1:
            keys = ", ".join(sorted(claim_key_of(study_id, k) for k in by_key))
            raise InvalidInput(
                f"study {study_id!r} holds answers to {len(by_key)} questions (claim keys {keys}): "
                "name the question judged"
            )
        return next(iter(by_key.values()))

    def _semantic_correction(
        self,
        batch: WriteBatch,
        patient_id: str,
        judged: set[str],
        text: str,
        decision: str,
        now: float,
        at: float | None,
    ) -> list[str]:
        """Supersede the semantic state: the impressions of the judged answers (``judged``, at
        the study's time ``at``) give way to the verdict's; other impressions of the study
        (answers to its other questions) stay."""
        pending = [s for s in batch.semantic if s.patient_id == patient_id]
        current: SemanticState | None = (
            pending[-1] if pending else next(iter(self.store.semantic_active(patient_id)), None)
        )
        if current is None:
            return []
        impressions = [i for i in current.impressions if not (i.timestamp == at and i.text in judged)]
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

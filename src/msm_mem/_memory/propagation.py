"""A critic's verdict reaches every record derived from the judged answer.

The answer to one question about a study lives in several records: its episode, the visual
record pointing at that episode, the question's claim (and the finding entities and
relationships derived from it), the semantic state's impression and, while the gate holds it,
a short-term item. A verdict (accepting or correcting) supersedes all of them at the critic's
evidence tier:

- the episode the claim names is superseded by the critic's copy (the corrected text, or the
  accepted one lifted to the critic's tier), and its visual record by a copy pointing at it;
- every other unverified episode of the same question about the study (an earlier answer of
  the agent) and its visual record are superseded too: nothing the agent said in answer to it
  stays active beside the verdict; verified records (ground truth, earlier verdicts) and the
  answers to the study's other questions are left as they are;
- held short-term items of the question other than the one the verdict promotes are
  discarded; the age sweep would otherwise consolidate the judged answer later.

A question is told by its key (:func:`~msm_mem._memory.claim_evidence.question_key`); the key
"" (a claim of a store of an earlier version, which named no question) stands for every
question about the study.

:mod:`msm_mem._memory.claims` retires the superseded claim's relationships and the entities
no active claim refers to any more; :mod:`msm_mem._memory.corrections` does the claim and the
semantic state.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .._records import EpisodicRecord, State, VisualRecord, new_id
from .._storage.base import StateChange, Store, WriteBatch
from .._tier_records import StmChange, StmState
from .claim_evidence import question_key
from .population import derived_from
from .ranking import verified

__all__ = ["Propagated", "discard_held", "supersede_study"]


@dataclass
class Propagated:
    """What a verdict superseded: the critic's episode (None when the study had no live episode
    the claim names), every id changed, new and old, and the answers the superseded episodes
    held."""

    episode_id: str | None = None
    ids: list[str] = field(default_factory=list)
    answers: set[str] = field(default_factory=set)


def _copy(e: EpisodicRecord, text: str, decision: str, now: float, critic: str) -> EpisodicRecord:
    return replace(
        e,
        episode_id=new_id("E"),
        answer=text,
        decision=decision or e.decision,
        state=State.ACTIVE,
        confidence=1.0,
        evidence_tier="critic",
        # the critic's text is no copy of population experience: the corrected copy is the critic's
        source=critic if derived_from(e.source) else e.source,
        created_at=now,
        decay_at=None,  # decided at sweep time from the patient's last activity (ranking.decay_at)
        supersedes=e.episode_id,
    )


def _visual_copy(v: VisualRecord, episode: EpisodicRecord, now: float) -> VisualRecord:
    return replace(
        v,
        visual_id=new_id("V"),
        source_episode_id=episode.episode_id,
        state=State.ACTIVE,
        confidence=1.0,
        evidence_tier="critic",
        source=episode.source,
        created_at=now,
        decay_at=None,
        supersedes=v.visual_id,
    )


def supersede_study(
    store: Store,
    batch: WriteBatch,
    patient_id: str,
    study_id: str,
    episode_id: str,
    text: str,
    decision: str,
    now: float,
    critic: str,
    *,
    question: str = "",
) -> Propagated:
    """Stage the supersession of the episodes and visual records of the answer to
    ``question`` (a question key; "" for every question) about the study (module docstring):
    ``episode_id`` is the episode the claim names ("" for none), ``text`` the verdict."""
    out = Propagated()
    episodes = [
        e
        for e in store.get_episodes(store.record_ids("episodic", patient_id))
        if e.state == State.ACTIVE
        and (
            e.episode_id == episode_id
            or (
                e.study_id == study_id
                and not verified(e.evidence_tier)
                and (not question or question_key(e.question) == question)
            )
        )
    ]
    fixed: EpisodicRecord | None = None
    for e in episodes:
        batch.changes.append(StateChange("episodic", e.episode_id, State.ACTIVE, State.SUPERSEDED))
        out.answers.add(e.answer)
        if e.episode_id == episode_id:
            fixed = _copy(e, text, decision, now, critic)
            batch.episodes.append(fixed)
            out.episode_id = fixed.episode_id
            out.ids.append(fixed.episode_id)
        out.ids.append(e.episode_id)
    gone = {e.episode_id for e in episodes}
    if gone:
        for v in store.get_visuals(store.record_ids("visual", patient_id)):
            if v.state != State.ACTIVE or v.source_episode_id not in gone:
                continue
            batch.changes.append(StateChange("visual", v.visual_id, State.ACTIVE, State.SUPERSEDED))
            if fixed is not None and v.source_episode_id == episode_id:
                copy = _visual_copy(v, fixed, now)
                batch.visuals.append(copy)
                out.ids.append(copy.visual_id)
            out.ids.append(v.visual_id)
    return out


def discard_held(
    store: Store, batch: WriteBatch, patient_id: str, study_id: str, keep: str, *, question: str = ""
) -> list[str]:
    """Stage the discarding of the held (answered) short-term items of ``question`` (a question
    key; "" for every question) about the study, other than ``keep``; returns their ids."""
    ids = []
    for item in store.stm_list(patient_id=patient_id, state=StmState.ACTIVE):
        info = item.payload
        if item.item_id == keep or info is None or info.study_id != study_id or info.answer is None:
            continue
        if question and question_key(info.question) != question:
            continue
        batch.stm_changes.append(StmChange(item.item_id, StmState.ACTIVE, StmState.DISCARDED, purge=True))
        ids.append(item.item_id)
    return ids

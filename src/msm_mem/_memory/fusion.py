"""Prompt fusion: ``Fuse(M_S, R_E, R_V, Q)`` into a structured, citable prompt (paper 2.3).

The prompt has labelled sections (patient history, study claims when there are any, similar
prior encounters, similar prior images, current question). Every evidence line starts with its
memory id in brackets, so an answer can cite it. When the text exceeds the budget
(characters), the lowest-ranked episodic, visual or claim line is dropped first, then the
oldest semantic impressions; the question is never dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from .._records import Claim, EpisodicRecord, Hit, SemanticState, VisualRecord

__all__ = ["FusedPrompt", "fuse"]


@dataclass(frozen=True, slots=True)
class FusedPrompt:
    """The prompt text, the memory ids it cites, and the ids dropped for the budget."""

    text: str
    included: tuple[str, ...]
    dropped: tuple[str, ...]


def _day(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _episode_line(hit: Hit) -> str:
    r = hit.record
    assert isinstance(r, EpisodicRecord)
    tail = f" | decision: {_one_line(r.decision)}" if r.decision else ""
    return (
        f"[{hit.id}] cos={hit.score:.3f} | {_day(r.timestamp)} | Q: {_one_line(r.question)}"
        f" | A: {_one_line(r.answer)}{tail}"
    )


def _visual_line(hit: Hit) -> str:
    r = hit.record
    assert isinstance(r, VisualRecord)
    tag = f" | tag: {_one_line(r.visual_tag)}" if r.visual_tag else ""
    src = f" | from {r.source_episode_id}" if r.source_episode_id else ""
    return f"[{hit.id}] cos={hit.score:.3f} | {_day(r.timestamp)}{tag}{src}"


def _claim_line(hit: Hit) -> str:
    r = hit.record
    assert isinstance(r, Claim)
    day = f" | {_day(hit.time)}" if hit.time is not None else ""
    return (
        f"[{hit.id}] cos={hit.score:.3f}{day} | {r.evidence_tier}, confidence {r.confidence:.2f}"
        f" | {_one_line(r.content)}"
    )


def _render(
    semantic: list[tuple[SemanticState, int]], epi: list[Hit], vis: list[Hit], question: str, claims: list[Hit]
) -> str:
    parts = ["## Patient history (semantic memory)"]
    shown = [(s, skip) for s, skip in semantic if len(s.impressions) > skip]
    if not shown:
        parts.append("(none)")
    for state, skip in shown:
        parts.append(f"[{state.state_id}] {state.category}:")
        for imp in state.impressions[skip:]:
            tail = f" (decision: {_one_line(imp.decision)})" if imp.decision else ""
            parts.append(f"  [{_day(imp.timestamp)}] {_one_line(imp.text)}{tail}")
    if claims:
        parts.append("## Study claims (one finding per study, with its evidence tier)")
        parts.extend(_claim_line(h) for h in claims)
    parts.append("## Similar prior encounters (episodic memory)")
    parts.extend([_episode_line(h) for h in epi] or ["(none)"])
    parts.append("## Similar prior images (visual memory)")
    parts.extend([_visual_line(h) for h in vis] or ["(none)"])
    parts.append("## Current question")
    parts.append(_one_line(question))
    return "\n".join(parts)


def fuse(
    semantic: list[SemanticState],
    episodic: list[Hit],
    visual: list[Hit],
    question: str,
    *,
    budget_chars: int = 6000,
    claims: list[Hit] | None = None,
) -> FusedPrompt:
    """Build the prompt; hits must be sorted by descending score within each list."""
    epi, vis, cla = list(episodic), list(visual), list(claims or ())
    sem = [(s, 0) for s in semantic]
    dropped: list[str] = []
    text = _render(sem, epi, vis, question, cla)
    while len(text) > budget_chars:
        if epi or vis or cla:
            # drop the lowest-ranked evidence line: visual first on ties (it carries less text),
            # then claims (their text repeats the study's episode)
            lists = [x for x in (vis, cla, epi) if x]
            dropped.append(min(lists, key=lambda x: x[-1].score).pop().id)
        else:
            # the oldest impression left over all categories (each history is oldest first)
            left = [i for i, (s, skip) in enumerate(sem) if len(s.impressions) > skip]
            if not left:
                break
            oldest = min(left, key=lambda i: sem[i][0].impressions[sem[i][1]].timestamp)
            state, skip = sem[oldest]
            sem[oldest] = (state, skip + 1)
            if skip + 1 == len(state.impressions):
                dropped.append(state.state_id)
        text = _render(sem, epi, vis, question, cla)
    included = [s.state_id for s, skip in sem if len(s.impressions) > skip]
    included += [h.id for h in cla] + [h.id for h in epi] + [h.id for h in vis]
    return FusedPrompt(text, tuple(included), tuple(dropped))

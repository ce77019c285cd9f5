"""The two tier walkthroughs of the three-tier design, built from real audit events of the store.

(a) ``question``: one question touching STM, LTM and the audit tier, five steps, replayed from
the latest ``ask`` turn in the events (consent, STM write, ranked reads, consolidation or
hold). (b) ``movement``: write, consolidate, supersede, decay, replayed from the latest STM
write, the consolidation of that item, the latest supersession and the latest decay run.

Frames carry only what the audit tier holds (ids, pseudonyms, tiers, times, hashes, reason
codes), so the same frames are shown to every role that may read the events. A step the
store has no event for yet says so and how to produce one: nothing is invented.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from pydantic import BaseModel

from .... import AuditEvent
from ..answers import FromRecord

__all__ = ["NAMES", "EventOut", "FrameOut", "WalkthroughOut", "build"]

#: the walkthroughs, by name
NAMES = ("question", "movement")
_RETENTION_S = 6 * 365.25 * 86400
_CONSOLIDATIONS = ("consolidate", "critic_promote", "age_threshold")
_SUPERSESSIONS = ("critic_reject", "supersede")


class EventOut(FromRecord):
    """One audit event as a walkthrough shows it (ids and pseudonyms only)."""

    seq: int
    time: float
    actor: str
    role: str
    purpose: str
    action: str
    source_tier: str
    target_tier: str
    record_ids: list[str]
    patient: str
    consent_id: str
    outcome: str
    reason: str
    prev_hash: str
    event_hash: str


class FrameOut(BaseModel):
    """One step: its title and caption, the parts lit (``agent``, ``stm``, ``ltm``, ``audit``),
    the audit events it rests on, and ``missing`` when the store has no such event yet."""

    step: int
    of: int
    title: str
    caption: str
    active: list[str]
    events: list[EventOut]
    missing: bool = False


class WalkthroughOut(BaseModel):
    """A walkthrough's frames; ``complete`` when every step rests on a real event."""

    name: str
    title: str
    complete: bool
    frames: list[FrameOut]


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))


def _span(seconds: float) -> str:
    hours = seconds / 3600
    return f"{hours / 24:g} days" if hours >= 48 else f"{hours:g} hours"


def _short(record_id: str) -> str:
    """An id as a caption shows it: its kind prefix and first hex digits (the events list the
    whole ids)."""
    return record_id if len(record_id) <= 12 else record_id[:12] + "..."


def _ids(ids: Sequence[str], most: int = 3) -> str:
    shown = ", ".join(_short(i) for i in ids[:most])
    return shown + (f" and {len(ids) - most} more" if len(ids) > most else "") if ids else "none"


def _kinds(ids: Sequence[str]) -> str:
    names = {"S": "semantic", "E": "episodic", "V": "visual", "C": "claim"}
    counts: dict[str, int] = {}
    for i in dict.fromkeys(ids):
        kind = names.get(i[:1], "other")
        counts[kind] = counts.get(kind, 0) + 1
    return ", ".join(f"{n} {k}" for k, n in counts.items()) or "no records"


def _turns(events: Sequence[AuditEvent]) -> list[list[AuditEvent]]:
    """The events cut into turns: each begins at a consent check and runs while the same actor
    acts on the same patient."""
    turns: list[list[AuditEvent]] = []
    for e in events:
        if e.action == "consent" or not turns:
            turns.append([e])
        elif e.actor == turns[-1][0].actor and e.patient == turns[-1][0].patient:
            turns[-1].append(e)
        else:
            turns.append([e])
    return turns


def _frame(step: int, title: str, caption: str, active: list[str], events: Sequence[AuditEvent]) -> FrameOut:
    return FrameOut(
        step=step,
        of=5,
        title=title,
        caption=caption,
        active=active,
        events=[EventOut.model_validate(e) for e in events],
    )


def _missing(step: int, title: str, what: str, how: str, active: list[str]) -> FrameOut:
    caption = f"This store has no {what} event yet: {how}."
    return FrameOut(step=step, of=5, title=title, caption=caption, active=active, events=[], missing=True)


def question(events: Sequence[AuditEvent], ttl_s: float) -> WalkthroughOut:
    """Walkthrough (a): the latest question (an ``ask`` turn) in ``events``."""
    title = "A single patient question, step by step"
    asks = [
        t
        for t in _turns(events)
        if t[0].action == "consent"
        and any(e.action == "write" for e in t)
        and any(e.action == "read" and e.source_tier == "ltm" for e in t)
        and not any(e.action == "context" for e in t)  # a context hands out a prompt: no answer
    ]
    if not asks:
        how = "ask a question (the Evidence view, or POST /v1/patients/{id}/ask)"
        frames = [
            _missing(i + 1, t, "question", how, a)
            for i, (t, a) in enumerate(
                [
                    ("The question lands at the agent", ["agent"]),
                    ("Short-term memory captures the working set", ["stm"]),
                    ("Long-term memory is consulted", ["ltm"]),
                    ("The audit tier records the access trail", ["audit"]),
                    ("Answer returned with its evidence trail", ["agent"]),
                ]
            )
        ]
        return WalkthroughOut(name="question", title=title, complete=False, frames=frames)
    turn = asks[-1]
    consent, write = turn[0], next(e for e in turn if e.action == "write")
    reads = [e for e in turn if e.action == "read" and e.source_tier == "ltm"]
    read_ids = [i for e in reads for i in e.record_ids]
    who = f"{consent.role} {consent.actor}"
    item = _short(write.record_ids[0]) if write.record_ids else "?"
    frames = [
        _frame(
            1,
            "The question lands at the agent",
            f"{who} asks about patient {consent.patient or '(none)'} for {consent.purpose}, at {_when(consent.time)}. "
            f"Consent is checked first (event #{consent.seq}: {consent.outcome}"
            f"{', consent ' + _short(consent.consent_id) if consent.consent_id else ''}). No memory tier has been "
            "touched yet.",
            ["agent"],
            [consent],
        ),
        _frame(
            2,
            "Short-term memory captures the working set",
            f"Event #{write.seq} writes STM item {item} in this patient's scope: the question, the image embedding, "
            f"the study. It is the agent's scratchpad for this turn and expires after {_span(ttl_s)}, "
            f"at {_when(write.time + ttl_s)}.",
            ["agent", "stm"],
            [write],
        ),
        _frame(
            3,
            "Long-term memory is consulted",
            f"{len(reads)} ranked reads (events #{reads[0].seq} to #{reads[-1].seq}) bring {_kinds(read_ids)} "
            "records into the working set, ranked by cosine x composite_k, where composite_k = confidence x "
            "freshness x evidence-tier weight.",
            ["stm", "ltm"],
            reads,
        ),
    ]
    frames.append(
        _frame(
            4,
            "The audit tier records the access trail",
            f"The turn's {len(turn)} events (#{turn[0].seq} to #{turn[-1].seq}) record WHO ({who}), WHAT (record "
            f"ids only), WHEN and under WHAT consent. Each names the hash of the one before it: event #{turn[-1].seq} "
            f"links {turn[-1].prev_hash[:12]}... to {turn[-1].event_hash[:12]}..., so any edit breaks the chain.",
            ["audit"],
            turn,
        )
    )
    done = [e for e in turn if e.action in _CONSOLIDATIONS or e.action == "hold"]
    updates = [e for e in turn if e.action == "semantic_update"]
    answered = [e for e in turn if e.action == "answer"]
    if done and done[0].action == "hold":
        outcome = f"The write-back gate held the interaction in STM ({done[0].reason or 'no reason'})."
    elif done:
        outcome = (
            f"The write-back gate consolidated it into long-term memory ({done[0].reason or 'no reason'}): "
            f"{_ids(done[0].record_ids[1:])}."
        )
    else:
        outcome = "The answer was not written back (write-back was off)."
    models = [i.removeprefix("model:") for e in answered for i in e.record_ids if i.startswith("model:")]
    if models:
        outcome = f"The model {models[0]} answered (event #{answered[0].seq}). {outcome}"
    if updates:
        outcome += f" The semantic state and the study's claim were superseded ({_ids(updates[0].record_ids)})."
    frames.append(
        _frame(
            5,
            "Answer returned with its evidence trail",
            f"{outcome} Each tier keeps its own lifetime: audit at least 6 years (until "
            f"{_when(consent.time + _RETENTION_S)}), STM until {_when(write.time + ttl_s)}, LTM until it decays.",
            ["agent", "stm", "ltm", "audit"],
            answered + done + updates,
        )
    )
    return WalkthroughOut(name="question", title=title, complete=True, frames=frames)


def movement(events: Sequence[AuditEvent], ttl_s: float, *, decay_visible: bool) -> WalkthroughOut:
    """Walkthrough (b): write, consolidate, supersede, decay, from the latest of each in ``events``.
    ``decay_visible`` is False for a caller that reads one patient's events: decayed records
    are anonymised, so their events name no patient."""
    title = "Data movement between the tiers, step by step"
    frames: list[FrameOut] = []
    writes = [e for e in events if e.action == "write" and e.target_tier == "stm"]
    consolidations = [e for e in events if e.action in _CONSOLIDATIONS]
    consolidated = {e.record_ids[0]: e for e in consolidations if e.record_ids}
    paired = [w for w in writes if w.record_ids and w.record_ids[0] in consolidated]
    write = paired[-1] if paired else (writes[-1] if writes else None)
    if write is None:
        how = "ask a question or observe an image"
        frames.append(_missing(1, "A new piece of evidence shows up", "STM write", how, ["agent"]))
        frames.append(_missing(2, "Write to STM", "STM write", how, ["stm"]))
    else:
        before = [e for e in events if e.seq < write.seq and e.action == "consent" and e.actor == write.actor]
        frames.append(
            _frame(
                1,
                "A new piece of evidence shows up",
                f"{write.role} {write.actor} brings an observation about patient {write.patient or '(none)'} at "
                f"{_when(write.time)}. Consent is checked; nothing has been written yet.",
                ["agent"],
                before[-1:],
            )
        )
        frames.append(
            _frame(
                2,
                "Write to STM",
                f"The working observation lands as STM item {_ids(write.record_ids)} with patient scope and a TTL of "
                f"{_span(ttl_s)} (until {_when(write.time + ttl_s)}). Audit event #{write.seq} is written in the same "
                "transaction; the PHI fields are envelope-encrypted at the storage boundary.",
                ["agent", "stm", "audit"],
                [write],
            )
        )
    found = consolidated.get(write.record_ids[0]) if write is not None and write.record_ids else None
    found = found or (consolidations[-1] if consolidations else None)
    if found is None:
        how = "consolidate an STM item, or ask with write-back on"
        frames.append(_missing(3, "STM to LTM consolidation", "consolidation", how, ["stm", "ltm"]))
    else:
        follow = [e for e in events if e.action == "semantic_update" and e.seq == found.seq + 1]
        frames.append(
            _frame(
                3,
                "STM to LTM consolidation",
                f"Event #{found.seq} ({found.action}, by {found.role} {found.actor}): item "
                f"{_ids(found.record_ids[:1])} graduates into durable long-term records "
                f"{_ids(found.record_ids[1:])}; gate: "
                f"{found.reason or 'no reason'}. Three triggers, one rule-set: an explicit consolidate, the age "
                "threshold, a critic's promote.",
                ["stm", "ltm", "audit"],
                [found, *follow],
            )
        )
    supersede = [e for e in events if e.action in _SUPERSESSIONS]
    if not supersede:
        how = "give a critic's correction (POST /v1/patients/{id}/studies/{study}/feedback)"
        frames.append(_missing(4, "Supersession", "supersession", how, ["ltm"]))
    else:
        s = supersede[-1]
        ids = s.record_ids
        pairs = [f"{_short(ids[i + 1])} -> {_short(ids[i])}" for i in range(0, len(ids) - 1, 2)]
        frames.append(
            _frame(
                4,
                "Supersession",
                f"Event #{s.seq}: {s.role} {s.actor} rejects the old version. Each new record names the one it "
                f"supersedes ({'; '.join(pairs[:3]) or 'no ids'}); the old ones flip Active to Superseded. "
                "Never an in-place rewrite.",
                ["ltm", "audit"],
                [s],
            )
        )
    expired = [e for e in events if e.action == "expire"]
    decayed = [e for e in events if e.action == "decay"]
    if not expired and not decayed:
        how = "run maintenance (msm-mem maintain, as the system role) after an STM item's TTL or an LTM decay_at"
        if not decay_visible:
            how += "; decay events name no patient, so only the audit roles see them"
        frames.append(_missing(5, "Decay", "expiry or decay", how, ["stm", "ltm", "audit"]))
    else:
        anonymised = sum(1 for e in decayed if e.reason == "anonymized")
        caption = (
            f"{len(expired)} STM items expired on their TTL; {len(decayed)} LTM records passed decay_at: {anonymised} "
            f"anonymised in place (ids stripped, content kept), {len(decayed) - anonymised} retracted. "
            if decay_visible
            else f"{len(expired)} STM items of this patient expired on their TTL. Decayed LTM records are anonymised, "
            "so their events name no patient: the audit roles see them. "
        )
        caption += "The audit chain captures every transition: auditors replay history without rewriting it."
        frames.append(_frame(5, "Decay", caption, ["stm", "ltm", "audit"], (expired + decayed)[-8:]))
    return WalkthroughOut(name="movement", title=title, complete=not any(f.missing for f in frames), frames=frames)


def build(name: str, events: Sequence[AuditEvent], ttl_s: float, *, decay_visible: bool) -> WalkthroughOut:
    """The walkthrough ``name`` (one of :data:`NAMES`) over ``events``."""
    if name == "question":
        return question(events, ttl_s)
    return movement(events, ttl_s, decay_visible=decay_visible)

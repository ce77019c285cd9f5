"""Claims as evidence: a patient's active study claims, scored against the query image.

A study claim (key ``study:<study_id>``, :mod:`msm_mem._memory.claims`) holds the latest
impression or verdict of one study with its confidence and evidence tier. It carries no vector
of its own: its cosine is the query's cosine with its study's image (the embedding of the
episode or short-term item its provenance names), and its clinical time is its study's time
(the provenance's ``time``, else that episode's or item's). A claim whose study has no
embedding left (its short-term item expired unconsolidated) cannot be scored and is left out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from .._records import Claim, Hit, Vector
from .._storage.base import Store

__all__ = ["STUDY_PREFIX", "Provenance", "claim_hits", "provenance", "study_of"]

#: how the key of a study claim begins
STUDY_PREFIX = "study:"


@dataclass(frozen=True, slots=True)
class Provenance:
    """What a study claim's ``source`` records: who said it (``by``), the short-term item and
    the episode it came from, and its study's clinical time (None in claims written before)."""

    by: str = ""
    stm: str = ""
    episode: str = ""
    time: float | None = None


def provenance(claim: Claim) -> Provenance:
    """The claim's provenance; empty fields when its source is not the JSON a claim keeps."""
    try:
        raw = json.loads(claim.source)
    except ValueError:
        return Provenance()
    if not isinstance(raw, dict):
        return Provenance()

    def text(name: str) -> str:
        v = raw.get(name, "")
        return v if isinstance(v, str) else ""

    t = raw.get("time")
    when = float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else None
    return Provenance(text("by"), text("stm"), text("episode"), when)


def study_of(claim: Claim) -> str:
    """The study id a study claim is about ("" for other keys)."""
    return claim.key[len(STUDY_PREFIX) :] if claim.key.startswith(STUDY_PREFIX) else ""


def claim_hits(store: Store, patient_id: str, z: Vector, k: int) -> tuple[Hit, ...]:
    """The patient's ``k`` active study claims most similar to ``z``, by descending cosine
    (ties: claim id), each with its study's clinical time."""
    claims = [c for c in store.claims_active(patient_id) if study_of(c)]
    if not claims or k <= 0:
        return ()
    provs = {c.claim_id: provenance(c) for c in claims}
    episodes = store.find_episodes([p.episode for p in provs.values() if p.episode])
    wanted = {p.stm for c, p in ((c, provs[c.claim_id]) for c in claims) if p.stm and p.episode not in episodes}
    items = {i.item_id: i for i in store.stm_list(patient_id=patient_id)} if wanted else {}
    hits: list[Hit] = []
    for c in claims:
        p = provs[c.claim_id]
        e, item = episodes.get(p.episode), items.get(p.stm)
        vector: Vector | None = e.z if e is not None else (item.z if item is not None else None)
        if vector is None:
            continue
        when = p.time
        if when is None:
            when = e.timestamp if e is not None else float(item.payload.timestamp) if item and item.payload else None
        hits.append(Hit(c.claim_id, "claim", float(np.dot(vector, z)), c, time=when))
    hits.sort(key=lambda h: (-h.score, h.id))
    return tuple(hits[:k])

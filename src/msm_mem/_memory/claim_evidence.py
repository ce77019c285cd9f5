"""Claims as evidence: a patient's active study claims, scored against the query image.

A study claim (:mod:`msm_mem._memory.claims`) holds the latest answer or verdict to one
question about one study, with its confidence and evidence tier. Its key is
``study:<study_id>|q:<question key>`` (:func:`claim_key`): the question key is the first 16
hex digits of the SHA-256 of the normalised question (casefolded under NFKC, its letters and
digits in any script joined by ``-``), so ``"Is the patient in the ICU?"`` and ``"is the
patient in the icu"`` share a key, answers to different questions about one study never
supersede each other, and a question's text never stands in clear in a key. Keys of
the form ``study:<study_id>`` (no question) are those of stores written before questions were
told apart; they are read as the study's answer to no particular question. It carries no vector
of its own: its cosine is the query's cosine with its study's image (the embedding of the
episode or short-term item its provenance names), and its clinical time is its study's time
(the provenance's ``time``, else that episode's or item's). A claim whose study has no
embedding left (its short-term item expired unconsolidated) cannot be scored and is left out.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from dataclasses import dataclass

import numpy as np

from .._records import Claim, Hit, Vector
from .._storage.base import Store
from .ranking import tie_key

__all__ = [
    "QUESTION_SEPARATOR",
    "STUDY_PREFIX",
    "Provenance",
    "claim_hits",
    "claim_key",
    "provenance",
    "question_key",
    "question_of",
    "study_of",
]

#: how the key of a study claim begins
STUDY_PREFIX = "study:"
#: what parts a study claim's key from its question key (a question key never holds ``|``)
QUESTION_SEPARATOR = "|q:"

_WORDS = re.compile(r"[^\W_]+")


def question_key(question: str) -> str:
    """The key of a question (module docstring): 16 lower-case hex digits."""
    words = _WORDS.findall(unicodedata.normalize("NFKC", question).casefold())
    return hashlib.sha256("-".join(words).encode("utf-8")).hexdigest()[:16]


def claim_key(study_id: str, question: str) -> str:
    """The key of the claim holding the answer to ``question`` about ``study_id``:
    ``study:<study_id>|q:<16 hex digits>``, the digits a hash of the question casefolded with
    its punctuation and spacing dropped (so ``"Any effusion?"`` and ``"any  effusion"`` share
    a key). Pass it to ``claim_history`` or ``show claims --key``."""
    return f"{STUDY_PREFIX}{study_id}{QUESTION_SEPARATOR}{question_key(question)}"


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
    if not claim.key.startswith(STUDY_PREFIX):
        return ""
    rest = claim.key[len(STUDY_PREFIX) :]
    study, sep, question = rest.rpartition(QUESTION_SEPARATOR)
    return study if sep and "|" not in question else rest


def question_of(claim: Claim) -> str:
    """The question key of a study claim ("" for a key that names no question)."""
    if not claim.key.startswith(STUDY_PREFIX):
        return ""
    _, sep, question = claim.key.rpartition(QUESTION_SEPARATOR)
    return question if sep and "|" not in question else ""


def claim_hits(store: Store, patient_id: str, z: Vector, k: int) -> tuple[Hit, ...]:
    """The patient's ``k`` active study claims most similar to ``z``, by descending cosine
    (ties: :func:`~.ranking.tie_key`, the newer study first), each with its study's clinical time."""
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
    hits.sort(key=lambda h: (-h.score, tie_key(h)))
    return tuple(hits[:k])

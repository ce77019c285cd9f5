"""Population experience: another patient's memory as it may reach an answer.

A hit of another patient (or an anonymised one) is used only as de-identified experience: the
copy handed on keeps its id, vector, scores and clinical content, drops the patient, study,
media path and source links, keeps the year of its time only, and has every free-text field
rewritten in the closed clinical vocabulary (:func:`msm_mem._governance.anonymise.for_population`:
any other word becomes its category, a number that is not a measurement ``[NUMBER]``); a
field of which less than half survives is withheld (left empty; the whole hit when it is the
answer), and a scanner then checks every field of the copy: a field that still shows an
identifier is withheld the same way (fail closed). The consent side (who
may use whose records as population experience) is the ``population`` data class of
:mod:`msm_mem._governance.consent`.

An answer derived from such experience names its sources: :func:`derived_source` is the
``source`` a write-back of that answer carries (``population:<id>,<id>...``, ids only), so that
shredding a source patient finds and removes every copy derived from its records
(:func:`derived_from`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime

from .._governance.anonymise import for_population
from .._governance.consent import POPULATION, evaluate
from .._governance.deid import find_identifiers
from .._records import EpisodicRecord, Hit, VisualRecord
from .._storage.base import Store
from .retrieval import Retrieval

__all__ = [
    "POPULATION_PREFIX",
    "consented",
    "deidentified",
    "deidentified_text",
    "derived_from",
    "derived_source",
]

#: how the ``source`` of a record written from population experience begins
POPULATION_PREFIX = "population:"


def deidentified_text(text: str) -> str | None:
    """``text`` in the clinical vocabulary; None (withheld) when too little of it survives or
    the scanner still finds an identifier in the result."""
    cleaned = for_population(text)
    return None if cleaned is None or find_identifiers(cleaned) else cleaned


def _year_start(t: float) -> float:
    """UTC seconds of 1 January of ``t``'s year: the year is all a copy keeps of its time."""
    return datetime(datetime.fromtimestamp(t, UTC).year, 1, 1, tzinfo=UTC).timestamp()


def _clean(answer: str, others: Sequence[str]) -> list[str] | None:
    """The answer and the other fields in the clinical vocabulary: None when the answer is
    withheld (the hit is not used); another field withheld is left empty."""
    said = deidentified_text(answer)
    if said is None:
        return None
    return [said, *(deidentified_text(v) or "" for v in others)]


def deidentified(hit: Hit) -> Hit | None:
    """The de-identified copy of an episodic or visual hit of another patient (see the module
    docstring), or None when it cannot be cleaned (or is semantic state, which is per patient)."""
    r = hit.record
    if isinstance(r, EpisodicRecord):
        texts = _clean(r.answer, [r.question, r.decision, r.media_description])
        if texts is None:
            return None
        a, q, d, md = texts
        copy: EpisodicRecord | VisualRecord = replace(
            r,
            patient_id="",
            question=q,
            answer=a,
            decision=d,
            media_description=md,
            media_path="",
            study_id="",
            timestamp=_year_start(r.timestamp),
        )
    elif isinstance(r, VisualRecord):
        tag = deidentified_text(r.visual_tag)
        if tag is None:
            return None
        copy = replace(
            r, patient_id="", visual_tag=tag, media_path="", source_episode_id="", timestamp=_year_start(r.timestamp)
        )
    else:
        return None
    return replace(hit, record=replace(copy, source="", supersedes=None))


def consented(
    store: Store, r: Retrieval, patient_id: str, actor: str, role: str, purpose: str, when: float
) -> Retrieval:
    """Keep the hits of ``patient_id`` as they are, and other patients' only where their own
    consent permits ``actor`` (``role``, ``purpose``) the class ``population``, each as its
    :func:`deidentified` copy; anonymised records have no patient and need no consent, but are
    cleaned the same way. The rest is never used."""
    allowed: dict[str, bool] = {"": True}

    def ok(pid: str) -> bool:
        if pid not in allowed:
            allowed[pid] = evaluate(
                store.consents(pid),
                patient=pid,
                actor=actor,
                role=role,
                purpose=purpose,
                classes=(POPULATION,),
                when=when,
            ).permitted
        return allowed[pid]

    def kept(hits: Sequence[Hit]) -> tuple[Hit, ...]:
        out: list[Hit] = []
        for h in hits:
            pid = getattr(h.record, "patient_id", "")
            if pid == patient_id:
                out.append(h)
            elif ok(pid) and (clean := deidentified(h)) is not None:
                out.append(clean)
        return tuple(out)

    return Retrieval(r.semantic, kept(r.episodic), kept(r.visual))


def derived_source(ids: Iterable[str]) -> str:
    """The ``source`` of an answer derived from the population records ``ids`` (in order, once)."""
    return POPULATION_PREFIX + ",".join(dict.fromkeys(i for i in ids if i))


def derived_from(source: str) -> frozenset[str]:
    """The record ids a ``source`` written by :func:`derived_source` names (empty otherwise)."""
    if not source.startswith(POPULATION_PREFIX):
        return frozenset()
    return frozenset(i for i in source[len(POPULATION_PREFIX) :].split(",") if i)

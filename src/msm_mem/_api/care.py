"""The clinical operations of :class:`~msm_mem.MsmMem`: ingest, ask, retrieve, observe,
consolidate and feedback. Each checks the principal's role, begins a consent-checked turn and
commits its writes with their audit events in one transaction."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from .._agent.agent import AgentAnswer, Evidence, Query
from .._agent.offline import IngestReport, ingest_rows
from .._agent.stored import StoredStudy, pixels, study_episode
from .._errors import IllegalTransition, InvalidInput, MsmMemError, NotFound
from .._limits import MAX_TEXT_CHARS, check_id, check_observation, check_query_time, check_text
from .._memory.corrections import Corrections
from .._memory.msm import WriteResult
from .._memory.studies import study_time
from .._principal import Principal
from .._records import EpisodicRecord, ManifestRow, SemanticState, VisualRecord
from .._storage.base import Store
from .._tier_records import Claim, StmItem, StmState
from .access import Operation
from .base import _Base, patient_turn, retrying

__all__ = ["Retrieved", "RetrievedItem"]


def _shown(record: object, patient_id: str) -> EpisodicRecord | VisualRecord | SemanticState | None:
    """What a retrieve shows of a ranked record: the patient's own record whole; population
    experience (another patient's de-identified copy, or an anonymised record) without its
    embedding, which would show the other patient's image; anything else nothing."""
    if not isinstance(record, EpisodicRecord | VisualRecord | SemanticState):
        return None
    if record.patient_id == patient_id:
        return record
    if record.patient_id == "" and isinstance(record, EpisodicRecord | VisualRecord):
        return replace(record, z=_NO_VECTOR)
    return None


_NO_VECTOR = np.zeros(0, dtype=np.float32)


@dataclass(frozen=True, slots=True)
class RetrievedItem:
    """One ranked piece of evidence and its record: the patient's own record; for population
    experience (another patient's record in a population-scope retrieval, or an anonymised
    one) its de-identified copy (clinical vocabulary, no ids, the year only) without its
    embedding; None for anything else (semantic state of another patient is never used)."""

    evidence: Evidence
    record: EpisodicRecord | VisualRecord | SemanticState | None


@dataclass(frozen=True, slots=True)
class Retrieved:
    """Evidence without an answer, ranked by ``cosine x composite_k`` (highest first)."""

    patient_id: str
    scope: Literal["patient", "population"]
    items: tuple[RetrievedItem, ...]

    @property
    def evidence(self) -> tuple[Evidence, ...]:
        return tuple(i.evidence for i in self.items)


class _Care(_Base):
    def ingest(self, principal: Principal, rows: Sequence[ManifestRow], *, progress: bool = False) -> IngestReport:
        """Encode and store manifest rows as base memory, as ``principal`` (system or clinician):
        consent-checked per patient, each batch one transaction with its audit events."""
        p = self._allow(principal, Operation.INGEST)
        return ingest_rows(p, self._gm, self._encoder, list(rows), progress=progress)

    def ask(
        self,
        /,  # self positional-only: **unknown takes any keyword (and MsmMem.ask is typed from these)
        principal: Principal,
        patient_id: str,
        image: object,
        question: str,
        *,
        image_study: str | None = None,
        timestamp: float | None = None,
        study_id: str = "",
        visual_tag: str = "",
        write_back: bool = True,
        use_sem: bool = True,
        use_epi: bool = True,
        use_vis: bool = True,
        **unknown: object,
    ) -> AgentAnswer:
        """Answer ``question`` about ``image`` (a path or a grayscale array) with the patient's
        memory: the online loop (consent, STM, ranked retrieval, fusion, backbone, write-back
        gate, audit) as ``principal`` (agent or clinician). Instead of an image (``None``),
        ``image_study`` names one of the patient's stored studies whose image file is used,
        read inside this call; the question is then about that study (``study_id`` defaults to
        it and may not name another). ``timestamp`` is the study's UTC time: by default the
        time memory holds for ``study_id`` (so an archived study is asked about at its own
        time, and freshness is that of its day), else now. ``use_*`` are ablation switches.
        An unknown option is :class:`InvalidInput` naming it."""
        if unknown:
            raise InvalidInput(
                f"unknown ask option(s) {sorted(unknown)}: use image_study, timestamp, study_id, "
                "visual_tag, write_back, use_sem, use_epi, use_vis"
            )
        p = self._allow(principal, Operation.ASK)
        study_id = _study_of(study_id, image_study)
        image = _one_image(image, image_study)
        query = Query(patient_id, image, question, timestamp=timestamp, study_id=study_id, visual_tag=visual_tag)  # type: ignore[arg-type]
        flags = {"write_back": write_back, "use_sem": use_sem, "use_epi": use_epi, "use_vis": use_vis}
        if not write_back:
            return self._agent.ask(p, query, **flags)
        with patient_turn(self._directory, self._store.store_id, patient_id):
            return retrying(lambda: self._agent.ask(p, query, **flags))

    def ask_many(
        self,
        principal: Principal,
        queries: Sequence[Query],
        *,
        write_back: bool = True,
        use_sem: bool = True,
        use_epi: bool = True,
        use_vis: bool = True,
    ) -> list[AgentAnswer]:
        """:meth:`ask` for each query in order, one turn each (each sees the ones before)."""
        p = self._allow(principal, Operation.ASK)
        flags = {"write_back": write_back, "use_sem": use_sem, "use_epi": use_epi, "use_vis": use_vis}
        return self._agent.ask_many(p, list(queries), **flags)

    def retrieve(
        self,
        principal: Principal,
        patient_id: str,
        image: object = None,
        *,
        image_study: str | None = None,
        scope: Literal["patient", "population"] = "patient",
        at: float | None = None,
        use_sem: bool = True,
        use_epi: bool = True,
        use_vis: bool = True,
    ) -> Retrieved:
        """The ranked evidence for ``image`` without an answer: the patient's semantic state,
        episodic and visual records (``scope="patient"``), or also other patients' consented
        and anonymised records (``"population"``: their de-identified copies, without
        embeddings).
        Instead of an image, ``image_study`` names one of the patient's stored studies: the
        query is the embedding stored with it (its active episode's, else its newest), read
        inside this call, so nothing is decoded or encoded again; NotFound when the patient has
        no such study. ``at`` is the query's clinical UTC time for freshness: by default the
        stored study's own time with ``image_study``, else now; a time more than
        :data:`~msm_mem._limits.MAX_CLOCK_SKEW_S` after now is :class:`InvalidInput`. Audited
        as one read."""
        p = self._allow(principal, Operation.RETRIEVE)
        if scope not in ("patient", "population"):
            raise InvalidInput(f"scope must be 'patient' or 'population', got {scope!r}")
        if at is not None:
            at = check_query_time("at", at, self._clock.now())
        image = _one_image(image, image_study)
        turn = self._gm.begin(p, patient_id)
        try:
            if isinstance(image, StoredStudy):
                episode = study_episode(self._store, patient_id, image.study_id)
                z = episode.z
                at = episode.timestamp if at is None else at
            else:
                z = self._agent.embed(image)
            ranked = self._gm.retrieve(turn, z, at=at, use_sem=use_sem, use_epi=use_epi, use_vis=use_vis, scope=scope)
        except MsmMemError as exc:
            self._gm.fail(turn, exc)
            raise
        self._gm.commit(turn)
        items = []
        for hit, sc in ranked.ranked:
            if isinstance(hit.record, Claim):  # not read here (use_claims is off): claims are evidence of ask
                continue
            tier = str(getattr(hit.record, "evidence_tier", ""))
            evidence = Evidence(hit.id, hit.kind, sc.rank, sc.cosine, sc.confidence, sc.freshness, sc.tier_weight, tier)
            items.append(RetrievedItem(evidence, _shown(hit.record, patient_id)))
        # already by descending score: rerank's order (rank_key), whose ties are never the random ids
        return Retrieved(patient_id, scope, tuple(items))

    def observe(
        self,
        principal: Principal,
        patient_id: str,
        image: object,
        question: str,
        *,
        image_study: str | None = None,
        timestamp: float | None = None,
        study_id: str = "",
        visual_tag: str = "",
    ) -> StmItem:
        """Write a working observation (image embedding and question) into the patient's
        short-term memory (TTL from the settings); returns the item. ``timestamp`` defaults as
        for :meth:`ask`. ``image_study`` instead
        of an image: as for :meth:`ask` (the observation is about that study). Audited."""
        p = self._allow(principal, Operation.OBSERVE)
        study_id = _study_of(study_id, image_study)
        question, study_id, visual_tag = check_observation(question, study_id=study_id, visual_tag=visual_tag)
        image = _one_image(image, image_study)
        turn = self._gm.begin(p, patient_id)
        try:
            img, media = pixels(self._store, patient_id, image, self._directory)
            if timestamp is None:  # a study memory already holds is observed at its own time
                timestamp = study_time(self._store, patient_id, study_id)
            item = self._gm.observe(
                turn,
                self._agent.embed(img),
                question,
                timestamp=timestamp,
                study_id=study_id,
                visual_tag=visual_tag,
                media_path=media,
            )
        except MsmMemError as exc:
            self._gm.fail(turn, exc)
            raise
        self._gm.commit(turn)
        return item

    def consolidate(
        self, principal: Principal, patient_id: str, item_id: str, answer: str, *, decision: str = ""
    ) -> WriteResult:
        """Move an active short-term item of the patient into long-term memory with its
        ``answer``, through the write-back gate (held items stay in STM); the semantic state
        and the study's claim are superseded. The seed's explicit consolidate. Audited.
        Concurrent writers of the patient wait for each other (as :meth:`ask` does); an item
        another writer consolidated meanwhile is IllegalTransition."""
        p = self._allow(principal, Operation.CONSOLIDATE)
        check_id("item_id", item_id)
        answer = check_text("answer", answer, MAX_TEXT_CHARS)
        decision = check_text("decision", decision, MAX_TEXT_CHARS)

        def once() -> WriteResult:
            turn = self._gm.begin(p, patient_id)
            try:
                item = _active_item(self._store, patient_id, item_id)
                result = self._gm.consolidate(turn, item, answer, decision=decision)
            except MsmMemError as exc:
                self._gm.fail(turn, exc)
                raise
            self._gm.commit(turn)
            return result

        with patient_turn(self._directory, self._store.store_id, patient_id):
            return retrying(once)

    def feedback(
        self,
        principal: Principal,
        patient_id: str,
        study_id: str,
        *,
        accept: bool,
        correction: str = "",
        decision: str = "",
        question: str | None = None,
    ) -> Claim:
        """A critic verdict on the agent's answer to one question about one study (for example
        the signed report), as ``principal`` (critic or clinician): accept, or reject with the
        ``correction``. ``question`` names the question judged (it may be left out when the
        study holds answers to one question only; else :class:`InvalidInput` lists them). The
        question's claim and the answer's impression in the semantic state are superseded at
        the critic's evidence tier, a consolidated episode by a corrected copy, a held answer
        promoted with the verdict; answers to the study's other questions are left as they
        are. Returns the new claim (key ``study:<study_id>|q:<question key>``)."""
        p = self._allow(principal, Operation.FEEDBACK)
        with patient_turn(self._directory, self._store.store_id, patient_id):
            return retrying(
                lambda: Corrections(self._gm).critic_verdict(
                    p, patient_id, study_id, accept=accept, correction=correction, decision=decision, question=question
                )
            )


def _active_item(store: Store, patient_id: str, item_id: str) -> StmItem:
    """The patient's active short-term item ``item_id``: NotFound when the patient has none of
    that id, IllegalTransition when it is no longer active (consolidated, discarded, expired)."""
    found = [i for i in store.stm_get([item_id]) if i.patient_id == patient_id]
    if not found:
        raise NotFound(f"no short-term item {item_id!r} for this patient")
    if found[0].state != StmState.ACTIVE:
        raise IllegalTransition(f"short-term item {item_id!r} is {found[0].state.value}, not active")
    return found[0]


def _one_image(image: object, image_study: object) -> object:
    """``image``, or the stored study ``image_study`` names; InvalidInput unless exactly one."""
    if (image is None) == (image_study is None):
        raise InvalidInput("give exactly one of image and image_study")
    if image_study is None:
        return image
    return StoredStudy(check_id("image_study", image_study))


def _study_of(study_id: str, image_study: str | None) -> str:
    """The study a question is about: ``study_id``, else the stored study whose image it asks
    about; InvalidInput when the two name different studies."""
    if image_study is None or image_study == "":
        return study_id  # checked with the observation
    check_id("image_study", image_study)
    if study_id not in ("", image_study):
        raise InvalidInput(
            f"study_id {study_id!r} differs from image_study {image_study!r}: a question about a "
            "stored study's image is about that study (leave study_id out)"
        )
    return str(image_study)

"""The memory for an agent that calls its own model: :meth:`context` hands out the fused prompt
the built-in backbones are given, :meth:`record_answer` writes back the answer the agent's model
gave, in one call each.

``context`` is the first half of :meth:`~msm_mem.MsmMem.ask`: the consent-checked turn, the
query observed into short-term memory, the retrieval policy's audited reads, the router and
:func:`~msm_mem._memory.fusion.fuse`; it returns the prompt, the ids it includes and drops, the
evidence trail with scores and the image, and the short-term item's id (``context_id``). The
``record_answer`` call is the second half: the answer goes through the write-back gate, the
semantic state and the question's claim are superseded, exactly as for ``ask``, and one audit
event (``answer``) names the short-term item, the model that answered and the evidence it used.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .._agent.agent import Evidence, Query
from .._agent.answer import ModelRef
from .._agent.stored import StoredStudy
from .._errors import InvalidInput, MsmMemError, NotFound
from .._limits import MAX_TEXT_CHARS, check_id, check_observation, check_text
from .._memory.gate import GateDecision
from .._memory.population import deidentified_text, derived_source
from .._principal import Principal
from .access import Operation
from .base import _Base, patient_turn, retrying
from .care import _active_item, _one_image, _study_of

__all__ = ["MAX_EVIDENCE_IDS", "FusedContext", "RecordedAnswer"]

MAX_EVIDENCE_IDS = 256
"""The most evidence ids one recorded answer may name."""


@dataclass(frozen=True, slots=True)
class FusedContext:
    """The paper's structured prompt for one question about one image, as an agent's own model
    should be given it.

    ``context_id`` is the short-term item holding the query (name it in
    :meth:`~msm_mem.MsmMem.record_answer` before ``expires_at``, UTC seconds); ``prompt`` the
    fused text (patient history, study claims, similar encounters and images, each evidence line
    starting with its id in brackets, then the question) within ``budget_chars`` characters;
    ``included`` the ids in the prompt, ``dropped`` those left out for the budget; ``evidence``
    the ranked evidence trail with its scores (population lines de-identified, as for ``ask``);
    ``image_study`` the stored study whose image it is ("" for an image given with the call) and
    ``study_id`` the study the question is about; ``image`` the query image (grayscale, values
    in [0, 1]; not in the JSON)."""

    context_id: str
    patient_id: str
    question: str
    prompt: str
    included: tuple[str, ...]
    dropped: tuple[str, ...]
    budget_chars: int
    evidence: tuple[Evidence, ...]
    study_id: str
    image_study: str
    expires_at: float
    image: npt.NDArray[np.float32] | None = None

    def to_json(self) -> dict[str, object]:
        """Everything but the image pixels (interfaces add the image as they carry images)."""
        return {
            "context_id": self.context_id,
            "patient_id": self.patient_id,
            "question": self.question,
            "prompt": self.prompt,
            "included": list(self.included),
            "dropped": list(self.dropped),
            "budget_chars": self.budget_chars,
            "evidence": [e.to_json() for e in self.evidence],
            "study_id": self.study_id,
            "image_study": self.image_study,
            "expires_at": self.expires_at,
        }


@dataclass(frozen=True, slots=True)
class RecordedAnswer:
    """What :meth:`~msm_mem.MsmMem.record_answer` did: the ``gate`` decision (``written``: in
    long-term memory as ``episode_id``; else held in short-term memory), the ``answer`` as
    stored (de-identified when it rests on other patients' experience, whose records
    ``source`` then names), the ``evidence`` ids it rests on and the ``model`` that gave it."""

    context_id: str
    gate: GateDecision
    episode_id: str | None
    answer: str
    source: str
    evidence: tuple[str, ...]
    model: ModelRef

    def to_json(self) -> dict[str, object]:
        return {
            "context_id": self.context_id,
            "gate": {"written": self.gate.written, "reasons": list(self.gate.reasons)},
            "episode_id": self.episode_id,
            "answer": self.answer,
            "source": self.source,
            "evidence": list(self.evidence),
            "model": self.model.to_json(),
        }


def model_ref(model: object) -> ModelRef:
    """``model`` as a :class:`ModelRef`: one, or a mapping with ``backbone`` (required),
    ``model`` and ``version``; InvalidInput otherwise."""
    if isinstance(model, ModelRef):
        return model
    if not isinstance(model, Mapping):
        raise InvalidInput(f"model must be a ModelRef or a mapping with backbone, model, version; got {model!r:.60}")
    if unknown := sorted(str(k) for k in model if k not in ("backbone", "model", "version")):
        raise InvalidInput(f"unknown model field(s) {unknown}: use backbone, model, version")
    if "backbone" not in model:
        raise InvalidInput("model needs its backbone (what produced the answer, e.g. openai)")
    return ModelRef(model["backbone"], model.get("model", ""), model.get("version", ""))


def _evidence_ids(evidence: object) -> tuple[str, ...]:
    if isinstance(evidence, str) or not isinstance(evidence, Sequence):
        raise InvalidInput("evidence must be a list of memory ids")
    if len(evidence) > MAX_EVIDENCE_IDS:
        raise InvalidInput(f"evidence names {len(evidence)} ids; at most {MAX_EVIDENCE_IDS}")
    return tuple(dict.fromkeys(check_id("evidence id", i) for i in evidence))


class _Context(_Base):
    def context(
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
        use_sem: bool = True,
        use_epi: bool = True,
        use_vis: bool = True,
    ) -> FusedContext:
        """The fused context of ``question`` about ``image`` (a path or a grayscale array) or the
        stored study ``image_study``, as ``principal`` (agent or clinician), for the agent's own
        model: :meth:`ask` up to the backbone. Arguments as for :meth:`ask`. Consent-checked;
        the reads and the short-term item are audited, and one ``context`` event names the item
        and the ids handed out. Answer with :meth:`record_answer`."""
        p = self._allow(principal, Operation.CONTEXT)
        study_id = _study_of(study_id, image_study)
        question, study_id, visual_tag = check_observation(question, study_id=study_id, visual_tag=visual_tag)
        image = _one_image(image, image_study)
        query = Query(patient_id, image, question, timestamp=timestamp, study_id=study_id, visual_tag=visual_tag)  # type: ignore[arg-type]
        turn = self._gm.begin(p, patient_id)
        try:
            prep = self._agent.prepare(turn, query, {"semantic": use_sem, "episodic": use_epi, "visual": use_vis})
            self._gm._event(turn, "context", "ltm", "source", [prep.item.item_id, *prep.prompt.included])
        except MsmMemError as exc:
            self._gm.fail(turn, exc)
            raise
        self._gm.commit(turn)
        return FusedContext(
            prep.item.item_id,
            patient_id,
            question,
            prep.prompt.text,
            prep.prompt.included,
            prep.prompt.dropped,
            prep.budget_chars,
            prep.evidence,
            study_id,
            image.study_id if isinstance(image, StoredStudy) else "",
            prep.item.expires_at,
            prep.request.image,
        )

    def record_answer(
        self,
        principal: Principal,
        patient_id: str,
        context_id: str,
        answer: str,
        *,
        model: ModelRef | Mapping[str, str],
        evidence: Sequence[str] = (),
        outcome: str = "",
    ) -> RecordedAnswer:
        """Write back the ``answer`` an agent's own ``model`` gave to the context ``context_id``
        (a :meth:`context`'s short-term item, still active), as ``principal`` (agent or
        clinician): the write-back gate and the supersession of the semantic state and of the
        question's claim, as :meth:`ask` writes back its answer. ``evidence`` lists the memory
        ids the answer rests on (each a record of this patient, or another patient's record
        the context offered: the answer is then de-identified and names them as its source);
        ``outcome`` is the decision taken, stored with the answer. One audit event (``answer``)
        names the item, the model and the evidence, in the transaction of the write. Concurrent
        writers of the patient wait for each other (as :meth:`ask` does)."""
        p = self._allow(principal, Operation.RECORD_ANSWER)
        check_id("context_id", context_id)
        given = check_text("answer", answer, MAX_TEXT_CHARS, required=True)
        given_outcome = check_text("outcome", outcome, MAX_TEXT_CHARS)
        ref = model_ref(model)
        ids = _evidence_ids(evidence)

        def once() -> RecordedAnswer:
            answer, outcome = given, given_outcome
            turn = self._gm.begin(p, patient_id)
            try:
                item = _active_item(self._store, patient_id, context_id)
                derived = self._population_evidence(patient_id, ids)
                source = "agent"
                if derived:  # an answer from other patients' experience: de-identified, its sources named
                    cleaned, decision = deidentified_text(answer), deidentified_text(outcome)
                    if cleaned is None or decision is None or not cleaned.strip():
                        raise InvalidInput("the answer rests on other patients' records and could not be de-identified")
                    answer, outcome, source = cleaned, decision, derived_source(derived)
                self._gm._event(turn, "answer", "stm", "stm", [item.item_id, ref.audit_id, *ids], reason="recorded")
                result = self._gm.consolidate(turn, item, answer, decision=outcome, source=source)
            except MsmMemError as exc:
                self._gm.fail(turn, exc)
                raise
            self._gm.commit(turn)
            return RecordedAnswer(context_id, result.gate, result.episode_id, answer, source, ids, ref)

        with patient_turn(self._directory, self._store.store_id, patient_id):
            return retrying(once)

    def _population_evidence(self, patient_id: str, ids: tuple[str, ...]) -> list[str]:
        """Which of ``ids`` are other patients' (or anonymised) episodes and visual records;
        InvalidInput for an id that names no record, or another patient's claim or state."""
        if not ids:
            return []
        owners: dict[str, str] = {i: r.patient_id for i, r in self._store.find_episodes(list(ids)).items()}
        own = {s.state_id for s in self._store.semantic_active(patient_id)}
        for i in ids:
            if i in owners or i in own:
                continue
            try:  # the store's lookups by id raise NotFound for an id they do not hold
                owners[i] = self._store.get_visuals([i])[0].patient_id
                continue
            except NotFound:
                pass
            try:
                if self._store.get_claims([i])[0].patient_id == patient_id:
                    own.add(i)
            except NotFound:
                pass
        unknown = [i for i in ids if i not in owners and i not in own]
        if unknown:
            raise InvalidInput(
                f"evidence id {unknown[0]!r} names no record of this patient or of the population: "
                "cite the ids the context included"
            )
        return [i for i in ids if i in owners and owners[i] != patient_id]

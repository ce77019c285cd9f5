"""The online loop (DESIGN.md section 2): one call per clinical query.

``ask(p, x, q)``: encode the image to ``z`` -> retrieve ``semantic.get(p)``,
``episodic.query(z, k, p)``, ``visual.query(z, k, p)`` -> fuse into a structured prompt ->
backbone -> answer with its evidence trail -> write-back gate -> consolidate or discard, and
update the semantic state, in one transaction.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .._errors import InvalidInput, NotFound
from .._records import EpisodicRecord, VisualRecord
from ..memory.fusion import fuse
from ..memory.gate import GateDecision
from ..memory.msm import Interaction, Memory
from ..memory.retrieval import Retrieval
from ..plugins.backbones.base import Backbone, BackboneRequest, Candidate
from ..plugins.backbones.nonparametric import NonparametricBackbone
from ..plugins.encoders.base import Encoder
from ..plugins.images import load_image

__all__ = ["AgentAnswer", "Evidence", "MemoryAgent", "Query"]


@dataclass(frozen=True, slots=True)
class Evidence:
    """One line of the evidence trail: memory id, kind and retrieval score (cosine in [-1, 1])."""

    id: str
    kind: str
    score: float


@dataclass(frozen=True, slots=True)
class Query:
    """One clinical query: patient, image (path or grayscale array), question, UTC time."""

    patient_id: str
    image: str | os.PathLike[str] | npt.NDArray[np.float32]
    question: str
    timestamp: float | None = None
    study_id: str = ""
    visual_tag: str = ""


@dataclass(frozen=True, slots=True)
class AgentAnswer:
    """The answer, its evidence trail, the gate decision (None when write-back is off)."""

    answer: str
    evidence: tuple[Evidence, ...]
    gate: GateDecision | None
    prompt: str
    backbone: str
    source: str
    decision: str = ""

    def to_json(self) -> dict[str, object]:
        """The documented JSON shape: ``answer``, ``evidence`` [{id, kind, score}], ``gate``."""
        gate = {"written": self.gate.written, "reasons": list(self.gate.reasons)} if self.gate else None
        return {
            "answer": self.answer,
            "evidence": [{"id": e.id, "kind": e.kind, "score": round(e.score, 6)} for e in self.evidence],
            "gate": gate,
            "backbone": self.backbone,
            "source": self.source,
        }


class MemoryAgent:
    """Memory-conditioned inference over a :class:`Memory` with an encoder and a backbone."""

    def __init__(self, memory: Memory, encoder: Encoder, backbone: Backbone | None = None) -> None:
        if encoder.dim != memory.store.dim:
            raise InvalidInput(f"encoder {encoder.name} is {encoder.dim}-d; the store is {memory.store.dim}-d")
        self.memory = memory
        self.encoder = encoder
        self.backbone = backbone or NonparametricBackbone()

    def _image(self, image: object) -> npt.NDArray[np.float32]:
        if isinstance(image, np.ndarray):
            return image.astype(np.float32, copy=False)
        if isinstance(image, (str, os.PathLike)):
            return load_image(image)
        raise InvalidInput(f"image must be a path or an array, got {type(image).__name__}")

    def _candidates(self, retrieval: Retrieval) -> tuple[Candidate, ...]:
        out: list[Candidate] = []
        for s in retrieval.semantic:
            if s.last is not None:
                out.append(Candidate(s.state_id, "semantic", s.last.text, s.last.decision, 0.0, s.last.timestamp))
        for h in retrieval.episodic:
            r = h.record
            assert isinstance(r, EpisodicRecord)
            out.append(Candidate(h.id, "episodic", r.answer, r.decision, h.score, r.timestamp))
        visuals = [h for h in retrieval.visual if isinstance(h.record, VisualRecord) and h.record.source_episode_id]
        sources = self._episodes([h.record.source_episode_id for h in visuals])  # type: ignore[union-attr]
        for h in visuals:
            src = sources.get(h.record.source_episode_id)  # type: ignore[union-attr]
            if src is not None:
                out.append(Candidate(h.id, "visual", src.answer, src.decision, h.score, src.timestamp))
        return tuple(out)

    def _episodes(self, ids: Sequence[str]) -> dict[str, EpisodicRecord]:
        found: dict[str, EpisodicRecord] = {}
        for i in dict.fromkeys(ids):
            try:
                found[i] = self.memory.store.get_episodes([i])[0]
            except NotFound:  # a source episode may have been anonymised under a new id
                continue
        return found

    def ask(self, query: Query, *, use_sem: bool = True, use_epi: bool = True, use_vis: bool = True,
            write_back: bool = True) -> AgentAnswer:  # fmt: skip
        """Answer one query; nothing is written when any step before the final write fails."""
        return self.ask_many([query], use_sem=use_sem, use_epi=use_epi, use_vis=use_vis, write_back=write_back)[0]

    def ask_many(self, queries: Sequence[Query], *, use_sem: bool = True, use_epi: bool = True,
                 use_vis: bool = True, write_back: bool = True) -> list[AgentAnswer]:  # fmt: skip
        """Answer queries in order, each seeing the write-backs of the ones before it."""
        answers = []
        for q in queries:
            if not isinstance(q.question, str) or not q.question.strip():
                raise InvalidInput("question must not be empty")
            if not isinstance(q.patient_id, str) or not q.patient_id.strip():
                raise InvalidInput("patient_id must not be empty")
            img = self._image(q.image)
            z = self.encoder.encode([img])[0]
            retrieval = self.memory.retrieve(q.patient_id, z, use_sem=use_sem, use_epi=use_epi, use_vis=use_vis)
            answers.append(self._answer(q, z, img, retrieval, use_epi or use_vis, write_back))
        return answers

    def _answer(self, q: Query, z: npt.NDArray[np.float32], img: npt.NDArray[np.float32],
                retrieval: Retrieval, population: bool, write_back: bool) -> AgentAnswer:  # fmt: skip
        settings = self.memory.settings
        prompt = fuse(list(retrieval.semantic), list(retrieval.episodic), list(retrieval.visual),
                      q.question, budget_chars=settings.prompt_budget_chars)  # fmt: skip
        candidates = self._candidates(retrieval)
        prior: tuple[Candidate, ...] = ()
        if not candidates and population:
            prior = self._candidates(self.memory.retrieve(q.patient_id, z, use_sem=False, scope="population"))
        reply = self.backbone.generate(
            BackboneRequest(prompt=prompt.text, question=q.question, candidates=candidates, prior=prior, image=img)
        )
        evidence = tuple(Evidence(h.id, h.kind, h.score) for h in retrieval.evidence())
        gate = None
        if write_back:
            ts = self.memory.clock.now() if q.timestamp is None else q.timestamp
            result = self.memory.write_back(Interaction(
                patient_id=q.patient_id, z=z, question=q.question, answer=reply.answer, timestamp=ts,
                decision=reply.decision, media_path=str(q.image) if not isinstance(q.image, np.ndarray) else "",
                visual_tag=q.visual_tag, study_id=q.study_id))  # fmt: skip
            gate = result.gate
        return AgentAnswer(reply.answer, evidence, gate, prompt.text, self.backbone.name, reply.source, reply.decision)


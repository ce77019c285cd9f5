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

from .._errors import InvalidInput, MsmMemError, NotFound
from .._records import EpisodicRecord, Hit, SemanticState, VisualRecord
from ..memory.fusion import fuse
from ..memory.gate import GateDecision
from ..memory.ranking import Score
from ..memory.tiers import Actor, GovernedMemory
from ..plugins.backbones.base import Backbone, BackboneRequest, Candidate
from ..plugins.backbones.nonparametric import NonparametricBackbone
from ..plugins.encoders.base import Encoder
from ..plugins.images import load_image

__all__ = ["AgentAnswer", "Evidence", "MemoryAgent", "Query"]


@dataclass(frozen=True, slots=True)
class Evidence:
    """One line of the evidence trail.

    ``score`` is the ranking score ``cosine x composite_k`` (1.0 x composite for semantic
    state); the factors are kept: ``cosine`` in [-1, 1], ``confidence``, ``freshness`` and
    ``tier_weight`` in [0, 1].
    """

    id: str
    kind: str
    score: float
    cosine: float = 1.0
    confidence: float = 1.0
    freshness: float = 1.0
    tier_weight: float = 1.0

    def to_json(self) -> dict[str, object]:
        return {"id": self.id, "kind": self.kind, "score": round(self.score, 6), "cosine": round(self.cosine, 6),
                "confidence": round(self.confidence, 6), "freshness": round(self.freshness, 6),
                "tier_weight": round(self.tier_weight, 6)}  # fmt: skip


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
        """The documented JSON shape: ``answer``, ``evidence`` [{id, kind, score, factors...}],
        ``gate`` {written, reasons}, plus ``backbone`` and ``source``."""
        gate = {"written": self.gate.written, "reasons": list(self.gate.reasons)} if self.gate else None
        return {"answer": self.answer, "evidence": [e.to_json() for e in self.evidence], "gate": gate,
                "backbone": self.backbone, "source": self.source, "decision": self.decision}  # fmt: skip


AGENT = Actor("msm-mem-agent", "agent")


class MemoryAgent:
    """Memory-conditioned inference with consent, STM, ranked reads, gate and audit."""

    def __init__(self, gm: GovernedMemory, encoder: Encoder, backbone: Backbone | None = None, *,
                 actor: Actor = AGENT, purpose: str = "treatment") -> None:  # fmt: skip
        if encoder.dim != gm.store.dim:
            raise InvalidInput(f"encoder {encoder.name} is {encoder.dim}-d; the store is {gm.store.dim}-d")
        self.gm = gm
        self.memory = gm.memory
        self.encoder = encoder
        self.backbone = backbone or NonparametricBackbone()
        self.actor = actor
        self.purpose = purpose

    def _image(self, image: object) -> npt.NDArray[np.float32]:
        if isinstance(image, np.ndarray):
            return image.astype(np.float32, copy=False)
        if isinstance(image, (str, os.PathLike)):
            return load_image(image)
        raise InvalidInput(f"image must be a path or an array, got {type(image).__name__}")

    def _candidates(self, ranked: Sequence[tuple[Hit, Score]]) -> tuple[Candidate, ...]:
        out: list[Candidate] = []
        visuals = [h for h, _ in ranked if isinstance(h.record, VisualRecord) and h.record.source_episode_id]
        sources = self._episodes([h.record.source_episode_id for h in visuals], ranked)  # type: ignore[union-attr]
        for h, sc in ranked:
            r = h.record
            if isinstance(r, SemanticState):
                if r.last is not None:
                    out.append(Candidate(h.id, "semantic", r.last.text, r.last.decision, 0.0, r.last.timestamp))
            elif isinstance(r, EpisodicRecord):
                out.append(Candidate(h.id, "episodic", r.answer, r.decision, max(sc.rank, 0.0), r.timestamp))
            elif isinstance(r, VisualRecord) and (src := sources.get(r.source_episode_id)) is not None:
                out.append(Candidate(h.id, "visual", src.answer, src.decision, max(sc.rank, 0.0), src.timestamp))
        return tuple(out)

    def _episodes(self, ids: Sequence[str], known: Sequence[tuple[Hit, Score]]) -> dict[str, EpisodicRecord]:
        found = {h.id: h.record for h, _ in known if isinstance(h.record, EpisodicRecord)}
        missing = [i for i in dict.fromkeys(ids) if i not in found]
        if missing:
            found.update(self.memory.store.find_episodes(missing))  # anonymised sources are absent
        return found

    def ask(self, query: Query, *, use_sem: bool = True, use_epi: bool = True, use_vis: bool = True,
            write_back: bool = True) -> AgentAnswer:  # fmt: skip
        """Answer one query. A failure (unreadable image, backbone error) raises after auditing
        the reads that happened; nothing else is written."""
        if not isinstance(query.question, str) or not query.question.strip():
            raise InvalidInput("question must not be empty")
        turn = self.gm.begin(self.actor, query.patient_id, self.purpose)
        try:
            img = self._image(query.image)
            z = self.encoder.encode([img])[0]
            at = self.gm.clock.now() if query.timestamp is None else query.timestamp
            media = "" if isinstance(query.image, np.ndarray) else str(query.image)
            item = self.gm.observe(turn, z, query.question, timestamp=at, media_path=media,
                                   visual_tag=query.visual_tag, study_id=query.study_id)  # fmt: skip
            ranked = self.gm.retrieve(turn, z, at=at, use_sem=use_sem, use_epi=use_epi, use_vis=use_vis)
            r = ranked.retrieval
            prompt = fuse(list(r.semantic), list(r.episodic), list(r.visual), query.question,
                          budget_chars=self.memory.settings.prompt_budget_chars)  # fmt: skip
            candidates = self._candidates(ranked.ranked)
            prior: tuple[Candidate, ...] = ()
            if not candidates and (use_epi or use_vis):
                # population prior: nearest studies of other patients (audited as reads like any other)
                pop = self.gm.retrieve(turn, z, at=at, use_sem=False, scope="population")
                prior = self._candidates(pop.ranked)
            reply = self.backbone.generate(BackboneRequest(prompt=prompt.text, question=query.question,
                                                           candidates=candidates, prior=prior, image=img))  # fmt: skip
            gate = None
            if write_back:
                gate = self.gm.consolidate(turn, item, reply.answer, decision=reply.decision).gate
            self.gm.commit(turn)
        except MsmMemError as exc:
            if turn.audit:
                self.gm.fail(turn, exc)
            raise
        evidence = tuple(Evidence(h.id, h.kind, sc.rank, sc.cosine, sc.confidence, sc.freshness, sc.tier_weight)
                         for h, sc in ranked.ranked)  # fmt: skip
        return AgentAnswer(reply.answer, evidence, gate, prompt.text, self.backbone.name, reply.source, reply.decision)

    def ask_many(self, queries: Sequence[Query], **flags: bool) -> list[AgentAnswer]:
        """Answer queries in order, each seeing the write-backs of the ones before it."""
        return [self.ask(q, **flags) for q in queries]

"""The online loop (DESIGN.md section 2): one call per clinical query.

``ask(p, x, q)``: encode the image to ``z`` -> retrieval policy loop: the policy names a
memory and a sub-query (scope, k) per step, each step one audited read (``semantic.get(p)``,
``episodic.query(z, k, p)``, ``visual.query(z, k, p)``, or a population-scope read), until
STOP or ``max_steps`` -> hits merged and deduplicated by id -> router: one weight per expert
(S, E, V) from the retrieval features, scaling each expert's candidates (0: expert off) ->
fuse into a structured prompt -> backbone -> answer with its evidence trail -> write-back
gate -> consolidate or discard, and update the semantic state, in one transaction.

The ablation flags (``use_sem``, ``use_epi``, ``use_vis``) are hard overrides: a memory whose
flag is False is never read, whatever the policy asks, and its expert weight is 0 whatever the
router says. The patient's own hits are the evidence (prompt, candidates, evidence trail);
other patients' and anonymised hits (population steps) are the population prior: they arrive
de-identified and consented (:mod:`msm_mem._memory.population`), reach the backbone as
de-identified text only, and are listed in the evidence trail as ``population-episodic`` /
``population-visual`` whenever the backbone was given them. An answer the backbone derived from
them (it cites them, or says ``population-prior``) is the agent's answer: it is returned and
written back scrubbed, with ``source`` naming the population records it came from, so that
shredding their patient removes it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt

from .._errors import BackendError, InvalidInput, MsmMemError
from .._limits import check_observation
from .._memory.claim_evidence import question_key, question_of, study_of
from .._memory.fusion import FusedPrompt, fuse
from .._memory.population import deidentified_text, derived_source
from .._memory.ranking import Score, rank_key, verified_first
from .._memory.studies import study_time
from .._memory.tiers import GovernedMemory, Turn
from .._principal import Principal
from .._records import Claim, EpisodicRecord, Hit, SemanticState, State, VisualRecord
from .._tier_records import StmItem
from ..plugins.backbones.base import Backbone, BackboneRequest, Candidate
from ..plugins.backbones.nonparametric import NonparametricBackbone
from ..plugins.encoders.base import Encoder
from .answer import AgentAnswer, Evidence, ModelRef, Query
from .policy import MEMORIES, HeuristicPolicy, MemoryName, PolicyQuery, RetrievalPolicy, RetrievalStep, Step
from .replies import checked as _checked
from .replies import scrubbed as _scrubbed
from .router import ROUTER_FILE, ExpertWeights, FixedRouter, LearnedRouter, Router, RouterFeatures, features_from
from .stored import pixels

__all__ = ["AgentAnswer", "Evidence", "MemoryAgent", "Prepared", "Query"]


@dataclass(frozen=True, slots=True)
class Prepared:
    """What :meth:`MemoryAgent.prepare` made of a query: the STM item observed, the backbone's
    request (fused prompt, candidates, prior, image), the fused prompt with its included and
    dropped ids, the character budget it was fused under, the evidence trail (with ``studies``
    aligned to it), and the policy's steps, the expert weights, the router's features and the
    candidates before the router."""

    item: StmItem
    request: BackboneRequest
    prompt: FusedPrompt
    budget_chars: int
    evidence: tuple[Evidence, ...]
    studies: tuple[str, ...]
    steps: tuple[RetrievalStep, ...]
    weights: ExpertWeights
    features: RouterFeatures
    raw: tuple[Candidate, ...]


@dataclass
class _Gathered:
    """Hits of all steps, deduplicated by id: the patient's own (in prompt order per memory)
    and the population prior."""

    steps: list[RetrievalStep] = field(default_factory=list)
    own: list[tuple[Hit, Score]] = field(default_factory=list)
    prior: list[tuple[Hit, Score]] = field(default_factory=list)
    semantic: list[SemanticState] = field(default_factory=list)
    episodic: list[Hit] = field(default_factory=list)
    visual: list[Hit] = field(default_factory=list)
    claims: list[Hit] = field(default_factory=list)


def _owner(hit: Hit) -> str:
    return hit.record.patient_id


def _expert(kind: str) -> MemoryName:
    """The memory expert a kind of evidence belongs to: claims are read with semantic memory."""
    return "semantic" if kind == "claim" else kind  # type: ignore[return-value]  # episodic or visual


def _tier(hit: Hit) -> str:
    """The evidence tier of a hit's record ("" when it has none)."""
    return str(getattr(hit.record, "evidence_tier", ""))


class MemoryAgent:
    """Memory-conditioned inference with consent, STM, a retrieval policy, a router over the
    memory experts, ranked and audited reads, the write-back gate and audit.

    ``policy`` defaults to :class:`HeuristicPolicy`; ``router`` defaults to the learned router
    saved as ``router.json`` in the store directory when there is one (a malformed file raises
    :class:`InvalidInput`), else :class:`FixedRouter` (weights 1, 1, 1). ``max_steps`` (>= 1)
    bounds the policy's steps per query, refused ones included.
    """

    def __init__(
        self,
        gm: GovernedMemory,
        encoder: Encoder,
        backbone: Backbone | None = None,
        *,
        policy: RetrievalPolicy | None = None,
        router: Router | None = None,
        max_steps: int = 4,
        directory: str | os.PathLike[str] | None = None,
    ) -> None:
        if encoder.dim != gm.store.dim:
            raise InvalidInput(f"encoder {encoder.name} is {encoder.dim}-d; the store is {gm.store.dim}-d")
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            raise InvalidInput(f"max_steps must be a positive integer, got {max_steps!r}")
        self.gm = gm
        #: where router.json lives: the memory directory (default: the embedded store's own)
        self.directory = directory if directory is not None else getattr(gm.store, "directory", None)
        self.memory = gm.memory
        self.encoder = encoder
        self.backbone = backbone or NonparametricBackbone()
        self.policy: RetrievalPolicy = policy if policy is not None else HeuristicPolicy()
        self.router: Router = router if router is not None else self._stored_router()
        self.max_steps = max_steps

    def _router_path(self) -> Path | None:
        directory = self.directory
        return Path(directory) / ROUTER_FILE if isinstance(directory, (str, os.PathLike)) else None

    def _stored_router(self) -> Router:
        path = self._router_path()
        return LearnedRouter.load(path) if path is not None and path.is_file() else FixedRouter()

    def install_router(self, router: LearnedRouter) -> Path:
        """Use ``router`` from now on and save it as ``router.json`` in the store directory
        (returned); raises :class:`InvalidInput` for a store without a directory."""
        path = self._router_path()
        if path is None:
            raise InvalidInput("this store has no directory to save a router in; pass router= instead")
        router.save(path)
        self.router = router
        return path

    def embed(self, image: object, patient_id: str = "") -> npt.NDArray[np.float32]:
        """The unit embedding of one image: a path, a grayscale array, or a stored study of
        ``patient_id`` (:class:`~.stored.StoredStudy`)."""
        img, _ = pixels(self.memory.store, patient_id, image, self.directory)
        return np.asarray(self.encoder.encode([img])[0], dtype=np.float32)

    def _candidates(self, ranked: Sequence[tuple[Hit, Score]], *, population: bool = False) -> tuple[Candidate, ...]:
        """The backbone's candidates; with ``population`` every text is de-identified and a
        candidate whose text cannot be cleaned is left out."""
        if population:
            cleaned = []
            for c in self._candidates(ranked):
                text, decision = deidentified_text(c.text), deidentified_text(c.decision)
                if text is not None and decision is not None:
                    cleaned.append(replace(c, text=text, decision=decision))
            return tuple(cleaned)
        out: list[Candidate] = []
        visuals = [h for h, _ in ranked if isinstance(h.record, VisualRecord) and h.record.source_episode_id]
        sources = self._episodes([h.record.source_episode_id for h in visuals])  # type: ignore[union-attr]
        for h, sc in ranked:
            r, weight, tier = h.record, max(sc.rank, 0.0), sc.tier_weight
            if isinstance(r, SemanticState):
                if r.last is not None:
                    out.append(
                        Candidate(h.id, "semantic", r.last.text, r.last.decision, weight, r.last.timestamp, tier)
                    )
            elif isinstance(r, EpisodicRecord):
                q = question_key(r.question)
                out.append(Candidate(h.id, "episodic", r.answer, r.decision, weight, r.timestamp, tier, q))
            elif isinstance(r, VisualRecord) and (src := sources.get(r.source_episode_id)) is not None:
                q = question_key(src.question)
                out.append(Candidate(h.id, "visual", src.answer, src.decision, weight, src.timestamp, tier, q))
            elif isinstance(r, Claim):
                t = h.time or r.created_at
                out.append(Candidate(h.id, "claim", r.content, "", weight, t, tier, question_of(r)))
        return tuple(out)

    def _episodes(self, ids: Sequence[str]) -> dict[str, EpisodicRecord]:
        """The live source episodes of visual records: a superseded (corrected) or retracted
        episode is never a visual record's answer."""
        found = self.memory.store.find_episodes(list(dict.fromkeys(ids)))
        return {i: e for i, e in found.items() if e.state in (State.ACTIVE, State.ANONYMIZED)}

    def _clinical_time(self, query: Query) -> float:
        """The query's clinical time: its ``timestamp``, else the time of its study when memory
        already knows the study (an ingested or earlier study), else now."""
        if query.timestamp is not None:
            return query.timestamp
        known = study_time(self.memory.store, query.patient_id, query.study_id) if query.study_id else None
        return self.gm.clock.now() if known is None else known

    def _studies(self, hits: Sequence[Hit]) -> tuple[str, ...]:
        """The study each of the patient's own hits is about ("" for the semantic state, which
        spans the history): an episode's, a visual record's source episode's, a claim's."""
        visuals = [h.record.source_episode_id for h in hits if isinstance(h.record, VisualRecord)]
        sources = self.memory.store.find_episodes(visuals) if visuals else {}
        out = []
        for h in hits:
            r = h.record
            if isinstance(r, EpisodicRecord):
                out.append(r.study_id)
            elif isinstance(r, VisualRecord):
                src = sources.get(r.source_episode_id)
                out.append(src.study_id if src is not None else "")
            elif isinstance(r, Claim):
                out.append(study_of(r))
            else:
                out.append("")
        return tuple(out)

    def _gather(self, turn: Turn, z: object, at: float, pq: PolicyQuery) -> _Gathered:
        """Run the policy until STOP or ``max_steps``; every executed step is one audited read."""
        got = _Gathered()
        seen: set[str] = set()
        for _ in range(self.max_steps):
            step = self.policy.next(pq, tuple(got.steps))
            if step is None:
                break
            if not isinstance(step, Step):
                raise InvalidInput(f"the retrieval policy returned {type(step).__name__}, not a Step or None")
            if step.memory not in pq.allowed:  # the ablation flag wins over the policy
                got.steps.append(RetrievalStep(step, refused=True))
                continue
            m = step.memory
            ranked = self.gm.retrieve(
                turn,
                z,
                at=at,
                use_sem=m == "semantic",
                use_epi=m == "episodic",
                use_vis=m == "visual",
                scope=step.scope,
                use_claims=m == "semantic",
            )
            r = ranked.retrieval
            k = len(r.episodic) + len(r.visual) if step.k is None else step.k
            # k keeps the step's best hits (store order is by descending cosine); the store's
            # k_epi / k_vis setting bounds how many one read returns
            kept = {s.state_id for s in r.semantic} | {h.id for h in (r.episodic if m == "episodic" else r.visual)[:k]}
            kept |= {h.id for h in r.claims}
            pairs = tuple(p for p in ranked.ranked if p[0].id in kept)
            new = [p for p in pairs if p[0].id not in seen]
            seen.update(p[0].id for p in new)
            got.steps.append(RetrievalStep(step, pairs, tuple(h.id for h, _ in new)))
            new_ids = {h.id for h, _ in new}
            for pair in new:
                own = isinstance(pair[0].record, SemanticState) or _owner(pair[0]) == turn.patient_id
                (got.own if own else got.prior).append(pair)
            got.semantic += [s for s in r.semantic if s.state_id in new_ids]
            got.claims += [h for h in r.claims if h.id in new_ids]
            for h in r.episodic if m == "episodic" else r.visual:
                if h.id in new_ids and _owner(h) == turn.patient_id:
                    (got.episodic if m == "episodic" else got.visual).append(h)
        got.own = verified_first(got.own)  # capped over every step's hits, in rank order
        got.prior.sort(key=rank_key)
        # prompt lists are by descending cosine within each memory (stable: store order on ties)
        got.episodic.sort(key=lambda h: -h.score)
        got.visual.sort(key=lambda h: -h.score)
        got.claims.sort(key=lambda h: -h.score)
        return got

    def prepare(self, turn: Turn, query: Query, flags: Mapping[MemoryName, bool]) -> Prepared:
        """The first half of :meth:`ask` inside ``turn``: the query observed into STM, the policy's
        reads, the router, the candidates and the fused prompt: everything a backbone is given.
        ``query`` must be checked (:func:`~msm_mem._limits.check_observation`)."""
        allowed = frozenset(m for m in MEMORIES if flags[m])
        img, media = pixels(self.memory.store, query.patient_id, query.image, self.directory)
        z = self.encoder.encode([img])[0]
        at = self._clinical_time(query)
        item = self.gm.observe(
            turn,
            z,
            query.question,
            timestamp=at,
            media_path=media,
            visual_tag=query.visual_tag,
            study_id=query.study_id,
        )
        got = self._gather(turn, z, at, PolicyQuery(query.question, allowed))
        features = features_from(got.own, at)
        routed = self.router.route(features)
        if not isinstance(routed, ExpertWeights):
            raise InvalidInput(f"the router returned {type(routed).__name__}, not ExpertWeights")
        weights = ExpertWeights(**{m: routed.of(m) if flags[m] else 0.0 for m in MEMORIES})
        on = frozenset(m for m in MEMORIES if weights.of(m) > 0.0)
        raw = self._candidates(got.own)
        candidates = tuple(
            replace(c, weight=c.weight * weights.of(_expert(c.kind))) for c in raw if _expert(c.kind) in on
        )
        prior = tuple(
            replace(c, weight=c.weight * weights.of(c.kind))
            for c in self._candidates(got.prior, population=True)
            if c.kind in on
        )
        budget = self.memory.settings.prompt_budget_chars
        prompt = fuse(
            [s for s in got.semantic if "semantic" in on],
            got.episodic if "episodic" in on else [],
            got.visual if "visual" in on else [],
            query.question,
            budget_chars=budget,
            claims=got.claims if "semantic" in on else [],
        )
        request = BackboneRequest(
            prompt.text,
            query.question,
            candidates,
            prior,
            img,
            options={"expert_weights": weights.to_json()},
            question_key=question_key(query.question),
        )
        own = [(h, sc) for h, sc in got.own if _expert(h.kind) in on]
        offered = {c.id for c in prior}
        evidence = tuple(
            Evidence(h.id, h.kind, sc.rank, sc.cosine, sc.confidence, sc.freshness, sc.tier_weight, _tier(h))
            for h, sc in own
        ) + tuple(
            Evidence(
                h.id, f"population-{h.kind}", sc.rank, sc.cosine, sc.confidence, sc.freshness, sc.tier_weight, _tier(h)
            )
            for h, sc in got.prior
            if h.id in offered
        )
        studies = self._studies([h for h, _ in own]) + ("",) * (len(evidence) - len(own))
        return Prepared(item, request, prompt, budget, evidence, studies, tuple(got.steps), weights, features, raw)

    def ask(
        self,
        principal: Principal,
        query: Query,
        *,
        use_sem: bool = True,
        use_epi: bool = True,
        use_vis: bool = True,
        write_back: bool = True,
    ) -> AgentAnswer:
        """Answer one query (the loop in the module docstring).

        A failure (unreadable image, backbone error or malformed reply, a policy returning
        something other than a step) raises after auditing the consent decision, the reads that
        happened and the error; nothing else is written. The answer's audit event (``answer``)
        names the STM item, the model (:attr:`ModelRef.audit_id`) and the ids the answer cites.
        """
        question, study_id, visual_tag = check_observation(
            query.question, study_id=query.study_id, visual_tag=query.visual_tag
        )
        query = replace(query, question=question, study_id=study_id, visual_tag=visual_tag)
        flags: dict[MemoryName, bool] = {"semantic": use_sem, "episodic": use_epi, "visual": use_vis}
        turn = self.gm.begin(principal, query.patient_id)
        try:
            prep = self.prepare(turn, query, flags)
            request = prep.request
            try:
                reply = _checked(self.backbone.generate(request), self.backbone.name)
            except MsmMemError:
                raise
            except Exception as exc:  # any other backbone failure is a backend error, audited below
                raise BackendError(f"backbone {self.backbone.name!r} failed: {type(exc).__name__}: {exc}") from exc
            derived = [c.id for c in request.prior if c.id in reply.cited or reply.source == "population-prior"]
            if derived:  # the agent's answer from population experience: scrubbed, its sources named
                reply = _scrubbed(reply)
            model = ModelRef.reported(self.backbone.name, reply.model, reply.model_version)
            cited = tuple(i for i in reply.cited if i in {e.id for e in prep.evidence})
            self.gm._event(turn, "answer", "stm", "stm", [prep.item.item_id, model.audit_id, *cited])
            gate = None
            if write_back:
                source = derived_source(derived) if derived else "agent"
                gate = self.gm.consolidate(turn, prep.item, reply.answer, decision=reply.decision, source=source).gate
            self.gm.commit(turn)
        except MsmMemError as exc:
            if turn.audit:
                self.gm.fail(turn, exc)
            raise
        return AgentAnswer(
            reply.answer,
            prep.evidence,
            gate,
            prep.prompt.text,
            self.backbone.name,
            reply.source,
            reply.decision,
            prep.steps,
            prep.weights,
            prep.features,
            prep.raw,
            cited,
            prep.studies,
            model,
        )

    def ask_many(
        self,
        principal: Principal,
        queries: Sequence[Query],
        *,
        use_sem: bool = True,
        use_epi: bool = True,
        use_vis: bool = True,
        write_back: bool = True,
    ) -> list[AgentAnswer]:
        """Answer queries in order, one turn each, exactly as :meth:`ask` one at a time would:
        each query sees the write-backs of the ones before it. The first failure raises; the
        queries before it stay answered and committed."""
        return [
            self.ask(principal, q, use_sem=use_sem, use_epi=use_epi, use_vis=use_vis, write_back=write_back)
            for q in queries
        ]

"""The memory core: the paper's three memories over one store, the gate, and write-back."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .._clock import Clock, SystemClock
from .._errors import InvalidInput
from .._records import EpisodicRecord, Impression, SemanticState, Vector, VisualRecord, new_id, unit_vector
from .._settings import Settings
from .._storage.base import Store, VectorKind, WriteBatch
from .claim_evidence import claim_hits
from .gate import GateDecision, WriteBackGate
from .lexicon import Lexicon
from .retrieval import Retrieval, Scope, query
from .semantic import DEFAULT_CATEGORY, SemanticMemory

__all__ = ["Interaction", "Memory", "Staging", "WriteResult"]


@dataclass(frozen=True, slots=True)
class Interaction:
    """One answered clinical query to be written back. ``timestamp`` is UTC seconds."""

    patient_id: str
    z: Vector
    question: str
    answer: str
    timestamp: float
    decision: str = ""
    media_path: str = ""
    media_description: str = ""
    visual_tag: str = ""
    study_id: str = ""
    category: str = DEFAULT_CATEGORY
    evidence_tier: str = "agent"
    confidence: float = 1.0
    source: str = ""
    #: write a visual record with the episode; False for another question about a study whose
    #: image already has one (one image per study, its visual record shared)
    visual: bool = True
    #: the ids to write under (an ingested row's keyed ids: the database keeps one copy of a row
    #: two writers store); random when empty
    episode_id: str = ""
    visual_id: str = ""


@dataclass(frozen=True, slots=True)
class WriteResult:
    """What write-back did: the gate decision, the new ids (None when not written), and the new
    semantic version (None when the gate held the answer or the caller asked for no semantic
    update)."""

    gate: GateDecision
    episode_id: str | None
    visual_id: str | None
    semantic: SemanticState | None


@dataclass
class Staging:
    """Writes prepared but not yet committed: the batch, plus what later staged interactions of
    the same batch must see (vectors for novelty, the newest semantic version per key)."""

    batch: WriteBatch = field(default_factory=WriteBatch)
    vectors: dict[str, list[Vector]] = field(default_factory=dict)
    semantic: dict[tuple[str, str], SemanticState] = field(default_factory=dict)


class Memory:
    """``M = {M_S, M_E, M_V}`` over a :class:`Store`, with the write-back gate.

    Vectors in, typed records out: encoding images is the agent's job. Every method validates
    its input and raises a typed error before anything is written.
    """

    def __init__(self, store: Store, settings: Settings | None = None, clock: Clock | None = None) -> None:
        self.store = store
        self.settings = settings or Settings()
        self.clock = clock or SystemClock()
        lexicon = Lexicon.from_file(self.settings.lexicon_path) if self.settings.lexicon_path else Lexicon.default()
        self.gate = WriteBackGate(
            self.settings.tau, self.settings.min_answer_words, lexicon, structured=self.settings.structured_gate
        )
        self.semantic = SemanticMemory(store, self.settings.semantic_history)

    # retrieval ----------------------------------------------------------------------------

    def vector(self, z: object) -> Vector:
        """Validate and L2-normalise a query or record vector for this store."""
        return unit_vector(z, self.store.dim)

    def retrieve(
        self,
        patient_id: str,
        z: object,
        *,
        use_sem: bool = True,
        use_epi: bool = True,
        use_vis: bool = True,
        k_epi: int | None = None,
        k_vis: int | None = None,
        scope: Scope = "patient",
        use_claims: bool = False,
    ) -> Retrieval:
        """Semantic state, episodic and visual top-k for a patient and a query vector; with
        ``use_claims`` (patient scope only) also the patient's ``k_epi`` most similar study claims."""
        if not isinstance(patient_id, str) or not patient_id:
            raise InvalidInput("patient_id must be a non-empty string")
        zq = self.vector(z)
        k_e = self.settings.k_epi if k_epi is None else k_epi
        k_v = self.settings.k_vis if k_vis is None else k_vis
        sem = tuple(self.semantic.get(patient_id)) if use_sem else ()
        requests: list[tuple[VectorKind, int]] = []
        if use_epi:
            requests.append(("episodic", k_e))
        if use_vis:
            requests.append(("visual", k_v))
        hits = iter(query(self.store, zq, requests, patient_id, scope)) if requests else iter(())
        epi = tuple(next(hits)) if use_epi else ()
        vis = tuple(next(hits)) if use_vis else ()
        claims = claim_hits(self.store, patient_id, zq, k_e) if use_claims and scope == "patient" else ()
        return Retrieval(sem, epi, vis, claims)

    def max_cosine(self, patient_id: str, z: Vector) -> float | None:
        """Maximum cosine of ``z`` against the patient's stored embeddings (None if none)."""
        return self.store.max_cosine(z, ("episodic", "visual"), patient_id)

    # write-back ---------------------------------------------------------------------------

    def _check(self, it: Interaction) -> Vector:
        if not isinstance(it.patient_id, str) or not it.patient_id.strip():
            raise InvalidInput("interaction patient_id must be a non-empty string")
        if not isinstance(it.question, str) or not it.question.strip():
            raise InvalidInput("interaction question must not be empty")
        if not isinstance(it.answer, str):
            raise InvalidInput("interaction answer must be a string")
        Impression(it.timestamp, it.answer, it.decision)  # validates time and text
        return self.vector(it.z)

    def stage(self, it: Interaction, staging: Staging, *, force: bool = False, semantic: bool = True) -> WriteResult:
        """Validate one interaction, apply the gate and add its writes to ``staging.batch``.

        Nothing is stored until the batch is written; later interactions staged into the same
        :class:`Staging` see this one (novelty and semantic versions).
        """
        return self._plan(it, self._check(it), staging, force, semantic)

    def _plan(self, it: Interaction, z: Vector, pending: Staging, force: bool, semantic: bool = True) -> WriteResult:
        batch = pending.batch
        stored = self.max_cosine(it.patient_id, z)
        extra = pending.vectors.get(it.patient_id, [])
        if extra:
            local = float(np.max(np.stack(extra) @ z))
            stored = local if stored is None else max(stored, local)
        decision = self.gate.decide(stored, it.answer)
        if force and not decision.written:
            decision = GateDecision(True, ("forced", *decision.reasons), stored, decision.keywords)
        now = self.clock.now()
        epi_id = vis_id = None
        if decision.written:
            epi_id = it.episode_id or new_id("E")
            vis_id = (it.visual_id or new_id("V")) if it.visual else None
            created = now
            batch.episodes.append(
                EpisodicRecord(
                    episode_id=epi_id,
                    patient_id=it.patient_id,
                    timestamp=it.timestamp,
                    z=z,
                    question=it.question,
                    answer=it.answer,
                    decision=it.decision,
                    media_path=it.media_path,
                    media_description=it.media_description,
                    study_id=it.study_id,
                    confidence=it.confidence,
                    evidence_tier=it.evidence_tier,
                    source=it.source,
                    created_at=created,
                    decay_at=None,  # decided at sweep time from the patient's last activity (ranking.decay_at)
                )
            )
            if vis_id is not None:
                batch.visuals.append(self._visual(it, z, vis_id, epi_id, created))
            pending.vectors.setdefault(it.patient_id, []).append(z)
        if not semantic or not decision.written:  # a held answer reaches no long-term memory
            return WriteResult(decision, epi_id, vis_id, None)
        key = (it.patient_id, it.category)
        current = pending.semantic.get(key)
        if current is None:
            active = self.store.semantic_active(it.patient_id, it.category)
            current = active[0] if active else None
        new_state = self.semantic.next_version(
            current,
            it.patient_id,
            Impression(it.timestamp, it.answer, it.decision),
            category=it.category,
            created_at=now,
            evidence_tier=it.evidence_tier,
        )
        pending.semantic[key] = new_state
        batch.semantic.append(new_state)
        return WriteResult(decision, epi_id, vis_id, new_state)

    @staticmethod
    def _visual(it: Interaction, z: Vector, vis_id: str, epi_id: str, created: float) -> VisualRecord:
        return VisualRecord(
            visual_id=vis_id,
            patient_id=it.patient_id,
            timestamp=it.timestamp,
            z=z,
            media_path=it.media_path,
            visual_tag=it.visual_tag,
            source_episode_id=epi_id,
            confidence=it.confidence,
            evidence_tier=it.evidence_tier,
            source=it.source,
            created_at=created,
            decay_at=None,
        )

    def write_back(self, interaction: Interaction, *, force: bool = False) -> WriteResult:
        """Gate one interaction, consolidate it if it passes, update semantic state: one write."""
        return self.write_back_many([interaction], force=force)[0]

    def write_back_many(self, interactions: Sequence[Interaction], *, force: bool = False) -> list[WriteResult]:
        """Same decisions as calling :meth:`write_back` one at a time, in one transaction.

        Semantic versions chain inside the batch (each supersedes the one before it), so the
        version history is the same as with one call per interaction.

        ``force`` consolidates whatever the gate says (base-memory construction from ground
        truth); the decision then carries the reason ``forced`` before the gate's own codes.
        """
        vectors = [self._check(it) for it in interactions]
        staging = Staging()
        results = [self._plan(it, z, staging, force) for it, z in zip(interactions, vectors, strict=True)]
        if staging.batch:
            self.store.write(staging.batch)
        return results

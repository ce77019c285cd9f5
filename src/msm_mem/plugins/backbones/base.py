"""The backbone contract: a fused prompt (+ image, + the structured evidence) in, an answer out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

__all__ = ["Backbone", "BackboneReply", "BackboneRequest", "Candidate"]


@dataclass(frozen=True, slots=True)
class Candidate:
    """One piece of retrieved evidence as a backbone sees it.

    ``kind`` is episodic, visual or semantic; ``text`` the answer or impression it carries;
    ``weight`` the retrieval score after ranking (cosine x composite_k, >= 0); ``time`` UTC s;
    ``tier`` the evidence-tier weight in [0, 1] of the record it comes from (1 ground truth or a
    signed report, 0.95 a critic's verdict, 0.6 the agent's own answer; 0 when unknown);
    ``question_key`` the key of the question the evidence answered (16 hex digits, the claim
    key's question part; "" for evidence that answers no particular question, such as the
    semantic state).
    """

    id: str
    kind: str
    text: str
    decision: str
    weight: float
    time: float
    tier: float = 0.0
    question_key: str = ""


@dataclass(frozen=True, slots=True)
class BackboneRequest:
    """Everything a backbone may use. ``prompt`` is the fused text; ``candidates`` the same
    evidence in structured form (ranked); ``prior`` population-level answers with weights,
    used when the patient has no memory; ``image`` the current grayscale image or None;
    ``question_key`` the key of the question asked (as :attr:`Candidate.question_key`)."""

    prompt: str
    question: str
    candidates: tuple[Candidate, ...] = ()
    prior: tuple[Candidate, ...] = ()
    image: npt.NDArray[np.float32] | None = None
    options: dict[str, Any] = field(default_factory=dict)
    question_key: str = ""


@dataclass(frozen=True, slots=True)
class BackboneReply:
    """The answer, the memory ids it rests on, a decision (may be empty), and a confidence in
    [0, 1]. ``model`` and ``model_version`` name the model behind a backbone as its server
    reported them ("" when the backbone is the model, or the server reports none); they go into
    the audit trail (:class:`~msm_mem.ModelRef`)."""

    answer: str
    cited: tuple[str, ...] = ()
    decision: str = ""
    confidence: float = 0.0
    source: str = ""
    model: str = ""
    model_version: str = ""


@runtime_checkable
class Backbone(Protocol):
    """Turns a request into a reply. Implementations raise BackendError on failure."""

    name: str

    def generate(self, request: BackboneRequest) -> BackboneReply: ...

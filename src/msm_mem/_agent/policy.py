"""The retrieval policy of the online loop (paper A.1(f)): given the query and the steps so
far, output either a memory-query pair or STOP.

A :class:`Step` names one memory (``semantic``, ``episodic`` or ``visual``) and its sub-query:
a retrieval scope (``patient``, ``population`` or ``anonymous``) and optionally ``k``, the
number of hits wanted. The agent runs each step as one audited read
(:meth:`msm_mem._memory.tiers.GovernedMemory.retrieve`), records what came back as a
:class:`RetrievalStep`, and asks again until the policy answers ``None`` (STOP) or the step
limit is reached. The agent, not the policy, enforces the ablation flags: a step on a memory
switched off is refused (nothing read) and still counts toward the limit.

Two policies:

- :class:`HeuristicPolicy` (the default), fixed rules:

  1. read each allowed memory in patient scope, in the order semantic, episodic, visual;
  2. then, when episodic memory is allowed and the patient's evidence is weak (fewer than
     ``min_hits`` episodic + visual hits, or the best episodic/visual cosine below
     ``min_cosine``), read episodic memory in population scope (other patients' experience,
     which reaches the backbone as the population prior);
  3. then STOP.

- :class:`BackbonePolicy` asks a :class:`~msm_mem.plugins.backbones.base.Backbone` for the next
  step with a one-line textual protocol: ``"<memory> <scope> [k]"`` (for example
  ``"episodic patient 5"``) or ``"STOP"``. The reply text is parsed strictly (case and runs of
  spaces are ignored; nothing else may be on the line); an unparsable reply is treated as STOP
  and logged, never guessed at. A backend failure propagates as :class:`~msm_mem.BackendError`
  (other exceptions of the backbone are wrapped in one): the agent records a failed turn.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, get_args, runtime_checkable

from .._errors import BackendError, InvalidInput, MsmMemError
from .._memory.ranking import Score
from .._memory.retrieval import Scope
from .._records import Hit
from ..plugins.backbones.base import Backbone, BackboneRequest

__all__ = [
    "MEMORIES",
    "BackbonePolicy",
    "HeuristicPolicy",
    "MemoryName",
    "PolicyQuery",
    "RetrievalPolicy",
    "RetrievalStep",
    "Step",
    "parse_step",
]

log = logging.getLogger(__name__)

MemoryName = Literal["semantic", "episodic", "visual"]
#: The memories in the order the heuristic reads them.
MEMORIES: tuple[MemoryName, ...] = ("semantic", "episodic", "visual")
_SCOPES: tuple[str, ...] = get_args(Scope)
#: Largest ``k`` a step may ask for.
MAX_K = 100


@dataclass(frozen=True, slots=True)
class Step:
    """One memory-query pair: read ``memory`` in ``scope``, keeping at most ``k`` hits
    (``None``: the store's setting ``k_epi`` / ``k_vis``). Semantic memory is per patient, so a
    semantic step must use patient scope and has no ``k``."""

    memory: MemoryName
    scope: Scope = "patient"
    k: int | None = None

    def __post_init__(self) -> None:
        if self.memory not in MEMORIES:
            raise InvalidInput(f"unknown memory {self.memory!r}: use {', '.join(MEMORIES)}")
        if self.scope not in _SCOPES:
            raise InvalidInput(f"unknown scope {self.scope!r}: use {', '.join(_SCOPES)}")
        if self.k is not None and (isinstance(self.k, bool) or not isinstance(self.k, int) or not 1 <= self.k <= MAX_K):
            raise InvalidInput(f"k must be an integer in [1, {MAX_K}], got {self.k!r}")
        if self.memory == "semantic" and (self.scope != "patient" or self.k is not None):
            raise InvalidInput("a semantic step reads the patient's own state: patient scope, no k")

    def text(self) -> str:
        """The step in the textual protocol, e.g. ``"episodic patient 5"``."""
        return f"{self.memory} {self.scope}" + ("" if self.k is None else f" {self.k}")


@dataclass(frozen=True, slots=True)
class PolicyQuery:
    """What a policy may see of the query: the question and which memories the ablation
    flags allow. The patient identifier is deliberately absent (a policy may be a remote model)."""

    question: str
    allowed: frozenset[MemoryName] = frozenset(MEMORIES)


@dataclass(frozen=True, slots=True)
class RetrievalStep:
    """A step the agent took and what it returned: the hits of that step (already deduplicated
    against earlier steps in ``new_ids``), or ``refused=True`` when the step's memory was
    switched off by an ablation flag (nothing was read)."""

    step: Step
    hits: tuple[tuple[Hit, Score], ...] = ()
    new_ids: tuple[str, ...] = ()
    refused: bool = False

    @property
    def count(self) -> int:
        """Number of hits the step returned (0 for a refused step)."""
        return len(self.hits)

    @property
    def top_cosine(self) -> float | None:
        """Best episodic/visual cosine of the step in [-1, 1]; None without such hits."""
        cos = [h.score for h, _ in self.hits if h.kind in ("episodic", "visual")]
        return max(cos) if cos else None


@runtime_checkable
class RetrievalPolicy(Protocol):
    """``R(q, r_1..r_{N-1})``: the next memory-query pair, or ``None`` for STOP."""

    def next(self, query: PolicyQuery, history: Sequence[RetrievalStep]) -> Step | None: ...


class HeuristicPolicy:
    """The default policy; its rules are in the module docstring.

    ``min_cosine`` is a cosine in [-1, 1]; ``min_hits`` a count of patient episodic + visual
    hits. With the defaults the population is consulted only when the patient has no
    episodic/visual evidence or none resembling the current image (cosine < 0.3).
    """

    def __init__(self, *, min_cosine: float = 0.3, min_hits: int = 1) -> None:
        if not -1.0 <= min_cosine <= 1.0:
            raise InvalidInput(f"min_cosine must be a cosine in [-1, 1], got {min_cosine}")
        if isinstance(min_hits, bool) or not isinstance(min_hits, int) or min_hits < 0:
            raise InvalidInput(f"min_hits must be a non-negative integer, got {min_hits!r}")
        self.min_cosine = min_cosine
        self.min_hits = min_hits

    def next(self, query: PolicyQuery, history: Sequence[RetrievalStep]) -> Step | None:
        """Rule 1, then rule 2, then STOP (see the module docstring)."""
        taken = {h.step for h in history}
        for memory in MEMORIES:
            step = Step(memory)
            if memory in query.allowed and step not in taken:
                return step
        widen = Step("episodic", "population")
        if "episodic" not in query.allowed or widen in taken:
            return None
        own = [h for s in history if s.step.scope == "patient" and s.step.memory != "semantic" for h, _ in s.hits]
        best = max((h.score for h in own), default=None)
        if len(own) < self.min_hits or best is None or best < self.min_cosine:
            return widen
        return None


_STEP_RE = re.compile(r"(semantic|episodic|visual) (patient|population|anonymous)(?: ([1-9][0-9]{0,2}))?")


def parse_step(text: str) -> Step | None:
    """Parse one reply of the textual protocol: ``"<memory> <scope> [k]"`` or ``"STOP"``.

    Case and runs of whitespace are ignored; anything else (extra words, a second line, an
    unknown memory or scope, a semantic step outside patient scope, k out of [1, 100]) raises
    :class:`InvalidInput`. Returns ``None`` for STOP.
    """
    if not isinstance(text, str):
        raise InvalidInput(f"a policy reply must be text, got {type(text).__name__}")
    if "\n" in text.strip():
        raise InvalidInput("a policy reply must be one line")
    line = " ".join(text.split()).lower()
    if line == "stop":
        return None
    m = _STEP_RE.fullmatch(line)
    if m is None:
        raise InvalidInput(f"not a step: {line[:60]!r}")
    memory, scope, k = m.groups()
    return Step(memory, scope, None if k is None else int(k))  # type: ignore[arg-type]  # regex-checked


_INSTRUCTIONS = (
    "You decide which memory a clinical assistant reads next before answering.\n"
    "Memories: semantic (the patient's impression history), episodic (past encounters with "
    "their answers), visual (similar past images).\n"
    "Scopes: patient (this patient only), population (all patients), anonymous (anonymised "
    "experience). Semantic memory only has patient scope.\n"
    "Reply with exactly one line and nothing else: '<memory> <scope> <k>' (k from 1 to 100), "
    "for example 'episodic patient 5', or 'STOP' when the evidence read so far is enough."
)


class BackbonePolicy:
    """A policy that asks a backbone for each step (protocol in the module docstring).

    ``last_error`` holds why the latest reply was rejected ("" after a parsable one).
    """

    def __init__(self, backbone: Backbone) -> None:
        self.backbone = backbone
        self.last_error = ""

    def prompt(self, query: PolicyQuery, history: Sequence[RetrievalStep]) -> str:
        """The text sent to the backbone: instructions, allowed memories, question, steps so far."""
        lines = [
            _INSTRUCTIONS,
            f"Allowed memories: {', '.join(m for m in MEMORIES if m in query.allowed)}",
            f"Question: {' '.join(query.question.split())}",
            "Steps so far:",
        ]
        for i, h in enumerate(history, 1):
            if h.refused:
                lines.append(f"{i}. {h.step.text()} -> refused (memory switched off)")
            else:
                cos = "none" if h.top_cosine is None else f"{h.top_cosine:.3f}"
                lines.append(f"{i}. {h.step.text()} -> {h.count} hits, {len(h.new_ids)} new, top cosine {cos}")
        if not history:
            lines.append("(none)")
        return "\n".join(lines)

    def next(self, query: PolicyQuery, history: Sequence[RetrievalStep]) -> Step | None:
        """The backbone's step; STOP when its reply does not parse (see :func:`parse_step`)."""
        request = BackboneRequest(prompt=self.prompt(query, history), question=query.question)
        try:
            reply = self.backbone.generate(request)
        except MsmMemError:
            raise
        except Exception as exc:  # any other failure of the model is a backend error
            raise BackendError(f"policy backbone {self.backbone.name!r} failed: {type(exc).__name__}: {exc}") from exc
        try:
            step = parse_step(reply.answer)
        except InvalidInput as exc:
            self.last_error = str(exc)
            log.warning("retrieval policy %s: unparsable reply, stopping (%s)", self.backbone.name, exc)
            return None
        self.last_error = ""
        return step

"""The ``fitted`` backbone: a memory-free image model and a router over the memory experts,
both fitted on the fine-tune split (``msm-mem eval`` fits them; :mod:`.fitted_format` is the file).

Each query's evidence is split into *experts* (:data:`~.fitted_format.EXPERTS`): the patient's
semantic state, episodic hits, visual hits and claims (candidates of kind ``semantic``,
``episodic``, ``visual``, ``claim``/``claims``), other patients' experience (the population
prior, one expert) and the memory-free model (the question group's classifier over the image's
embedding). Each expert proposes one answer: a weighted vote over its candidates (ties: the
newest, then the smallest text), the newest impression for the semantic state, the most
probable class for the model. For every proposal the router computes
:data:`~.fitted_format.GATE_FEATURES`:

- ``is_<expert>``: which expert proposes it (one-hot);
- ``weight``: the ranking weight (cosine x composite_k, clipped to [0, 1]) of the expert's best
  candidate for it; the model's probability for the model;
- ``support``: the share of the expert's candidate weight behind the proposal (1 for a single
  candidate; the probability for the model);
- ``recency``: ``exp(-days / 365)``, days between the patient's newest evidence and the newest
  candidate behind the proposal (own experts; 0 for the population and the model);
- ``same_patient``: 1 for the patient's own memories, 0 for the population and the model;
- ``agreement``: the share of the other memory experts proposing the same answer (0 if none);
- ``agrees_model``: 1 when the model proposes the same answer (0 for the model itself);
- ``tier``: the evidence-tier weight of the best candidate (verified evidence weighs 0.95-1,
  the agent's own unverified answer 0.6; 0 for the model);
- ``own_evidence``: 1 when the patient has any evidence of their own.

The router gives each proposal the probability ``p`` that it is right (a logistic regression per
question group); an answer's score is ``1 - prod(1 - p)`` over the experts proposing it
(noisy-OR), and the best score wins (ties: more experts, then the smaller text). So S+E+V can
follow the patient's own history, the population or the image model, whichever the fine-tune
patients showed to be more reliable in a situation. A question with no fitted group falls back
to the nonparametric vote; a group without a router answers with the model alone when the
patient has no evidence, else with the nonparametric vote.

Each group also carries a *strategy* (:data:`~.fitted_format.STRATEGIES`), chosen on the
fine-tune patients by cross-validation (:mod:`msm_mem.eval.fit_select`), so that the full memory
can fall back to a simpler reading of itself where the fine-tune patients showed it more
reliable:

- ``router``: the router above (the default, and the only strategy of older files);
- ``newest``: the patient's newest own evidence (the copy-prior baseline's rule over the
  retrieved memory), else the population vote, else the model;
- ``nearest``: the single highest-ranked piece of evidence, the patient's own or the
  population's (the nearest-neighbour baseline's rule), else the model;
- ``vote``: the nonparametric vote (the untrained S+E+V), the model when it has nothing;
- ``model``: the memory-free model alone (the ``ft`` row).
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..._errors import InvalidInput
from ..encoders.base import Encoder
from .base import BackboneReply, BackboneRequest, Candidate
from .fitted_format import EXPERTS, GATE_FEATURES, STRATEGIES, FittedGroup, FittedModels, load
from .nonparametric import NonparametricBackbone

__all__ = ["FittedBackbone", "Proposal", "answer_with", "choose", "expert_of", "proposals"]

DAY = 86_400.0
_YEAR_DAYS = 365.0
_OWN = ("semantic", "episodic", "visual", "claim")


def _key(text: str) -> str:
    return " ".join(text.lower().split())


def expert_of(candidate: Candidate, *, population: bool) -> str | None:
    """The expert a candidate belongs to (None for a kind the router does not know)."""
    if population:
        return "population"
    kind = "claim" if candidate.kind == "claims" else candidate.kind
    return kind if kind in _OWN else None


@dataclass(frozen=True, slots=True)
class Proposal:
    """One expert's answer, the features the router sees of it and the ids it rests on."""

    expert: str
    text: str
    decision: str
    features: npt.NDArray[np.float64]
    cited: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return _key(self.text)


@dataclass(frozen=True, slots=True)
class _Vote:
    text: str
    decision: str
    cited: tuple[str, ...]
    weight: float
    support: float
    time: float
    tier: float


def _vote(cands: Sequence[Candidate], *, newest_only: bool = False) -> _Vote | None:
    usable = [c for c in cands if c.text.strip()]
    if not usable:
        return None
    if newest_only:
        # of two at the same time (two views of one study) the heavier, then the one ranked
        # first (max keeps the first of equals): never the ids, which are random
        usable = [max(usable, key=lambda c: (c.time, c.weight))]
    score: dict[str, float] = defaultdict(float)
    members: dict[str, list[Candidate]] = defaultdict(list)
    for c in usable:
        score[_key(c.text)] += max(c.weight, 0.0)
        members[_key(c.text)].append(c)
    newest = {k: max(c.time for c in m) for k, m in members.items()}
    best = min(score, key=lambda k: (-score[k], -newest[k], k))
    top = max(members[best], key=lambda c: (c.weight, c.time))  # equals: the one ranked first
    total = sum(score.values())
    support = score[best] / total if total > 0 else len(members[best]) / len(usable)
    return _Vote(
        top.text.strip(),
        top.decision,
        tuple(dict.fromkeys(c.id for c in members[best])),
        min(max(top.weight, 0.0), 1.0),
        support,
        newest[best],
        min(max(top.tier, 0.0), 1.0),
    )


def proposals(request: BackboneRequest, model: tuple[str, float] | None) -> list[Proposal]:
    """Every expert's proposal for ``request``, with the router's features (module docstring);
    ``model`` is the memory-free model's (answer, probability) or None."""
    by_expert: dict[str, list[Candidate]] = defaultdict(list)
    for c in request.candidates:
        if (e := expert_of(c, population=False)) is not None:
            by_expert[e].append(c)
    by_expert["population"] = list(request.prior)
    own_times = [c.time for e in _OWN for c in by_expert[e]]
    newest_own = max(own_times, default=None)
    votes: dict[str, _Vote] = {}
    for e in (*_OWN, "population"):
        if (v := _vote(by_expert[e], newest_only=e == "semantic")) is not None:
            votes[e] = v
    model_key = _key(model[0]) if model is not None else None
    out: list[Proposal] = []
    for e, v in votes.items():
        others = [_key(o.text) for f, o in votes.items() if f != e]
        own = e in _OWN
        days = (newest_own - v.time) / DAY if own and newest_own is not None else None
        x = _features(
            e,
            weight=v.weight,
            support=v.support,
            recency=math.exp(-max(days, 0.0) / _YEAR_DAYS) if days is not None else 0.0,
            same_patient=1.0 if own else 0.0,
            agreement=sum(k == _key(v.text) for k in others) / len(others) if others else 0.0,
            agrees_model=1.0 if model_key is not None and model_key == _key(v.text) else 0.0,
            tier=v.tier,
            own_evidence=1.0 if newest_own is not None else 0.0,
        )
        out.append(Proposal(e, v.text, v.decision, x, v.cited))
    if model is not None:
        memory_keys = [_key(v.text) for v in votes.values()]
        x = _features(
            "model",
            weight=model[1],
            support=model[1],
            recency=0.0,
            same_patient=0.0,
            agreement=sum(k == model_key for k in memory_keys) / len(memory_keys) if memory_keys else 0.0,
            agrees_model=0.0,
            tier=0.0,
            own_evidence=1.0 if newest_own is not None else 0.0,
        )
        out.append(Proposal("model", model[0], "", x))
    return out


def _features(expert: str, **values: float) -> npt.NDArray[np.float64]:
    onehot = {f"is_{e}": 1.0 if e == expert else 0.0 for e in EXPERTS}
    merged = {**onehot, **values}
    return np.array([merged[name] for name in GATE_FEATURES], dtype=np.float64)


def choose(props: Sequence[Proposal], probability: Sequence[float]) -> tuple[Proposal, float, list[Proposal]]:
    """The winning answer: noisy-OR of ``probability`` (one per proposal, in [0, 1]) over the
    proposals of each answer; returns its first proposal, its score and every proposal of it."""
    if not props or len(props) != len(probability):
        raise InvalidInput("choose needs one probability per proposal and at least one proposal")
    miss: dict[str, float] = defaultdict(lambda: 1.0)
    group: dict[str, list[Proposal]] = defaultdict(list)
    for p, prob in zip(props, probability, strict=True):
        miss[p.key] *= 1.0 - min(max(prob, 0.0), 1.0)
        group[p.key].append(p)
    best = min(group, key=lambda k: (miss[k], -len(group[k]), k))
    return group[best][0], 1.0 - miss[best], group[best]


class FittedBackbone:
    """The ``fitted`` backbone (module docstring). ``path`` names a fitted-parameter file
    (:mod:`.fitted_format`); a file that cannot be read or does not validate, or whose encoder
    cannot be built or has another dimension, raises :class:`InvalidInput`."""

    name = "fitted"

    def __init__(self, path: str | os.PathLike[str], *, encoder: Encoder | None = None) -> None:
        if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
            raise InvalidInput("the fitted backbone needs path= naming a fitted-parameter file")
        self.models: FittedModels = load(path)
        if encoder is None:
            from ..encoders import get_encoder  # the file names the encoder its classifiers read

            encoder = get_encoder(self.models.encoder)
        elif getattr(encoder, "name", None) != self.models.encoder:
            given = getattr(encoder, "name", "?")
            raise InvalidInput(f"{path}: fitted on encoder {self.models.encoder}, given encoder {given}")
        self.encoder = encoder
        if self.encoder.dim != self.models.dim:
            dims = f"fitted on {self.models.dim}-d embeddings; encoder {self.models.encoder} is {self.encoder.dim}-d"
            raise InvalidInput(f"{path}: {dims}")
        #: the encoder a store must use for this backbone's classifiers to read its images alike
        self.encoder_name = self.models.encoder

    def _model(self, group: FittedGroup, image: npt.NDArray[Any] | None) -> tuple[str, float] | None:
        if image is None:
            return None
        return group.predict(self.encoder.encode([image])[0])

    def generate(self, request: BackboneRequest) -> BackboneReply:
        """Answer by the group's strategy (module docstring)."""
        group = self.models.group_for(request.question)
        if group is None:
            return _FALLBACK.generate(request)
        return answer_with(group.strategy, request, self._model(group, request.image), group.gate)


_FALLBACK = NonparametricBackbone()


def _model_reply(model: tuple[str, float] | None) -> BackboneReply | None:
    return None if model is None else BackboneReply(model[0], confidence=model[1], source="model")


def _single(c: Candidate, source: str) -> BackboneReply:
    return BackboneReply(c.text.strip(), (c.id,), c.decision, min(max(c.weight, 0.0), 1.0), source)


def _or_model(reply: BackboneReply, model: tuple[str, float] | None) -> BackboneReply:
    """``reply`` unless it is the empty answer and the model has one."""
    return (_model_reply(model) or reply) if reply.source == "empty" else reply


def answer_with(
    strategy: str,
    request: BackboneRequest,
    model: tuple[str, float] | None,
    gate: Callable[[npt.NDArray[np.float64]], float | None] | None,
) -> BackboneReply:
    """The answer of one strategy (:data:`~.fitted_format.STRATEGIES`, module docstring) for
    ``request``, given the memory-free model's (answer, probability) and the router's ``gate``
    (a proposal's features -> probability, or None without a router)."""
    if strategy not in STRATEGIES:
        raise InvalidInput(f"unknown strategy {strategy!r}; known: {', '.join(STRATEGIES)}")
    if strategy == "model":
        return _model_reply(model) or _FALLBACK.generate(request)
    if strategy == "vote":
        return _or_model(_FALLBACK.generate(request), model)
    if strategy == "newest":
        own = [c for c in request.candidates if expert_of(c, population=False) and c.text.strip()]
        if own:
            return _single(max(own, key=lambda c: (c.time, c.weight)), "memory")  # equals: ranked first
        return _or_model(_FALLBACK.generate(request), model)
    if strategy == "nearest":
        own = [c for c in request.candidates if expert_of(c, population=False) and c.text.strip()]
        population = [c for c in request.prior if c.text.strip()]
        pool = [(c, "memory") for c in own] + [(c, "population-prior") for c in population]
        if pool:
            c, source = max(pool, key=lambda t: (t[0].weight, t[0].time))  # of equals, own memory first
            return _single(c, source)
        return _model_reply(model) or _FALLBACK.generate(request)
    props = proposals(request, model)
    own_evidence = any(p.expert in _OWN for p in props)
    probs = [gate(p.features) for p in props] if gate is not None else []
    if not props or any(p is None for p in probs) or not probs:
        if model is not None and not own_evidence:
            return BackboneReply(model[0], confidence=model[1], source="model")
        return _FALLBACK.generate(request)
    first, score, agreeing = choose(props, [p or 0.0 for p in probs])
    experts = {p.expert for p in agreeing}
    source = "memory" if experts & set(_OWN) else "population-prior" if "population" in experts else "model"
    decision = next((p.decision for p in agreeing if p.decision), "")
    cited = tuple(dict.fromkeys(i for p in agreeing for i in p.cited))
    return BackboneReply(first.text, cited, decision, score, source)

"""Adaptive routing over the memory experts (paper 2.1: "the adaptive routing chooses a mixture
of experts based on ranking and cosine-similarity of memory features").

After retrieval the agent computes :class:`RouterFeatures` from the patient's evidence and a
router maps them to one weight per expert (semantic, episodic, visual), each in [0, 1]. Every
candidate handed to the backbone has its ranking weight multiplied by its expert's weight; an
expert at weight 0 is switched off (its candidates and prompt lines are left out). The
weights are also passed to the backbone as ``request.options["expert_weights"]``.

- :class:`FixedRouter`: constant weights (default 1, 1, 1: every expert as retrieved).
- :class:`LearnedRouter`: one logistic regression per expert, ``w = sigmoid(coef . x + bias)``
  on the feature vector ``x`` (:meth:`RouterFeatures.vector`), fitted by :func:`fit_router` on
  examples labelled "this expert's top candidate answered correctly" (token F1 >= 0.5 against
  the reference, :func:`label_example`). Weights below ``min_weight`` become 0. An expert
  without training examples keeps weight 1. Stored as JSON (:meth:`LearnedRouter.save`), by
  convention as ``router.json`` in the store directory, where :class:`MemoryAgent` finds it.

The fit is Newton's method (IRLS) with an L2 penalty on every coefficient: no randomness, so
the same examples give the same router, bit for bit; the penalty keeps the coefficients
finite when an expert's labels are all equal or separable.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from .._errors import InvalidInput
from .._memory.answers import token_f1
from .._memory.ranking import Score
from .._private import private_file
from .._records import EpisodicRecord, Hit, SemanticState, VisualRecord
from ..plugins.backbones.base import Candidate
from .policy import MEMORIES, MemoryName

__all__ = [
    "FEATURE_NAMES",
    "ROUTER_FILE",
    "ExpertWeights",
    "FixedRouter",
    "LearnedRouter",
    "Router",
    "RouterExample",
    "RouterFeatures",
    "features_from",
    "fit_router",
    "label_example",
]

#: The file name of a learned router inside a store directory.
ROUTER_FILE = "router.json"
FORMAT = "msm-mem-router"
VERSION = 1
#: The entries of :meth:`RouterFeatures.vector`, in order.
FEATURE_NAMES = ("cos_episodic", "cos_visual", "n_episodic", "n_visual", "recency", "semantic_len")
_COUNT_CAP = 10  # hits per memory beyond which the count feature saturates
_AGE_CAP_DAYS = 3650.0  # ten years: the recency feature saturates at 1
_SEM_CAP = 5  # the paper's semantic history length N
DAY = 86_400.0


@dataclass(frozen=True, slots=True)
class RouterFeatures:
    """What the router sees of one retrieval (the patient's own evidence only).

    Cosines are the best episodic / visual cosine in [-1, 1] (None without hits; semantic state
    has no cosine); counts are hits per memory; ``newest_age_days`` is the age in days of the
    newest piece of evidence at query time (None without evidence); ``semantic_len`` is the
    number of impressions in the patient's semantic history.
    """

    top_cosine_episodic: float | None = None
    top_cosine_visual: float | None = None
    n_episodic: int = 0
    n_visual: int = 0
    newest_age_days: float | None = None
    semantic_len: int = 0

    def vector(self) -> npt.NDArray[np.float64]:
        """The features as numbers, named by :data:`FEATURE_NAMES`: cosines (0 when absent),
        counts / 10 and semantic length / 5 capped at 1, and ``log1p(age) / log1p(3650)``
        capped at 1 (1 when there is no evidence)."""
        age = (
            1.0
            if self.newest_age_days is None
            else min(math.log1p(max(self.newest_age_days, 0.0)) / math.log1p(_AGE_CAP_DAYS), 1.0)
        )
        return np.array(
            [
                self.top_cosine_episodic or 0.0,
                self.top_cosine_visual or 0.0,
                min(self.n_episodic, _COUNT_CAP) / _COUNT_CAP,
                min(self.n_visual, _COUNT_CAP) / _COUNT_CAP,
                age,
                min(self.semantic_len, _SEM_CAP) / _SEM_CAP,
            ],
            dtype=np.float64,
        )


def _time(hit: Hit) -> float | None:
    r = hit.record
    if isinstance(r, (EpisodicRecord, VisualRecord)):
        return r.timestamp
    if isinstance(r, SemanticState) and r.last is not None:
        return r.last.timestamp
    return None


def features_from(hits: Iterable[tuple[Hit, Score]], at: float) -> RouterFeatures:
    """Features of a set of ranked hits at query time ``at`` (UTC seconds)."""
    pairs = list(hits)
    cos = {k: [h.score for h, _ in pairs if h.kind == k] for k in ("episodic", "visual")}
    times = [t for h, _ in pairs if (t := _time(h)) is not None]
    sem = [len(h.record.impressions) for h, _ in pairs if isinstance(h.record, SemanticState)]
    return RouterFeatures(
        max(cos["episodic"], default=None),
        max(cos["visual"], default=None),
        len(cos["episodic"]),
        len(cos["visual"]),
        max(at - max(times), 0.0) / DAY if times else None,
        max(sem, default=0),
    )


@dataclass(frozen=True, slots=True)
class ExpertWeights:
    """One weight per memory expert, each in [0, 1]; 0 switches the expert off."""

    semantic: float = 1.0
    episodic: float = 1.0
    visual: float = 1.0

    def __post_init__(self) -> None:
        for name in MEMORIES:
            w = getattr(self, name)
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0.0 <= w <= 1.0:
                raise InvalidInput(f"the {name} expert weight must be in [0, 1], got {w!r}")

    def of(self, kind: str) -> float:
        """The weight of the expert ``kind`` (semantic, episodic or visual)."""
        if kind not in MEMORIES:
            raise InvalidInput(f"unknown expert {kind!r}")
        return float(getattr(self, kind))

    def to_json(self) -> dict[str, float]:
        return {name: self.of(name) for name in MEMORIES}


@runtime_checkable
class Router(Protocol):
    """Maps retrieval features to expert weights."""

    def route(self, features: RouterFeatures) -> ExpertWeights: ...


class FixedRouter:
    """The same weights for every query (default 1, 1, 1)."""

    def __init__(self, semantic: float = 1.0, episodic: float = 1.0, visual: float = 1.0) -> None:
        self.weights = ExpertWeights(semantic, episodic, visual)

    def route(self, features: RouterFeatures) -> ExpertWeights:
        """The constant weights, whatever the features."""
        return self.weights


@dataclass(frozen=True, slots=True)
class RouterExample:
    """Training example: features, and per expert whether its top candidate was right
    (experts without a candidate are absent)."""

    features: RouterFeatures
    labels: Mapping[str, bool] = field(default_factory=dict)


def label_example(
    features: RouterFeatures, candidates: Sequence[Candidate], reference: str, *, threshold: float = 0.5
) -> RouterExample:
    """Label each expert by its top candidate (largest weight; ties: newest, then the first of
    ``candidates``, retrieval's order): correct when ``token_f1(candidate.text, reference) >=
    threshold`` (F1 in [0, 1])."""
    labels: dict[str, bool] = {}
    for kind in MEMORIES:
        mine = [c for c in candidates if c.kind == kind]
        if mine:
            top = min(mine, key=lambda c: (-c.weight, -c.time))  # min keeps the first of equals
            labels[kind] = token_f1(top.text, reference) >= threshold
    return RouterExample(features, labels)


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


class LearnedRouter:
    """Per-expert logistic regression (see the module docstring).

    ``coef[expert]`` has one entry per :data:`FEATURE_NAMES`; ``examples[expert]`` is the number
    of examples it was fitted on (0: untrained, weight 1).
    """

    def __init__(
        self,
        coef: Mapping[str, Sequence[float]],
        bias: Mapping[str, float],
        examples: Mapping[str, int],
        *,
        min_weight: float = 0.0,
    ) -> None:
        if not 0.0 <= min_weight <= 1.0:
            raise InvalidInput(f"min_weight must be in [0, 1], got {min_weight}")
        self.coef = {e: tuple(float(c) for c in coef[e]) for e in MEMORIES}
        self.bias = {e: float(bias[e]) for e in MEMORIES}
        self.examples = {e: int(examples[e]) for e in MEMORIES}
        self.min_weight = float(min_weight)

    def weight(self, expert: MemoryName, features: RouterFeatures) -> float:
        """The expert's probability of being right, in [0, 1] (before the ``min_weight`` cut)."""
        if self.examples[expert] == 0:
            return 1.0
        x = features.vector()
        return _sigmoid(float(np.dot(np.asarray(self.coef[expert]), x)) + self.bias[expert])

    def route(self, features: RouterFeatures) -> ExpertWeights:
        """Weights per expert; those below ``min_weight`` become 0 (expert off)."""
        ws = {e: self.weight(e, features) for e in MEMORIES}
        return ExpertWeights(**{e: (w if w >= self.min_weight else 0.0) for e, w in ws.items()})

    # persistence ---------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The JSON document :meth:`save` writes."""
        return {
            "format": FORMAT,
            "version": VERSION,
            "features": list(FEATURE_NAMES),
            "min_weight": self.min_weight,
            "experts": {
                e: {"coef": list(self.coef[e]), "bias": self.bias[e], "examples": self.examples[e]} for e in MEMORIES
            },
        }

    @classmethod
    def from_json(cls, doc: object) -> LearnedRouter:
        """Validate and build; raises :class:`InvalidInput` naming the first problem."""
        if not isinstance(doc, dict):
            raise InvalidInput("a router document must be a JSON object")
        if doc.get("format") != FORMAT or doc.get("version") != VERSION:
            raise InvalidInput(f"not a {FORMAT} version {VERSION} document")
        if doc.get("features") != list(FEATURE_NAMES):
            raise InvalidInput(f"router features must be {list(FEATURE_NAMES)}, got {doc.get('features')!r}")
        experts = doc.get("experts")
        if not isinstance(experts, dict) or set(experts) != set(MEMORIES):
            raise InvalidInput(f"router experts must be exactly {list(MEMORIES)}")
        coef: dict[str, list[float]] = {}
        bias: dict[str, float] = {}
        count: dict[str, int] = {}
        for e in MEMORIES:
            spec = experts[e]
            if not isinstance(spec, dict) or set(spec) != {"coef", "bias", "examples"}:
                raise InvalidInput(f"router expert {e}: needs exactly coef, bias, examples")
            c, b, n = spec["coef"], spec["bias"], spec["examples"]
            if not isinstance(c, list) or len(c) != len(FEATURE_NAMES) or not all(_finite(v) for v in c):
                raise InvalidInput(f"router expert {e}: coef must be {len(FEATURE_NAMES)} finite numbers")
            if not _finite(b):
                raise InvalidInput(f"router expert {e}: bias must be a finite number")
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise InvalidInput(f"router expert {e}: examples must be a non-negative integer")
            coef[e], bias[e], count[e] = c, b, n
        mw = doc.get("min_weight")
        if not _finite(mw) or not 0.0 <= mw <= 1.0:  # type: ignore[operator]  # _finite checked the type
            raise InvalidInput("router min_weight must be a number in [0, 1]")
        return cls(coef, bias, count, min_weight=float(mw))  # type: ignore[arg-type]

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the router as JSON, atomically (a temporary file, then a rename)."""
        target = Path(path)
        tmp = target.with_name(target.name + ".tmp")
        private_file(tmp).write_text(json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, target)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> LearnedRouter:
        """Read and validate a router file; :class:`InvalidInput` names the file and the problem."""
        try:
            doc = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InvalidInput(f"{path}: cannot read a router ({exc})") from exc
        try:
            return cls.from_json(doc)
        except InvalidInput as exc:
            raise InvalidInput(f"{path}: {exc}") from exc


def _finite(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


Array = npt.NDArray[np.float64]


def _fit_one(x: Array, y: Array, l2: float, iterations: int) -> Array:
    """Ridge-penalised logistic regression by Newton's method; returns [coef..., bias]."""
    a = np.hstack([x, np.ones((x.shape[0], 1))])
    w = np.zeros(a.shape[1])
    eye = l2 * np.eye(a.shape[1])
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-np.clip(a @ w, -30.0, 30.0)))
        grad = a.T @ (p - y) + l2 * w
        hess = (a.T * (p * (1.0 - p))) @ a + eye
        step = np.linalg.solve(hess, grad)
        w = w - step
        if float(np.max(np.abs(step))) < 1e-10:
            break
    return w


def fit_router(
    examples: Sequence[RouterExample], *, l2: float = 1.0, min_weight: float = 0.0, iterations: int = 50
) -> LearnedRouter:
    """Fit a :class:`LearnedRouter` on labelled examples (see :func:`label_example`).

    ``l2 > 0`` is the ridge penalty on every coefficient (bias included); an expert with no
    labelled example stays untrained (weight 1). Deterministic: no randomness is used.
    """
    if not l2 > 0 or not math.isfinite(l2):
        raise InvalidInput(f"l2 must be a positive number, got {l2}")
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise InvalidInput(f"iterations must be a positive integer, got {iterations!r}")
    coef: dict[str, list[float]] = {}
    bias: dict[str, float] = {}
    count: dict[str, int] = {}
    for e in MEMORIES:
        rows = [(ex.features.vector(), 1.0 if ex.labels[e] else 0.0) for ex in examples if e in ex.labels]
        count[e] = len(rows)
        if not rows:
            coef[e], bias[e] = [0.0] * len(FEATURE_NAMES), 0.0
            continue
        w = _fit_one(np.vstack([r for r, _ in rows]), np.array([y for _, y in rows]), l2, iterations)
        coef[e], bias[e] = [float(v) for v in w[:-1]], float(w[-1])
    return LearnedRouter(coef, bias, count, min_weight=min_weight)

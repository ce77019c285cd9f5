"""The fitted-parameter file (``msm-mem-fitted`` version 1): what ``msm-mem eval`` fits on the
fine-tune split, saved as ``fitted.npz`` beside the results and read by the ``fitted`` backbone.

The file is a NumPy ``.npz`` archive read with ``allow_pickle=False`` (no Python object is ever
unpickled). It holds:

- ``meta``: a ``uint8`` array of UTF-8 JSON::

    {"format": "msm-mem-fitted", "version": 1, "encoder": "pixels", "dim": 4160,
     "gate_features": [...GATE_FEATURES], "fit": {...how it was fitted, for the record...},
     "groups": [{"question_type": "label", "question": "...", "classes": ["COVID-19", ...],
                 "examples": 140, "patients": 71, "gate_examples": 400, "gate": true,
                 "strategy": "router"}, ...]}

- per group ``i`` (the order of ``meta.groups``): ``g{i}.coef`` (``classes x dim`` float64) and
  ``g{i}.intercept`` (``classes``): the memory-free classifier, ``softmax(coef @ z + intercept)``
  over the encoder's unit embedding ``z``; and ``g{i}.gate_coef`` (``len(GATE_FEATURES)``) and
  ``g{i}.gate_intercept`` (1): the router, ``sigmoid(gate_coef @ x + gate_intercept)`` = the
  probability that an expert's proposed answer is right (features ``x``:
  :data:`GATE_FEATURES`, built by :func:`msm_mem.plugins.backbones.fitted.proposals`).

A group's ``strategy`` (one of :data:`STRATEGIES`; ``router`` when absent) says how it answers;
``msm-mem eval`` chooses it per group by cross-validation over the fine-tune patients.

A question group is ``(question_type, question)``; the backbone finds a query's group by its
question text. Every number must be finite and every shape must match, else :func:`load` raises
:class:`~msm_mem._errors.InvalidInput` naming the problem.
"""

from __future__ import annotations

import json
import math
import os
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..._errors import InvalidInput

__all__ = ["EXPERTS", "FORMAT", "GATE_FEATURES", "STRATEGIES", "VERSION", "FittedGroup", "FittedModels", "load"]

FORMAT = "msm-mem-fitted"
VERSION = 1
#: the experts the router weighs: the three memories, claims, other patients' experience and
#: the memory-free model
EXPERTS: tuple[str, ...] = ("semantic", "episodic", "visual", "claim", "population", "model")
#: the router's features of one proposal (see :mod:`msm_mem.plugins.backbones.fitted`)
GATE_FEATURES: tuple[str, ...] = (
    *(f"is_{e}" for e in EXPERTS),
    "weight",
    "support",
    "recency",
    "same_patient",
    "agreement",
    "agrees_model",
    "tier",
    "own_evidence",
)
#: how a group answers (see :mod:`msm_mem.plugins.backbones.fitted`), chosen per group on the
#: fine-tune patients: the router over the experts, the patient's newest own evidence, the
#: nearest evidence of any patient, the untrained vote, or the memory-free model alone
STRATEGIES: tuple[str, ...] = ("router", "newest", "nearest", "vote", "model")
_MAX_FILE_BYTES = 512 * 1024 * 1024

Array = npt.NDArray[np.float64]


def _softmax(x: Array) -> Array:
    e = np.exp(x - np.max(x))
    out: Array = e / e.sum()
    return out


@dataclass(frozen=True, slots=True)
class FittedGroup:
    """The fitted models of one question group (see the module docstring)."""

    question_type: str
    question: str
    classes: tuple[str, ...]
    coef: Array
    intercept: Array
    gate_coef: Array | None = None
    gate_intercept: float = 0.0
    examples: int = 0
    patients: int = 0
    gate_examples: int = 0
    strategy: str = "router"

    @property
    def key(self) -> tuple[str, str]:
        return (self.question_type, self.question)

    def predict(self, z: npt.NDArray[Any]) -> tuple[str, float]:
        """The most probable class for the unit embedding ``z`` and its probability in [0, 1]
        (ties: the earlier class)."""
        p = _softmax(self.coef @ np.asarray(z, dtype=np.float64) + self.intercept)
        i = int(np.argmax(p))
        return self.classes[i], float(p[i])

    def gate(self, x: npt.NDArray[Any]) -> float | None:
        """The router's probability in [0, 1] that a proposal with features ``x`` is right;
        None when this group has no fitted router."""
        if self.gate_coef is None:
            return None
        a = float(self.gate_coef @ np.asarray(x, dtype=np.float64)) + self.gate_intercept
        return 1.0 / (1.0 + math.exp(-a)) if a >= 0 else math.exp(a) / (1.0 + math.exp(a))


@dataclass(frozen=True, slots=True)
class FittedModels:
    """Every fitted group, the encoder they were fitted on and how (``fit``, for the record)."""

    encoder: str
    dim: int
    groups: tuple[FittedGroup, ...]
    fit: Mapping[str, Any] = field(default_factory=dict)

    def group_for(self, question: str) -> FittedGroup | None:
        """The group whose question is ``question`` (whitespace-normalised), else None."""
        want = " ".join(question.split())
        return next((g for g in self.groups if " ".join(g.question.split()) == want), None)

    def meta(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "encoder": self.encoder,
            "dim": self.dim,
            "gate_features": list(GATE_FEATURES),
            "fit": dict(self.fit),
            "groups": [
                {
                    "question_type": g.question_type,
                    "question": g.question,
                    "classes": list(g.classes),
                    "examples": g.examples,
                    "patients": g.patients,
                    "gate_examples": g.gate_examples,
                    "gate": g.gate_coef is not None,
                    "strategy": g.strategy,
                }
                for g in self.groups
            ],
        }

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the ``.npz`` file (atomically: a temporary file, then a rename)."""
        arrays: dict[str, Array | npt.NDArray[np.uint8]] = {
            "meta": np.frombuffer(json.dumps(self.meta(), sort_keys=True).encode(), dtype=np.uint8)
        }
        for i, g in enumerate(self.groups):
            arrays[f"g{i}.coef"], arrays[f"g{i}.intercept"] = g.coef, g.intercept
            if g.gate_coef is not None:
                arrays[f"g{i}.gate_coef"] = g.gate_coef
                arrays[f"g{i}.gate_intercept"] = np.array([g.gate_intercept])
        target = Path(path)
        tmp = target.with_name(target.name + ".tmp")
        with open(tmp, "wb") as f:
            np.savez(f, allow_pickle=False, **arrays)
        os.replace(tmp, target)


def _finite(a: Array, name: str, shape: Sequence[int]) -> Array:
    if a.dtype.kind != "f" or a.shape != tuple(shape):
        raise InvalidInput(f"{name} must be a float array of shape {tuple(shape)}, got {a.dtype} {a.shape}")
    if not np.all(np.isfinite(a)):
        raise InvalidInput(f"{name} holds a number that is not finite")
    return a.astype(np.float64)


def _count(spec: Mapping[str, Any], key: str, where: str) -> int:
    n = spec.get(key, 0)
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise InvalidInput(f"{where}: {key} must be a non-negative integer")
    return n


def _group(i: int, spec: object, arrays: Mapping[str, npt.NDArray[Any]], dim: int) -> FittedGroup:
    where = f"group {i}"
    if not isinstance(spec, dict):
        raise InvalidInput(f"{where} must be a JSON object")
    qt, q, classes = spec.get("question_type"), spec.get("question"), spec.get("classes")
    if not isinstance(qt, str) or not qt or not isinstance(q, str) or not q.strip():
        raise InvalidInput(f"{where}: question_type and question must be non-empty text")
    if not isinstance(classes, list) or not classes or not all(isinstance(c, str) and c.strip() for c in classes):
        raise InvalidInput(f"{where}: classes must be a non-empty list of non-empty text")
    if len(set(classes)) != len(classes):
        raise InvalidInput(f"{where}: classes repeat")
    for name in (f"g{i}.coef", f"g{i}.intercept"):
        if name not in arrays:
            raise InvalidInput(f"{where}: array {name} is missing")
    coef = _finite(arrays[f"g{i}.coef"], f"g{i}.coef", (len(classes), dim))
    intercept = _finite(arrays[f"g{i}.intercept"], f"g{i}.intercept", (len(classes),))
    gate = bool(spec.get("gate", False))
    gate_coef, gate_intercept = None, 0.0
    if gate:
        for name in (f"g{i}.gate_coef", f"g{i}.gate_intercept"):
            if name not in arrays:
                raise InvalidInput(f"{where}: array {name} is missing")
        gate_coef = _finite(arrays[f"g{i}.gate_coef"], f"g{i}.gate_coef", (len(GATE_FEATURES),))
        gate_intercept = float(_finite(arrays[f"g{i}.gate_intercept"], f"g{i}.gate_intercept", (1,))[0])
    strategy = spec.get("strategy", "router")  # files written before the choice follow the router
    if strategy not in STRATEGIES:
        raise InvalidInput(f"{where}: strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    return FittedGroup(
        qt,
        q,
        tuple(classes),
        coef,
        intercept,
        gate_coef,
        gate_intercept,
        _count(spec, "examples", where),
        _count(spec, "patients", where),
        _count(spec, "gate_examples", where),
        strategy,
    )


def _read(path: Path) -> dict[str, npt.NDArray[Any]]:
    try:
        if not path.is_file():
            raise InvalidInput(f"{path}: not a regular file")
        if path.stat().st_size > _MAX_FILE_BYTES:
            raise InvalidInput(f"{path}: larger than {_MAX_FILE_BYTES} bytes")
        with np.load(path, allow_pickle=False) as npz:
            return {name: npz[name] for name in npz.files}
    except InvalidInput:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise InvalidInput(f"{path}: cannot read a fitted-parameter file ({type(exc).__name__}: {exc})") from exc


def load(path: str | os.PathLike[str]) -> FittedModels:
    """Read and validate a fitted-parameter file; :class:`InvalidInput` names the file and the
    problem (unreadable, not this format or version, a missing array, a shape that does not
    match, a number that is not finite)."""
    p = Path(path)
    arrays = _read(p)
    try:
        raw = arrays.get("meta")
        if raw is None or raw.dtype != np.uint8 or raw.ndim != 1:
            raise InvalidInput("the meta array is missing")
        try:
            meta = json.loads(raw.tobytes().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InvalidInput(f"meta is not JSON ({exc})") from exc
        if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise InvalidInput(f"not a {FORMAT} version {VERSION} file")
        if meta.get("gate_features") != list(GATE_FEATURES):
            raise InvalidInput(f"gate_features must be {list(GATE_FEATURES)}")
        encoder, dim, groups, fit = meta.get("encoder"), meta.get("dim"), meta.get("groups"), meta.get("fit", {})
        if not isinstance(encoder, str) or not encoder.strip():
            raise InvalidInput("encoder must name an encoder plugin")
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise InvalidInput("dim must be a positive integer")
        if not isinstance(groups, list) or not isinstance(fit, dict):
            raise InvalidInput("groups must be a list and fit an object")
        built = tuple(_group(i, spec, arrays, dim) for i, spec in enumerate(groups))
        if len({g.key for g in built}) != len(built):
            raise InvalidInput("a question group appears twice")
        return FittedModels(encoder, dim, built, fit)
    except InvalidInput as exc:
        raise InvalidInput(f"{p}: {exc}") from exc

"""The obvious baselines beside the memory configurations, so a reader sees whether structured
memory beats them.

Each baseline answers from a :class:`KnownStudies` list: what a memory would know at that
point of the protocol (the base memory's references, then every answered study, entered with
the reference when the ground truth arrives as feedback, else with the baseline's own answer).

- ``prior`` (no memory, population prior): the most frequent answer among all known studies,
  whatever the image and the patient.
- ``copy-prior``: the patient's own last known answer (latest time, then the largest study
  id); the population prior when the patient has none yet.
- ``nearest-neighbour`` (population scope): the answer of the known study whose image
  embedding has the largest cosine with the query's, over every patient (the patient's own
  studies included; ties: the earliest known).
- ``view`` (view only): the most frequent answer among known studies of the query's view
  (``PA``, ``AP``, ``L``, ...; compared case-insensitively), the population prior when none
  is known or the query carries no view. A run drops it when no row carries a view.

The memory-free model (the ``none`` row when the backbone is the nonparametric voter, which
cannot answer without memory) is :func:`majority`: the most frequent answer of the training
rows, fixed before probing.

Answers are compared after :func:`~msm_mem.eval.metrics.normalize_answer`; ties in the prior's
vote go to the smallest normalised text, and the text returned is the latest known wording of
it, so every baseline is deterministic.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .._errors import InvalidInput
from .metrics import normalize_answer

__all__ = ["BASELINES", "Known", "KnownStudies", "baseline_answer", "majority"]

#: Baseline names, in report order.
BASELINES: tuple[str, ...] = ("prior", "copy-prior", "nearest-neighbour", "view")

Vector = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class Known:
    """One study a baseline knows: who, when (UTC seconds), which, the answer, the unit
    embedding, the view (``""`` when not recorded)."""

    patient_id: str
    timestamp: float
    study_id: str
    answer: str
    z: Vector
    view: str = ""


class KnownStudies:
    """An append-only list of known studies with the indexes the baselines need."""

    def __init__(self, items: Iterable[Known] = ()) -> None:
        self._items: list[Known] = []
        self._votes: Counter[str] = Counter()
        self._view_votes: dict[str, Counter[str]] = {}
        self._wording: dict[str, tuple[float, str, str]] = {}
        self._last: dict[str, Known] = {}
        self._matrix: Vector | None = None
        for item in items:
            self.add(item)

    def __len__(self) -> int:
        return len(self._items)

    def add(self, item: Known) -> None:
        """Learn one study; a study with an empty answer counts for nearest neighbour only."""
        self._items.append(item)
        self._matrix = None
        key = normalize_answer(item.answer)
        if key:
            self._votes[key] += 1
            if view := item.view.strip().casefold():
                self._view_votes.setdefault(view, Counter())[key] += 1
            order = (item.timestamp, item.study_id, item.answer)
            if key not in self._wording or order > self._wording[key]:
                self._wording[key] = order
            last = self._last.get(item.patient_id)
            if last is None or (item.timestamp, item.study_id) >= (last.timestamp, last.study_id):
                self._last[item.patient_id] = item

    def copy(self) -> KnownStudies:
        """An independent copy (a scratch memory for the frozen probe)."""
        return KnownStudies(self._items)

    def prior(self) -> str:
        """The most frequent known answer (see the module docstring); ``""`` when none."""
        return self._most(self._votes)

    def of_view(self, view: str) -> str:
        """The most frequent known answer among studies of ``view``, else the population prior."""
        return self._most(self._view_votes.get(view.strip().casefold(), Counter())) or self.prior()

    def _most(self, votes: Counter[str]) -> str:
        if not votes:
            return ""
        best = min(votes, key=lambda k: (-votes[k], k))
        return self._wording[best][2]

    def last_of(self, patient_id: str) -> str:
        """The patient's last known answer, else the population prior."""
        item = self._last.get(patient_id)
        return item.answer if item is not None else self.prior()

    def nearest(self, z: Vector) -> str:
        """The answer of the most similar known study (cosine of unit vectors); ``""`` when none."""
        if not self._items:
            return ""
        if self._matrix is None:
            self._matrix = np.stack([i.z for i in self._items]).astype(np.float32, copy=False)
        return self._items[int(np.argmax(self._matrix @ z))].answer


def majority(answers: Iterable[tuple[float, str, str]]) -> str:
    """The most frequent of ``(timestamp, study_id, answer)`` answers after normalisation (ties:
    the smallest normalised text; the latest wording of it); ``""`` when none is non-empty."""
    zero = np.zeros(0, dtype=np.float32)
    return KnownStudies(Known("", t, study, answer, zero) for t, study, answer in answers).prior()


def baseline_answer(name: str, known: KnownStudies, patient_id: str, z: Vector, view: str = "") -> str:
    """Answer with baseline ``name`` (one of :data:`BASELINES`) for a query of ``patient_id``
    with embedding ``z`` and ``view``; raises :class:`InvalidInput`."""
    if name == "view":
        return known.of_view(view)
    if name == "prior":
        return known.prior()
    if name == "copy-prior":
        return known.last_of(patient_id)
    if name == "nearest-neighbour":
        return known.nearest(z)
    raise InvalidInput(f"unknown baseline {name!r}; known: {', '.join(BASELINES)}")

"""The paper's subject-level split (section 3.1): memory / fine-tune / validation = 30/60/10,
and inside the memory split a base memory (4%) and write-back phases WB1..WB4 (6/6/6/8%).

The paper's phase percentages are of the whole set: 4 + 6 + 6 + 6 + 8 = 30, the memory split.
Here every percentage applies to *patients*, never to studies, so a patient's studies stay in
one part (no patient leaks between memory and validation). Counts come from the largest
remainder method:

1. each part gets ``floor(n x share)`` patients;
2. the patients left over go one each to the parts with the largest fractional remainders
   (ties: the earlier part in the order given);
3. when there are at least as many patients as parts, a part left empty takes one patient from
   the largest part (ties: the earlier part), so every part gets at least one when possible
   (a part with a zero share stays empty).

Which patients fall where is a seeded shuffle of the sorted patient ids
(``numpy.random.default_rng(seed)``), so the split depends only on the set of ids and the seed.

Cross-validation (:func:`fold_patients`): the shuffled patients are cut into ``folds`` parts of
near-equal size (largest remainder); fold ``k`` validates on part ``k`` and splits the other
patients into memory and fine-tune by the same 30:60 weights (and the memory into its phases as
above), so every patient is validated exactly once over the folds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from .._errors import InvalidInput

__all__ = ["PHASES", "PHASE_SHARES", "SPLIT_SHARES", "Split", "fold_patients", "largest_remainder", "split_patients"]

#: memory, fine-tune, validation (fractions of all patients)
SPLIT_SHARES: tuple[float, float, float] = (0.30, 0.60, 0.10)
#: Base, WB1, WB2, WB3, WB4 (percent of all patients; they add up to the memory split's 30)
PHASE_SHARES: tuple[float, ...] = (4.0, 6.0, 6.0, 6.0, 8.0)
PHASES: tuple[str, ...] = ("Base", "WB1", "WB2", "WB3", "WB4")


def largest_remainder(n: int, shares: Sequence[float]) -> list[int]:
    """Split ``n`` items into ``len(shares)`` whole counts proportional to ``shares``.

    The counts add up to ``n``; each is ``floor`` or ``ceil`` of its exact quota, except that
    when there are at least as many items as positive shares no such part is left at 0 (it
    takes one item from the largest part); a zero share always gets 0. Shares are non-negative
    weights (they need not add up to 1). Raises :class:`InvalidInput` for a negative ``n``, no
    shares, or shares that are negative, not finite or all zero.
    """
    if n < 0:
        raise InvalidInput(f"cannot split a negative number of items ({n})")
    if not shares or any(not math.isfinite(s) or s < 0 for s in shares) or sum(shares) <= 0:
        raise InvalidInput(f"shares must be non-negative finite numbers, not all zero; got {list(shares)}")
    total = float(sum(shares))
    quotas = [n * s / total for s in shares]
    counts = [math.floor(q) for q in quotas]
    order = sorted(range(len(shares)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in order[: n - sum(counts)]:
        counts[i] += 1
    wanted = [i for i, share in enumerate(shares) if share > 0]
    if n >= len(wanted):
        for i in wanted:
            if counts[i] == 0:
                donor = max(range(len(counts)), key=lambda j: (counts[j], -j))
                counts[donor] -= 1
                counts[i] += 1
    return counts


@dataclass(frozen=True, slots=True)
class Split:
    """Patient ids per part; the parts are pairwise disjoint and cover every patient.

    ``phases`` holds the memory split's five parts in :data:`PHASES` order (Base, WB1..WB4);
    ``finetune`` is kept for the paper's shape (a nonparametric backbone trains on nothing).
    Each tuple is sorted. ``fold`` is this split's fold (0-based) of ``folds``; one fold is
    the paper's single 30/60/10 split.
    """

    phases: tuple[tuple[str, ...], ...]
    finetune: tuple[str, ...]
    validation: tuple[str, ...]
    seed: int
    fold: int = 0
    folds: int = 1

    @property
    def memory(self) -> tuple[str, ...]:
        """Every memory-split patient (Base and the write-back phases), sorted."""
        return tuple(sorted(p for phase in self.phases for p in phase))

    def phase_of(self) -> dict[str, str]:
        """Patient id -> ``Base``/``WB1``../``finetune``/``validation``."""
        out = {p: name for name, phase in zip(PHASES, self.phases, strict=True) for p in phase}
        out.update({p: "finetune" for p in self.finetune})
        out.update({p: "validation" for p in self.validation})
        return out

    def counts(self) -> dict[str, int]:
        """Number of patients per part (phases by name, then memory, finetune, validation)."""
        out = {name: len(phase) for name, phase in zip(PHASES, self.phases, strict=True)}
        out.update(memory=len(self.memory), finetune=len(self.finetune), validation=len(self.validation))
        return out


def split_patients(
    patient_ids: Iterable[str],
    *,
    seed: int = 0,
    shares: Sequence[float] = SPLIT_SHARES,
    phase_shares: Sequence[float] = PHASE_SHARES,
) -> Split:
    """Split the distinct ``patient_ids`` into memory phases, fine-tune and validation.

    ``shares`` are the (memory, fine-tune, validation) weights and ``phase_shares`` the Base,
    WB1..WB4 weights inside the memory split (see the module docstring for rounding). The
    same ids and seed always give the same split. Raises :class:`InvalidInput` when there are
    fewer than three patients or the shapes are wrong.
    """
    ids = sorted(set(patient_ids))
    if len(ids) < 3:
        raise InvalidInput(f"a subject-level split needs at least 3 patients, got {len(ids)}")
    if len(shares) != 3 or len(phase_shares) != len(PHASES):
        raise InvalidInput(f"need 3 split shares and {len(PHASES)} phase shares")
    order = _shuffled(ids, seed)
    n_mem, n_ft, n_val = largest_remainder(len(ids), shares)
    if n_val == 0 or n_mem == 0:  # only with a zero share
        raise InvalidInput(f"shares {list(shares)} leave the memory or validation split empty")
    memory, finetune, validation = order[:n_mem], order[n_mem : n_mem + n_ft], order[n_mem + n_ft :]
    return Split(_phases(memory, phase_shares), tuple(sorted(finetune)), tuple(sorted(validation)), seed)


def fold_patients(
    patient_ids: Iterable[str],
    folds: int,
    *,
    seed: int = 0,
    shares: Sequence[float] = SPLIT_SHARES,
    phase_shares: Sequence[float] = PHASE_SHARES,
) -> tuple[Split, ...]:
    """Patient-level cross-validation: ``folds`` splits whose validation parts are disjoint and
    cover every patient (see the module docstring). ``folds == 1`` is :func:`split_patients`.
    Only the memory and fine-tune weights of ``shares`` are read when ``folds > 1``. Raises
    :class:`InvalidInput` when ``folds`` is not a whole number from 1 to the number of patients
    less two (every fold needs a memory patient and a validation patient besides)."""
    ids = sorted(set(patient_ids))
    if isinstance(folds, bool) or not isinstance(folds, int) or folds < 1:
        raise InvalidInput(f"folds must be a whole number of at least 1, got {folds!r}")
    if folds == 1:
        return (split_patients(ids, seed=seed, shares=shares, phase_shares=phase_shares),)
    if len(ids) < folds + 2:
        raise InvalidInput(f"{folds} folds need at least {folds + 2} patients, got {len(ids)}: use fewer folds")
    if len(shares) != 3 or len(phase_shares) != len(PHASES):
        raise InvalidInput(f"need 3 split shares and {len(PHASES)} phase shares")
    order = _shuffled(ids, seed)
    out: list[Split] = []
    start = 0
    for fold, size in enumerate(largest_remainder(len(ids), [1.0] * folds)):
        validation = order[start : start + size]
        rest = order[:start] + order[start + size :]
        start += size
        n_mem, _ = largest_remainder(len(rest), shares[:2])
        if n_mem == 0:
            raise InvalidInput(f"shares {list(shares)} leave the memory split empty")
        out.append(
            Split(
                _phases(rest[:n_mem], phase_shares),
                tuple(sorted(rest[n_mem:])),
                tuple(sorted(validation)),
                seed,
                fold,
                folds,
            )
        )
    return tuple(out)


def _shuffled(ids: list[str], seed: int) -> list[str]:
    return [ids[i] for i in np.random.default_rng(seed).permutation(len(ids))]


def _phases(memory: list[str], phase_shares: Sequence[float]) -> tuple[tuple[str, ...], ...]:
    phases: list[tuple[str, ...]] = []
    start = 0
    for count in largest_remainder(len(memory), phase_shares):
        phases.append(tuple(sorted(memory[start : start + count])))
        start += count
    return tuple(phases)

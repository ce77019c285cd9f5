"""First studies and follow-ups apart: what memory adds where it can only copy, and where it can't.

A *first study* is an answer about a patient's study with no earlier study of that patient in
the same probe (:attr:`~.records.Answered.prior` is ``""`` for every arm's answer about it; the
agent arms record the prior study, the baselines answer the same rows): the patient's own
memory holds nothing, so only population experience (and the image) can help. A *follow-up* has at least one
earlier study of the patient: copying the patient's last answer (``copy-prior``) is the bar
there, since many outcomes are constant per patient.

For each scope (every answer, then each question type), mode, phase and arm: the number of
answers ``n`` of each cohort (the pairing: every arm of a mode and phase answers the same rows,
except the fitted arms, which answer the question groups they were fitted on) and the scope's
primary metric (:data:`~.scores.PRIMARY`) with its 95% bootstrap interval over patients.
The tables show the final phase per mode, and the first studies' curve from Base to the last
phase in the frozen probe, where growing population experience is what should help.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from .metrics import bootstrap_ci
from .records import MODES, Answered, ProtocolRun
from .scores import ALL, PER_ANSWER, PRIMARY, SCOPE_METRICS, in_scope
from .split import PHASES

__all__ = ["COHORTS", "cohort_of", "cohort_records", "cohorts_markdown", "follow_up_rows"]

#: the cohorts, in report order
COHORTS: tuple[str, ...] = ("first", "follow-up")


def cohort_of(answer: Answered, follow_ups: frozenset[tuple[str, str, str, str, int]] = frozenset()) -> str:
    """``first`` for an answer about a patient's first study in its probe, else ``follow-up``
    (its own ``prior``, or its row among ``follow_ups``: see :func:`follow_up_rows`)."""
    row = (answer.mode, answer.phase, answer.patient_id, answer.study_id, answer.fold)
    return "follow-up" if answer.prior or row in follow_ups else "first"


def follow_up_rows(answers: Sequence[Answered]) -> frozenset[tuple[str, str, str, str, int]]:
    """The (mode, phase, patient, study, fold) rows some arm answered with a prior study: every arm
    answering that row answers a follow-up."""
    return frozenset((a.mode, a.phase, a.patient_id, a.study_id, a.fold) for a in answers if a.prior)


def _primary(answers: Sequence[Answered], kind: str, n_boot: int, seed: int) -> dict[str, float]:
    fn = PER_ANSWER[PRIMARY[kind]]
    by_patient: dict[str, list[float]] = defaultdict(list)
    for a in answers:
        by_patient[a.patient_id].append(fn(a.prediction, a.reference))
    mean, lo, hi = bootstrap_ci(by_patient, n_resamples=n_boot, seed=seed)
    return {"mean": mean, "lo": lo, "hi": hi}


def cohort_records(run: ProtocolRun, *, n_boot: int = 1000) -> list[dict[str, Any]]:
    """One record per (scope, cohort, mode, phase, arm) with answers: ``question_type``
    (``all`` or a type), ``cohort``, ``mode``, ``phase``, ``arm``, ``n``, ``patients``,
    ``metric`` (the primary metric's name) and ``score`` (mean, lo, hi in [0, 1])."""
    kinds = [ALL] + [k for k in SCOPE_METRICS if k != ALL and any(a.question_type == k for a in run.answers)]
    follow_ups = follow_up_rows(run.answers)
    groups: dict[tuple[str, str, str, str, str], list[Answered]] = defaultdict(list)
    for kind in kinds:
        for a in in_scope(run.answers, kind, ""):
            groups[(kind, cohort_of(a, follow_ups), a.mode, a.phase, a.arm)].append(a)
    out = []
    for kind in kinds:
        for cohort in COHORTS:
            for mode in MODES:
                for phase in PHASES:
                    for arm in run.arms:
                        if answers := groups.get((kind, cohort, mode, phase, arm)):
                            out.append(
                                {
                                    "question_type": kind,
                                    "cohort": cohort,
                                    "mode": mode,
                                    "phase": phase,
                                    "arm": arm,
                                    "n": len(answers),
                                    "patients": len({a.patient_id for a in answers}),
                                    "metric": PRIMARY[kind],
                                    "score": _primary(answers, kind, n_boot, run.settings.seed),
                                }
                            )
    return out


def _cell(record: dict[str, Any] | None) -> str:
    if record is None:
        return "—"
    s = record["score"]
    return f"{100 * s['mean']:.1f} [{100 * s['lo']:.1f}, {100 * s['hi']:.1f}] (n={record['n']})"


def cohorts_markdown(records: Sequence[dict[str, Any]], run: ProtocolRun, *, titles: dict[str, str]) -> str:
    """The cohort tables: per scope and mode at the final phase, each arm's primary metric on
    first studies and on follow-ups (with n); then the first studies across the phases of the
    frozen probe. ``titles`` names the arms."""
    final = PHASES[-1]
    index = {(r["question_type"], r["cohort"], r["mode"], r["phase"], r["arm"]): r for r in records}
    kinds = list(dict.fromkeys(r["question_type"] for r in records))
    lines = [
        f"# First studies and follow-ups at {final}",
        "",
        "A first study has no earlier study of its patient in the probe (only population experience",
        "can help); a follow-up has one (copying the patient's last answer is the bar). Percent, the",
        "scope's primary metric, 95% bootstrap interval over patients, n answers of the cohort.",
        "",
    ]
    for kind in kinds:
        for mode in reversed(MODES):
            arms = [a for a in run.arms if any((kind, c, mode, final, a) in index for c in COHORTS)]
            if not arms:
                continue
            metric = PRIMARY[kind]
            lines += [
                f"## {kind} ({metric}), {mode}",
                "",
                "| Configuration | first studies | follow-ups |",
                "|---|---:|---:|",
            ]
            for arm in arms:
                cells = [_cell(index.get((kind, c, mode, final, arm))) for c in COHORTS]
                lines.append(f"| {titles.get(arm, arm)} | " + " | ".join(cells) + " |")
            lines.append("")
    lines += [
        "# First studies across the phases (frozen probe)",
        "",
        "| Configuration | scope | " + " | ".join(PHASES) + " |",
        "|---|---|" + "---:|" * len(PHASES),
    ]
    for kind in kinds:
        for arm in run.arms:
            found = [index.get((kind, "first", "frozen", p, arm)) for p in PHASES]
            if not any(found):
                continue
            shown = [f"{100 * c['score']['mean']:.1f}" if c else "—" for c in found]
            lines.append(f"| {titles.get(arm, arm)} | {kind} | " + " | ".join(shown) + " |")
    lines.append("")
    return "\n".join(lines)

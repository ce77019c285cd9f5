"""The paper's evaluation protocol over write-back phases (section 3.1, Table 1, Figure 6).

Patients are split (:mod:`msm_mem.eval.split`): Base builds the base memory from ground truth
(the offline loop); WB1..WB4 are the write-back phases; the validation patients are probed.
Every *arm* (a memory configuration, one of the 8 subsets of S, E, V, or a baseline from
:mod:`msm_mem.eval.baselines`) starts from its own copy of the same base memory and is probed
in two modes, both recorded:

- ``online`` (the paper's "probed at successive partitions"): each phase's studies are
  processed in time order through the online loop; each is answered and scored *before* it is
  written back, so a phase is scored on its own studies and the memory grows as it goes.
- ``frozen``: after Base and after each phase, the validation patients are answered against a
  scratch copy of the arm's memory (their own earlier studies answered and written back in
  time order, then the copy is thrown away), so every phase is scored on the same queries.

Cross-validation: with ``folds`` above 1 the patients are cut into that many folds
(:func:`~msm_mem.eval.split.fold_patients`) and the whole protocol runs once per fold, each
validating on its own fold, so every patient is probed once; every answer records its fold and
the scores pool all folds (their intervals resample patients over all of them).

The memory-free model: the nonparametric voter answers from memory only, so its ``none``
configuration would have no model at all; with it, the ``none`` row is the majority answer of
the group's training rows (Base and fine-tune patients), fixed before probing. With another
backbone ``none`` is that backbone without memory, the paper's row.

Question groups: rows are grouped by ``(question_type, question)``
(:func:`~msm_mem.eval.records.question_groups`). One patient split covers every group; each
group runs the whole protocol above on memories of its own (its own base memory, arms and
baselines), so an answer to one question is never evidence for another, and every answer
records its group.

Feedback: with ``truth`` the reference arrives after each answer as a critic verdict (the
signed report) and supersedes the agent's impression (accepted when it matches after
normalisation, otherwise corrected); with ``none`` only the agent's own answers are written
back, through the gate. With ``fit`` the fine-tune split is used as the paper uses it
(:mod:`msm_mem.eval.fit`): a memory-free image model and a router over the memory experts are
fitted on the fine-tune patients only, per question group on that group's fine-tune rows
(``fitted.npz`` in the group's work folder; the run's models hold every group and the report
saves them as one ``fitted.npz``), and run as two more arms of the group through ``MsmMem``
with the ``fitted`` backbone: ``ft`` (no memory) and ``SEV-ft``. A group with no answer shared
by enough fine-tune patients runs no fitted arm. Without ``fit`` the fine-tune split is unused.

Determinism: stores run on a :class:`~msm_mem._clock.FixedClock` (one day after the last
study), rows are processed in a fixed order and ties are broken by ids that never reach the
results, so the same rows, settings and seed give the same answers.
"""

from __future__ import annotations

import multiprocessing
import queue
import shutil
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from .. import MsmMem
from .._clock import FixedClock
from .._errors import InvalidInput
from .._records import ManifestRow
from .._settings import Settings
from ..plugins.backbones.base import BackboneRequest
from ..plugins.backbones.fitted_format import FittedModels
from ..plugins.backbones.fitted_format import load as load_fitted
from .arms import ADMIN, CRITIC, INGEST, SPARE, AgentArm, BaselineArm, FixedArm, Plan, Runner, key, memo_encoder
from .baselines import Known, KnownStudies, Vector, majority
from .fit import RecordingBackbone, combine_models, fit_models, fittable
from .records import (
    CONFIGS,
    FITTED_ARMS,
    MODES,
    Answered,
    ProtocolRun,
    ProtocolSettings,
    config_flags,
    fingerprint,
    memory_free,
    parse_configs,
    question_groups,
)
from .split import PHASES, Split, fold_patients

__all__ = [
    "CONFIGS",
    "CRITIC",
    "MODES",
    "Answered",
    "ProtocolRun",
    "ProtocolSettings",
    "config_flags",
    "fingerprint",
    "parse_configs",
    "run_protocol",
]

_TICKS: Any = None  # a worker process's progress queue (set by _init_worker)


def _init_worker(ticks: Any) -> None:
    global _TICKS
    _TICKS = ticks


def _agent_arm(plan: Plan, name: str, base: Path, tick: Callable[[int], object] | None = None) -> list[Answered]:
    """Run one memory configuration on a copy of ``base`` (also a worker process's entry point,
    which reports progress through its queue)."""
    directory = plan.work / "arms" / name
    shutil.rmtree(directory, ignore_errors=True)
    shutil.copytree(base, directory)
    runner = Runner(plan, tick or (_TICKS.put if _TICKS is not None else (lambda n: None)))
    try:
        answers = runner.run_arm(AgentArm(name, directory, runner))
        if plan.keep is not None:  # the arm's memory after WB4, for inspection
            shutil.rmtree(plan.keep / name, ignore_errors=True)
            shutil.move(directory, plan.keep / name)
        return answers
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _finetune_requests(plan: Plan, base: Path) -> list[tuple[ManifestRow, BackboneRequest]]:
    """The fine-tune studies in time order through the online loop (S+E+V, the nonparametric
    backbone, the protocol's feedback) on a copy of the Base memory: each with the request its
    answer was built from (the router's examples)."""
    directory = plan.work / "finetune"
    shutil.rmtree(directory, ignore_errors=True)
    shutil.copytree(base, directory)
    recorder = RecordingBackbone()
    arm = AgentArm("SEV", directory, Runner(plan, lambda n: None), backbone=recorder)
    out: list[tuple[ManifestRow, BackboneRequest]] = []
    try:
        for row in plan.parts["finetune"]:
            prediction, _, _ = arm.answer(row)
            out.append((row, recorder.requests[-1]))
            arm.learn(row, prediction)
    finally:
        arm.close(discard=True)
    return out


def _fit(plan: Plan, base: Path, encoder: str) -> FittedModels | None:
    """Fit the plan's question group on its fine-tune rows only and save the file its fitted
    arms read; None (the group runs no fitted arm) when no answer is shared by enough
    fine-tune patients."""
    rows = plan.parts["finetune"]
    if plan.fitted is None or not fittable(rows):
        return None
    models = fit_models(rows, plan.z, _finetune_requests(plan, base), encoder=encoder)
    models.save(plan.fitted)
    return load_fitted(plan.fitted)  # what the arms read, exactly


def _agents(plan: Plan) -> tuple[str, ...]:
    """The plan's agent arms: its configurations (but the memory-free ``none``, see
    :func:`~msm_mem.eval.records.memory_free`), then the fitted arms when it was fitted."""
    configs = tuple(c for c in plan.settings.configs if c != "none" or not memory_free(plan.settings))
    return (*configs, *(FITTED_ARMS if plan.fitted is not None else ()))


def _run_configs(tasks: Sequence[tuple[Plan, Path]], jobs: int, bar: tqdm[Any]) -> list[Answered]:
    """Every agent arm of every question group (``(plan, base memory)`` pairs), in that order,
    in up to ``jobs`` worker processes."""
    work = [(plan, name, base) for plan, base in tasks for name in _agents(plan)]
    if jobs <= 1 or len(work) <= 1:
        out: list[Answered] = []
        for plan, name, base in work:
            bar.set_description(f"eval {name}" + (f" ({plan.group[0]})" if len(tasks) > 1 else ""))
            out += _agent_arm(plan, name, base, bar.update)
        return out
    # spawn, not fork: the parent holds FAISS/OpenMP and tqdm threads that must not be forked
    ctx = multiprocessing.get_context("spawn")
    ticks = ctx.Queue()
    bar.set_description(f"eval {len(work)} arms in {min(jobs, len(work))} processes")
    with ProcessPoolExecutor(min(jobs, len(work)), mp_context=ctx, initializer=_init_worker, initargs=(ticks,)) as pool:
        futures = [pool.submit(_agent_arm, plan, name, base) for plan, name, base in work]
        while not all(f.done() for f in futures):
            try:
                bar.update(ticks.get(timeout=0.2))
            except queue.Empty:
                pass
        answers = [a for f in futures for a in f.result()]
    while not ticks.empty():
        bar.update(ticks.get())
    ticks.close()
    return answers


def _plans(
    split: Split,
    groups: Sequence[tuple[str, str]],
    order: Sequence[ManifestRow],
    settings: ProtocolSettings,
    store_settings: Settings,
    t0: float,
    z: dict[tuple[str, str], Vector],
    work: Path,
    keep: Path | None,
) -> list[Plan]:
    """One fold's plan per question group."""
    where = split.phase_of()
    plans = []
    for i, group in enumerate(groups):
        mine = [r for r in order if (r.question_type, r.question) == group]
        parts = {name: [r for r in mine if where[r.patient_id] == name] for name in (*PHASES, *SPARE)}
        # one group keeps the single-question layout (work/arms, keep/<configuration>)
        sub = "" if len(groups) == 1 else f"q{i}-{group[0]}"
        fitted_at = work / sub / "fitted.npz" if settings.fit else None
        plans.append(
            Plan(
                settings,
                store_settings,
                t0,
                parts,
                z,
                work / sub,
                None if keep is None else keep / sub,
                group,
                fitted_at,
                split.fold,
            )
        )
    return plans


def _run_fold(plans: list[Plan], jobs: int, bar: tqdm[Any]) -> tuple[list[Answered], list[FittedModels]]:
    """Every arm of one fold's question groups: its answers and the models it fitted."""
    settings = plans[0].settings
    answers: list[Answered] = []
    fitted_groups: list[FittedModels] = []
    agents = len(settings.configs) + (len(FITTED_ARMS) if settings.fit else 0)
    if agents:
        tasks = []
        for i, plan in enumerate(plans):
            base = plan.work / "base"
            with MsmMem.init(base, ADMIN, settings=plan.memory, clock=FixedClock(plan.t0), key_home=plan.keys) as mem:
                mem.ingest(INGEST, plan.parts["Base"])
            if plan.keep is not None:
                plan.keep.mkdir(parents=True, exist_ok=True)
            if settings.fit:
                bar.set_description("eval: fitting the fine-tune split")
                if (models := _fit(plan, base, settings.encoder)) is None:
                    plan = plans[i] = replace(plan, fitted=None)
                else:
                    fitted_groups.append(models)
            tasks.append((plan, base))
        answers += _run_configs(tasks, jobs, bar)
    for plan in plans:
        if memory_free(plan.settings):
            training = [(r.timestamp, r.study_id, r.answer) for r in (*plan.parts["Base"], *plan.parts["finetune"])]
            answers += Runner(plan, bar.update).run_arm(FixedArm("none", majority(training)))
        for name in settings.baselines:
            bar.set_description(f"eval {name}")
            known = [
                Known(r.patient_id, r.timestamp, r.study_id, r.answer, plan.z[key(r)], r.view)
                for r in plan.parts["Base"]
            ]
            runner = Runner(plan, bar.update)
            answers += runner.run_arm(BaselineArm(name, KnownStudies(known), runner))
    return answers, fitted_groups


def run_protocol(
    rows: Sequence[ManifestRow],
    settings: ProtocolSettings | None = None,
    *,
    memory: Settings | None = None,
    work_dir: Path | None = None,
    dataset: str = "",
    jobs: int = 1,
    keep_stores: Path | None = None,
    progress: bool = False,
) -> ProtocolRun:
    """Run the protocol on labelled ``rows`` (rows with an empty answer are left out).

    ``memory`` holds the store settings (k, tau, gate; its encoder is replaced by the
    settings' encoder). Stores live in ``work_dir`` (a temporary folder when None, removed
    afterwards). Memory configurations run in up to ``jobs`` worker processes; the answers do
    not depend on ``jobs``. With ``keep_stores`` each configuration's store after WB4 is kept
    as ``keep_stores/<configuration>`` (replaced if present). With ``settings.fit`` each question
    group's fine-tune rows are fitted first (:mod:`msm_mem.eval.fit`, saved as ``fitted.npz`` in
    the group's work folder) and the arms ``ft`` and ``SEV-ft`` run beside its configurations;
    the run then carries every group's fitted models in one :class:`FittedModels` per fold.
    Returns every answer with its mode, phase, arm, question group and fold; metrics are
    computed by :mod:`msm_mem.eval.scores`. With several question groups each group's stores
    live in ``work_dir/q<i>-<type>`` and are kept as ``keep_stores/q<i>-<type>/<configuration>``;
    with several folds each fold's under ``fold<k>/`` of those folders. The ``none``
    configuration with the nonparametric backbone is the memory-free majority model
    (:func:`~msm_mem.eval.baselines.majority` of the group's Base and fine-tune rows); the
    ``view`` baseline is dropped when no row carries a view. Raises :class:`InvalidInput` for
    no labelled row, fewer than 3 labelled patients, or fewer than ``folds + 2``.
    """
    settings = settings or ProtocolSettings()
    labelled = [r for r in rows if r.answer.strip()]
    if not labelled:
        raise InvalidInput("no labelled rows to evaluate (every row's answer is empty)")
    store_settings = (memory or Settings()).with_(encoder=settings.encoder)
    patients = {r.patient_id for r in labelled}
    if len(patients) < 3:
        raise InvalidInput(
            f"the subject-level split (memory / fine-tune / validation) needs at least 3 labelled patients, "
            f"got {len(patients)}"
        )
    splits = fold_patients(patients, settings.folds, seed=settings.seed)
    if "view" in settings.baselines and not any(r.view.strip() for r in labelled):
        settings = replace(settings, baselines=tuple(b for b in settings.baselines if b != "view"))
    order = sorted(labelled, key=lambda r: (r.timestamp, r.patient_id, r.study_id, r.question))
    groups = question_groups(labelled)
    z: dict[tuple[str, str], Vector] = {}
    encoder = memo_encoder(settings.encoder)  # this process's, on one torch thread (arms.memo_encoder)
    if settings.baselines or settings.fit:
        needed = list({key(r): r for r in order}.values())  # one image per study
        vectors = encoder.encode_paths([r.image for r in needed], progress=progress)
        z = {key(r): v for r, v in zip(needed, vectors, strict=True)}
    t0 = float(np.ceil(max(r.timestamp for r in labelled))) + 86_400.0
    answers: list[Answered] = []
    fitted: list[FittedModels | None] = []
    folds: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="msm-mem-eval-") as tmp:
        work = Path(work_dir) if work_dir is not None else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        keep = None if keep_stores is None else Path(keep_stores)
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
        one = len(splits) == 1
        fold_plans = [
            _plans(
                split,
                groups,
                order,
                settings,
                store_settings,
                t0,
                z,
                work if one else work / f"fold{split.fold}",
                keep if one or keep is None else keep / f"fold{split.fold}",
            )
            for split in splits
        ]
        arms = len(settings.configs) + (len(FITTED_ARMS) if settings.fit else 0) + len(settings.baselines)
        total = sum(plan.per_arm() for plans in fold_plans for plan in plans) * arms
        with tqdm(total=total, desc="eval", unit="answer", disable=not progress) as bar:
            for split, plans in zip(splits, fold_plans, strict=True):
                got, fitted_groups = _run_fold(plans, jobs, bar)
                answers += got
                where = split.phase_of()
                record = {
                    "finetune_patients": len(split.finetune),
                    "finetune_studies": len({key(r) for r in labelled if where[r.patient_id] == "finetune"}),
                }
                fitted.append(combine_models(fitted_groups, record))
                folds.append(
                    {
                        "fold": split.fold,
                        "studies": {
                            name: len({key(r) for r in labelled if where[r.patient_id] == name})
                            for name in (*PHASES, *SPARE)
                        },
                        "questions": [
                            {
                                "question_type": plan.group[0],
                                "question": plan.group[1],
                                "rows": {name: len(part) for name, part in plan.parts.items()},
                            }
                            for plan in plans
                        ],
                    }
                )
    data: dict[str, object] = {
        "name": dataset,
        "fingerprint": fingerprint(labelled),
        "rows": len(rows),
        "labelled": len(labelled),
        "patients": len(patients),
        "folds": folds,
    }
    return ProtocolRun(settings, store_settings, splits, data, answers, tuple(fitted))

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

Question groups: rows are grouped by ``(question_type, question)``
(:func:`~msm_mem.eval.records.question_groups`). One patient split covers every group; each
group runs the whole protocol above on memories of its own (its own base memory, arms and
baselines), so an answer to one question is never evidence for another, and every answer
records its group.

Feedback: with ``truth`` the reference arrives after each answer as a critic verdict (the
signed report) and supersedes the agent's impression (accepted when it matches after
normalisation, otherwise corrected); with ``none`` only the agent's own answers are written
back, through the gate. The fine-tune split is unused (a nonparametric backbone trains on
nothing); it is kept so the split has the paper's shape.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from .. import MsmMem, Principal, Purpose, Role
from .._clock import FixedClock
from .._errors import InvalidInput
from .._records import ManifestRow
from .._settings import Settings
from ..plugins.encoders import get_encoder
from .baselines import Known, KnownStudies, Vector, baseline_answer
from .metrics import normalize_answer
from .records import (
    CONFIGS,
    MODES,
    Answered,
    ProtocolRun,
    ProtocolSettings,
    config_flags,
    fingerprint,
    parse_configs,
    question_groups,
)
from .split import PHASES, split_patients

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

#: who acts in an evaluation (recorded in each store's audit trail)
CRITIC = Principal("report-signer", Role.CRITIC, Purpose.TREATMENT)
AGENT = Principal("msm-mem-agent", Role.AGENT, Purpose.TREATMENT)
INGEST = Principal("msm-mem-ingest", Role.SYSTEM, Purpose.OPERATIONS)
ADMIN = Principal("msm-mem-admin", Role.ADMIN, Purpose.OPERATIONS)


class _AgentArm:
    """A memory configuration on its own store directory."""

    def __init__(self, name: str, directory: Path, run: _Runner) -> None:
        self.name, self.directory, self.run = name, directory, run
        self.flags = config_flags(name)
        self.mem = run.open(directory)

    def fork(self, directory: Path) -> _AgentArm:
        self.mem.close()  # a store is copied closed, so its vector caches are on disk
        shutil.rmtree(directory, ignore_errors=True)
        shutil.copytree(self.directory, directory)
        self.mem = self.run.open(self.directory)
        return _AgentArm(self.name, directory, self.run)

    def answer(self, row: ManifestRow) -> tuple[str, str, tuple[str, ...]]:
        a = self.mem.ask(
            AGENT,
            row.patient_id,
            row.image,
            row.question,
            timestamp=row.timestamp,
            study_id=row.study_id,
            visual_tag=row.view,
            **self.flags,
        )
        studies = tuple(dict.fromkeys(s for s in a.studies if s))  # distinct studies of the evidence, in rank order
        if a.gate is None:
            return a.answer, "", studies
        return a.answer, "written" if a.gate.written else "discarded:" + "+".join(a.gate.reasons), studies

    def learn(self, row: ManifestRow, prediction: str) -> None:
        if self.run.plan.settings.feedback == "truth" and row.answer.strip():
            accept = normalize_answer(prediction) == normalize_answer(row.answer)
            correction = "" if accept else row.answer
            self.mem.feedback(
                CRITIC, row.patient_id, row.study_id, accept=accept, correction=correction, decision=row.decision
            )

    def close(self, *, discard: bool = False) -> None:
        self.mem.close()
        if discard:
            shutil.rmtree(self.directory, ignore_errors=True)


class _BaselineArm:
    """A baseline on its own list of known studies."""

    def __init__(self, name: str, known: KnownStudies, run: _Runner) -> None:
        self.name, self.known, self.run = name, known, run

    def fork(self, directory: Path) -> _BaselineArm:
        return _BaselineArm(self.name, self.known.copy(), self.run)

    def answer(self, row: ManifestRow) -> tuple[str, str, tuple[str, ...]]:
        return baseline_answer(self.name, self.known, row.patient_id, self.run.plan.z[_key(row)]), "", ()

    def learn(self, row: ManifestRow, prediction: str) -> None:
        text = row.answer if self.run.plan.settings.feedback == "truth" else prediction
        self.known.add(Known(row.patient_id, row.timestamp, row.study_id, text, self.run.plan.z[_key(row)]))

    def close(self, *, discard: bool = False) -> None:
        return None


_Arm = _AgentArm | _BaselineArm


def _key(row: ManifestRow) -> tuple[str, str]:
    return (row.patient_id, row.study_id)


@dataclass(frozen=True, slots=True)
class _Plan:
    """What every arm shares (picklable, for worker processes)."""

    settings: ProtocolSettings
    memory: Settings
    t0: float
    parts: dict[str, list[ManifestRow]]
    z: dict[tuple[str, str], Vector]
    work: Path
    keep: Path | None = None
    group: tuple[str, str] = ("text", "")

    def per_arm(self) -> int:
        return sum(len(self.parts[p]) for p in PHASES[1:]) + len(PHASES) * len(self.parts["validation"])


class _Runner:
    """Runs arms one after the other; ``tick(n)`` reports progress."""

    def __init__(self, plan: _Plan, tick: Callable[[int], object]) -> None:
        self.plan, self.tick = plan, tick
        self.answers: list[Answered] = []

    def open(self, directory: Path) -> MsmMem:
        p = self.plan
        return MsmMem.open(directory, settings=p.memory, clock=FixedClock(p.t0), backbone=p.settings.backbone)

    def probe(self, arm: _Arm, mode: str, phase: str, rows: Sequence[ManifestRow]) -> None:
        last: dict[str, str] = {}  # each patient's study answered before, in this probe
        for row in rows:
            prediction, gate, retrieved = arm.answer(row)
            prior = last.get(row.patient_id, "") if isinstance(arm, _AgentArm) else ""
            last[row.patient_id] = row.study_id
            kind, question = self.plan.group
            self.answers.append(
                Answered(
                    mode,
                    phase,
                    arm.name,
                    row.patient_id,
                    row.study_id,
                    prediction,
                    row.answer,
                    gate,
                    kind,
                    question,
                    prior,
                    retrieved,
                )
            )
            arm.learn(row, prediction)
            self.tick(1)

    def frozen(self, arm: _Arm, phase: str) -> None:
        scratch = arm.fork(self.plan.work / "scratch" / arm.name)
        try:
            self.probe(scratch, "frozen", phase, self.plan.parts["validation"])
        finally:
            scratch.close(discard=True)

    def run_arm(self, arm: _Arm) -> list[Answered]:
        try:
            self.frozen(arm, PHASES[0])
            for phase in PHASES[1:]:
                self.probe(arm, "online", phase, self.plan.parts[phase])
                self.frozen(arm, phase)
        finally:
            arm.close()
        return self.answers


_TICKS: Any = None  # a worker process's progress queue (set by _init_worker)


def _init_worker(ticks: Any) -> None:
    global _TICKS
    _TICKS = ticks


def _agent_arm(plan: _Plan, name: str, base: Path, tick: Callable[[int], object] | None = None) -> list[Answered]:
    """Run one memory configuration on a copy of ``base`` (also a worker process's entry point,
    which reports progress through its queue)."""
    directory = plan.work / "arms" / name
    shutil.rmtree(directory, ignore_errors=True)
    shutil.copytree(base, directory)
    runner = _Runner(plan, tick or (_TICKS.put if _TICKS is not None else (lambda n: None)))
    try:
        answers = runner.run_arm(_AgentArm(name, directory, runner))
        if plan.keep is not None:  # the arm's memory after WB4, for inspection
            shutil.rmtree(plan.keep / name, ignore_errors=True)
            shutil.move(directory, plan.keep / name)
        return answers
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _run_configs(tasks: Sequence[tuple[_Plan, Path]], jobs: int, bar: tqdm[Any]) -> list[Answered]:
    """Every memory configuration of every question group (``(plan, base memory)`` pairs), in
    that order, in up to ``jobs`` worker processes."""
    work = [(plan, name, base) for plan, base in tasks for name in plan.settings.configs]
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
    as ``keep_stores/<configuration>`` (replaced if present). Returns every answer with its
    mode, phase, arm and question group; metrics are computed by :mod:`msm_mem.eval.report`.
    With several question groups each group's stores live in ``work_dir/q<i>-<type>`` and are
    kept as ``keep_stores/q<i>-<type>/<configuration>``. Raises :class:`InvalidInput` for no
    labelled row or fewer than 3 labelled patients.
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
    split = split_patients(patients, seed=settings.seed)
    where = split.phase_of()
    order = sorted(labelled, key=lambda r: (r.timestamp, r.patient_id, r.study_id, r.question))
    groups = question_groups(labelled)
    z: dict[tuple[str, str], Vector] = {}
    if settings.baselines:
        needed = list({_key(r): r for r in order}.values())  # one image per study
        vectors = get_encoder(settings.encoder).encode_paths([r.image for r in needed], progress=progress)
        z = {_key(r): v for r, v in zip(needed, vectors, strict=True)}
    t0 = float(np.ceil(max(r.timestamp for r in labelled))) + 86_400.0
    answers: list[Answered] = []
    with tempfile.TemporaryDirectory(prefix="msm-mem-eval-") as tmp:
        work = Path(work_dir) if work_dir is not None else Path(tmp)
        keep = None if keep_stores is None else Path(keep_stores)
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
        plans = []
        for i, group in enumerate(groups):
            mine = [r for r in order if (r.question_type, r.question) == group]
            parts = {name: [r for r in mine if where[r.patient_id] == name] for name in (*PHASES, "validation")}
            # one group keeps the single-question layout (work/arms, keep/<configuration>)
            sub = "" if len(groups) == 1 else f"q{i}-{group[0]}"
            plans.append(
                _Plan(settings, store_settings, t0, parts, z, work / sub, None if keep is None else keep / sub, group)
            )
        total = sum(plan.per_arm() for plan in plans) * (len(settings.configs) + len(settings.baselines))
        with tqdm(total=total, desc="eval", unit="answer", disable=not progress) as bar:
            if settings.configs:
                tasks = []
                for plan in plans:
                    base = plan.work / "base"
                    with MsmMem.init(base, ADMIN, settings=store_settings, clock=FixedClock(t0)) as mem:
                        mem.ingest(INGEST, plan.parts["Base"])
                    if plan.keep is not None:
                        plan.keep.mkdir(parents=True, exist_ok=True)
                    tasks.append((plan, base))
                answers += _run_configs(tasks, jobs, bar)
            for plan in plans if settings.baselines else ():
                known = [Known(r.patient_id, r.timestamp, r.study_id, r.answer, z[_key(r)]) for r in plan.parts["Base"]]
                for name in settings.baselines:
                    bar.set_description(f"eval {name}")
                    runner = _Runner(plan, bar.update)
                    answers += runner.run_arm(_BaselineArm(name, KnownStudies(known), runner))
    data: dict[str, object] = {
        "name": dataset,
        "fingerprint": fingerprint(labelled),
        "rows": len(rows),
        "labelled": len(labelled),
        "patients": len(patients),
        "studies": {
            name: len({_key(r) for r in labelled if where[r.patient_id] == name}) for name in (*PHASES, "validation")
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
    return ProtocolRun(settings, store_settings, split, data, answers)

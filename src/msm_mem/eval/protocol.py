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

Feedback: with ``truth`` the reference arrives after each answer as a critic verdict (the
signed report) and supersedes the agent's impression (accepted when it matches after
normalisation, otherwise corrected); with ``none`` only the agent's own answers are written
back, through the gate. With ``fit`` the fine-tune split is used as the paper uses it
(:mod:`msm_mem.eval.fit`): a memory-free image model and a router over the memory experts are
fitted on the fine-tune patients only, saved in the run (``fitted.npz`` beside the reports) and
run as two more arms through ``MsmMem`` with the ``fitted`` backbone: ``ft`` (no memory) and
``SEV-ft``. Without ``fit`` the fine-tune split is unused.

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
from ..plugins.backbones.base import Backbone, BackboneRequest
from ..plugins.backbones.fitted_format import FittedModels
from ..plugins.backbones.fitted_format import load as load_fitted
from ..plugins.encoders import get_encoder
from .baselines import Known, KnownStudies, Vector, baseline_answer
from .fit import RecordingBackbone, fit_models, group_of
from .metrics import normalize_answer
from .records import (
    CONFIGS,
    FITTED_ARMS,
    MODES,
    Answered,
    ProtocolRun,
    ProtocolSettings,
    arm_config,
    config_flags,
    fingerprint,
    parse_configs,
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

    def __init__(self, name: str, directory: Path, run: _Runner, backbone: Backbone | None = None) -> None:
        self.name, self.directory, self.run, self.backbone = name, directory, run, backbone
        self.flags = config_flags(arm_config(name) or name)
        self.mem = run.open(directory, name, backbone)

    def fork(self, directory: Path) -> _AgentArm:
        self.mem.close()  # a store is copied closed, so its vector caches are on disk
        shutil.rmtree(directory, ignore_errors=True)
        shutil.copytree(self.directory, directory)
        self.mem = self.run.open(self.directory, self.name, self.backbone)
        return _AgentArm(self.name, directory, self.run, self.backbone)

    def answer(self, row: ManifestRow) -> tuple[str, str]:
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
        if a.gate is None:
            return a.answer, ""
        return a.answer, "written" if a.gate.written else "discarded:" + "+".join(a.gate.reasons)

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

    def answer(self, row: ManifestRow) -> tuple[str, str]:
        return baseline_answer(self.name, self.known, row.patient_id, self.run.plan.z[_key(row)]), ""

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
    fitted: Path | None = None

    def per_arm(self) -> int:
        return sum(len(self.parts[p]) for p in PHASES[1:]) + len(PHASES) * len(self.parts["validation"])


class _Runner:
    """Runs arms one after the other; ``tick(n)`` reports progress."""

    def __init__(self, plan: _Plan, tick: Callable[[int], object]) -> None:
        self.plan, self.tick = plan, tick
        self.answers: list[Answered] = []

    def open(self, directory: Path, arm: str, backbone: Backbone | None = None) -> MsmMem:
        p = self.plan
        clock = FixedClock(p.t0)
        if backbone is not None:
            return MsmMem.open(directory, settings=p.memory, clock=clock, backbone=backbone)
        if arm in CONFIGS or p.fitted is None:
            return MsmMem.open(directory, settings=p.memory, clock=clock, backbone=p.settings.backbone)
        options = {"path": str(p.fitted)}
        return MsmMem.open(directory, settings=p.memory, clock=clock, backbone="fitted", backbone_options=options)

    def probe(self, arm: _Arm, mode: str, phase: str, rows: Sequence[ManifestRow]) -> None:
        for row in rows:
            prediction, gate = arm.answer(row)
            qt, q = group_of(row)
            self.answers.append(
                Answered(mode, phase, arm.name, row.patient_id, row.study_id, prediction, row.answer, gate, qt, q)
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


def _finetune_requests(plan: _Plan, base: Path) -> list[tuple[ManifestRow, BackboneRequest]]:
    """The fine-tune studies in time order through the online loop (S+E+V, the nonparametric
    backbone, the protocol's feedback) on a copy of the Base memory: each with the request its
    answer was built from (the router's examples)."""
    directory = plan.work / "finetune"
    shutil.rmtree(directory, ignore_errors=True)
    shutil.copytree(base, directory)
    recorder = RecordingBackbone()
    arm = _AgentArm("SEV", directory, _Runner(plan, lambda n: None), backbone=recorder)
    out: list[tuple[ManifestRow, BackboneRequest]] = []
    try:
        for row in plan.parts["finetune"]:
            prediction, _ = arm.answer(row)
            out.append((row, recorder.requests[-1]))
            arm.learn(row, prediction)
    finally:
        arm.close(discard=True)
    return out


def _fit(plan: _Plan, base: Path, encoder: str) -> FittedModels:
    """Fit on the fine-tune split only and save the file the fitted arms read."""
    rows = plan.parts["finetune"]
    record = {"finetune_patients": len({r.patient_id for r in rows}), "finetune_studies": len(rows)}
    models = fit_models(rows, plan.z, _finetune_requests(plan, base), encoder=encoder, record=record)
    if plan.fitted is None:
        raise InvalidInput("a fitted run needs a path for its fitted parameters")
    models.save(plan.fitted)
    return load_fitted(plan.fitted)  # what the arms read, exactly


def _run_configs(plan: _Plan, base: Path, jobs: int, bar: tqdm[Any], configs: tuple[str, ...]) -> list[Answered]:
    if jobs <= 1 or len(configs) <= 1:
        out: list[Answered] = []
        for name in configs:
            bar.set_description(f"eval {name}")
            out += _agent_arm(plan, name, base, bar.update)
        return out
    # spawn, not fork: the parent holds FAISS/OpenMP and tqdm threads that must not be forked
    ctx = multiprocessing.get_context("spawn")
    ticks = ctx.Queue()
    bar.set_description(f"eval {len(configs)} configurations in {min(jobs, len(configs))} processes")
    with ProcessPoolExecutor(
        min(jobs, len(configs)), mp_context=ctx, initializer=_init_worker, initargs=(ticks,)
    ) as pool:
        futures = [pool.submit(_agent_arm, plan, name, base) for name in configs]
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
    as ``keep_stores/<configuration>`` (replaced if present). With ``settings.fit`` the fine-tune
    split is fitted first (:mod:`msm_mem.eval.fit`) and the arms ``ft`` and ``SEV-ft`` run beside
    the configurations; the run then carries the fitted models. Returns every answer with its
    mode, phase and arm; metrics are computed by :mod:`msm_mem.eval.report`. Raises
    :class:`InvalidInput` for fewer than 3 labelled patients.
    """
    settings = settings or ProtocolSettings()
    labelled = [r for r in rows if r.answer.strip()]
    if not labelled:
        raise InvalidInput("no labelled rows to evaluate")
    store_settings = (memory or Settings()).with_(encoder=settings.encoder)
    split = split_patients({r.patient_id for r in labelled}, seed=settings.seed)
    where = split.phase_of()
    order = sorted(labelled, key=lambda r: (r.timestamp, r.patient_id, r.study_id))
    parts = {name: [r for r in order if where[r.patient_id] == name] for name in (*PHASES, "finetune", "validation")}
    z: dict[tuple[str, str], Vector] = {}
    if settings.baselines or settings.fit:
        needed = [r for name in parts for r in parts[name]]
        vectors = get_encoder(settings.encoder).encode_paths([r.image for r in needed], progress=progress)
        z = {_key(r): v for r, v in zip(needed, vectors, strict=True)}
    t0 = float(np.ceil(max(r.timestamp for r in labelled))) + 86_400.0
    answers: list[Answered] = []
    fitted: FittedModels | None = None
    agents = (*settings.configs, *(FITTED_ARMS if settings.fit else ()))
    with tempfile.TemporaryDirectory(prefix="msm-mem-eval-") as tmp:
        work = Path(work_dir) if work_dir is not None else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        if keep_stores is not None:
            Path(keep_stores).mkdir(parents=True, exist_ok=True)
        keep = None if keep_stores is None else Path(keep_stores)
        plan = _Plan(settings, store_settings, t0, parts, z, work, keep, work / "fitted.npz" if settings.fit else None)
        total = plan.per_arm() * (len(agents) + len(settings.baselines))
        with tqdm(total=total, desc="eval", unit="answer", disable=not progress) as bar:
            if agents:
                base = work / "base"
                with MsmMem.init(base, ADMIN, settings=store_settings, clock=FixedClock(t0)) as mem:
                    mem.ingest(INGEST, parts["Base"])
                if settings.fit:
                    bar.set_description("eval: fitting the fine-tune split")
                    fitted = _fit(plan, base, settings.encoder)
                answers += _run_configs(plan, base, jobs, bar, agents)
            # baselines only: without them no embedding was computed
            known = [Known(r.patient_id, r.timestamp, r.study_id, r.answer, z[_key(r)]) for r in parts["Base"] if z]
            for name in settings.baselines:
                bar.set_description(f"eval {name}")
                runner = _Runner(plan, bar.update)
                answers += runner.run_arm(_BaselineArm(name, KnownStudies(known), runner))
    data: dict[str, object] = {
        "name": dataset,
        "fingerprint": fingerprint(labelled),
        "rows": len(rows),
        "labelled": len(labelled),
        "patients": len({r.patient_id for r in labelled}),
        "studies": {name: len(part) for name, part in parts.items()},
    }
    return ProtocolRun(settings, store_settings, split, data, answers, fitted)

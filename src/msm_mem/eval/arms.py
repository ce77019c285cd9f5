"""The arms of the evaluation protocol (:mod:`msm_mem.eval.protocol`) and the runner that
probes them: an agent arm is a memory configuration (or a fitted arm) on its own store through
the public ``MsmMem`` API, a baseline arm a list of known studies; a :class:`Plan` is what every
arm of one question group shares."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import MsmMem, Principal, Purpose, Role
from .._clock import FixedClock
from .._records import ManifestRow
from .._settings import Settings
from ..plugins.backbones.base import Backbone
from ..plugins.backbones.fitted import FittedBackbone
from ..plugins.encoders import get_encoder
from ..plugins.encoders.memo import MemoEncoder
from .baselines import Known, KnownStudies, Vector, baseline_answer
from .metrics import normalize_answer
from .records import CONFIGS, Answered, ProtocolSettings, arm_config, config_flags
from .split import PHASES

__all__ = [
    "ADMIN",
    "AGENT",
    "CRITIC",
    "INGEST",
    "SPARE",
    "AgentArm",
    "Arm",
    "BaselineArm",
    "FixedArm",
    "Plan",
    "Runner",
    "key",
    "memo_encoder",
]

#: who acts in an evaluation (recorded in each store's audit trail)
CRITIC = Principal("report-signer", Role.CRITIC, Purpose.TREATMENT)
AGENT = Principal("msm-mem-agent", Role.AGENT, Purpose.TREATMENT)
INGEST = Principal("msm-mem-ingest", Role.SYSTEM, Purpose.OPERATIONS)
ADMIN = Principal("msm-mem-admin", Role.ADMIN, Purpose.OPERATIONS)


class AgentArm:
    """A memory configuration on its own store directory."""

    def __init__(self, name: str, directory: Path, run: Runner, backbone: Backbone | None = None) -> None:
        self.name, self.directory, self.run, self.backbone = name, directory, run, backbone
        self.flags = config_flags(arm_config(name) or name)
        self.mem = run.open(directory, name, backbone)

    def fork(self, directory: Path) -> AgentArm:
        self.mem.close()  # a store is copied closed, so its vector caches are on disk
        shutil.rmtree(directory, ignore_errors=True)
        shutil.copytree(self.directory, directory)
        self.mem = self.run.open(self.directory, self.name, self.backbone)
        return AgentArm(self.name, directory, self.run, self.backbone)

    def answer(self, row: ManifestRow) -> tuple[str, str, tuple[str, ...]]:
        a = self.mem.ask(
            AGENT,
            row.patient_id,
            row.image,
            row.question,
            timestamp=row.timestamp,
            study_id=row.study_id,
            visual_tag=row.view,
            use_sem=self.flags["use_sem"],
            use_epi=self.flags["use_epi"],
            use_vis=self.flags["use_vis"],
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
                CRITIC,
                row.patient_id,
                row.study_id,
                accept=accept,
                correction=correction,
                decision=row.decision,
                question=row.question,
            )

    def close(self, *, discard: bool = False) -> None:
        self.mem.close()
        if discard:
            shutil.rmtree(self.directory, ignore_errors=True)


class BaselineArm:
    """A baseline on its own list of known studies."""

    def __init__(self, name: str, known: KnownStudies, run: Runner) -> None:
        self.name, self.known, self.run = name, known, run

    def fork(self, directory: Path) -> BaselineArm:
        return BaselineArm(self.name, self.known.copy(), self.run)

    def answer(self, row: ManifestRow) -> tuple[str, str, tuple[str, ...]]:
        z = self.run.plan.z[key(row)]
        return baseline_answer(self.name, self.known, row.patient_id, z, row.view), "", ()

    def learn(self, row: ManifestRow, prediction: str) -> None:
        text = row.answer if self.run.plan.settings.feedback == "truth" else prediction
        z = self.run.plan.z[key(row)]
        self.known.add(Known(row.patient_id, row.timestamp, row.study_id, text, z, row.view))

    def close(self, *, discard: bool = False) -> None:
        return None


class FixedArm:
    """A memory-free model that gives every query one answer fixed before probing (the
    training split's majority, :func:`~msm_mem.eval.baselines.majority`) and learns nothing."""

    def __init__(self, name: str, text: str) -> None:
        self.name, self.text = name, text

    def fork(self, directory: Path) -> FixedArm:
        return self

    def answer(self, row: ManifestRow) -> tuple[str, str, tuple[str, ...]]:
        return self.text, "", ()

    def learn(self, row: ManifestRow, prediction: str) -> None:
        return None

    def close(self, *, discard: bool = False) -> None:
        return None


Arm = AgentArm | BaselineArm | FixedArm


#: the split's parts beside the phases: fitted on, and probed
SPARE = ("finetune", "validation")


def key(row: ManifestRow) -> tuple[str, str]:
    return (row.patient_id, row.study_id)


@dataclass(frozen=True, slots=True)
class Plan:
    """What every arm shares (picklable, for worker processes)."""

    settings: ProtocolSettings
    memory: Settings
    t0: float
    parts: dict[str, list[ManifestRow]]
    z: dict[tuple[str, str], Vector]
    work: Path
    keep: Path | None = None
    group: tuple[str, str] = ("text", "")
    fitted: Path | None = None
    fold: int = 0

    @property
    def keys(self) -> Path:
        """The key home of the protocol's stores: beside the kept stores when they are kept
        (so that they open afterwards), else in the work folder, removed with it."""
        return (self.keep if self.keep is not None else self.work) / "keys"

    def per_arm(self) -> int:
        return sum(len(self.parts[p]) for p in PHASES[1:]) + len(PHASES) * len(self.parts["validation"])


#: this process's remembering encoders, by name (see :func:`memo_encoder`)
_ENCODERS: dict[str, MemoEncoder] = {}


def memo_encoder(name: str) -> MemoEncoder:
    """This process's :class:`~msm_mem.plugins.encoders.memo.MemoEncoder` of encoder ``name``:
    built once, so every store and fitted backbone of the run shares one model and encodes each
    query image once (the same vectors as encoding it anew; never persisted).

    A torch encoder runs on one intra-op thread here: the evaluation runs ``jobs`` processes
    side by side, and torch's default (one thread per core in every process) oversubscribes the
    cores, which made each single-image forward pass 10 to 30 times slower on a loaded machine.
    One thread also makes the vectors independent of the machine's core count."""
    if (enc := _ENCODERS.get(name)) is None:
        inner = get_encoder(name)
        if (torch := sys.modules.get("torch")) is not None:
            torch.set_num_threads(1)
        enc = _ENCODERS[name] = MemoEncoder(inner)
    return enc


class Runner:
    """Runs arms one after the other; ``tick(n)`` reports progress."""

    def __init__(self, plan: Plan, tick: Callable[[int], object]) -> None:
        self.plan, self.tick = plan, tick
        self.answers: list[Answered] = []

    def open(self, directory: Path, arm: str, backbone: Backbone | None = None) -> MsmMem:
        p = self.plan
        clock = FixedClock(p.t0)
        enc = memo_encoder(p.memory.encoder)
        common: dict[str, Any] = {"settings": p.memory, "clock": clock, "encoder": enc, "key_home": p.keys}
        if backbone is not None:
            return MsmMem.open(directory, **common, backbone=backbone)
        if arm in CONFIGS or p.fitted is None:
            return MsmMem.open(directory, **common, backbone=p.settings.backbone)
        fitted = FittedBackbone(p.fitted, encoder=enc)
        return MsmMem.open(directory, **common, backbone=fitted)

    def probe(self, arm: Arm, mode: str, phase: str, rows: Sequence[ManifestRow]) -> None:
        last: dict[str, str] = {}  # each patient's study answered before, in this probe
        for row in rows:
            prediction, gate, retrieved = arm.answer(row)
            prior = last.get(row.patient_id, "") if isinstance(arm, AgentArm) else ""
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
                    self.plan.fold,
                )
            )
            arm.learn(row, prediction)
            self.tick(1)

    def frozen(self, arm: Arm, phase: str) -> None:
        scratch = arm.fork(self.plan.work / "scratch" / arm.name)
        try:
            self.probe(scratch, "frozen", phase, self.plan.parts["validation"])
        finally:
            scratch.close(discard=True)

    def run_arm(self, arm: Arm) -> list[Answered]:
        try:
            self.frozen(arm, PHASES[0])
            for phase in PHASES[1:]:
                self.probe(arm, "online", phase, self.plan.parts[phase])
                self.frozen(arm, phase)
        finally:
            arm.close()
        return self.answers

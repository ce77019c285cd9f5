"""The child of the crash-safety run (``crash_safety.py``): the parent's account of what was
acknowledged (:class:`Model`), and a writer that plans random calls through the public API,
reports each before and after it, and runs until it is killed."""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from msm_mem import ConsentRecord, ManifestRow, MsmMem, MsmMemError, Principal, Purpose, Role

ADMIN = Principal("crash-admin", Role.ADMIN, Purpose.OPERATIONS)
AGENT = Principal("msm-mem-agent", Role.AGENT, Purpose.TREATMENT)
CRITIC = Principal("report-signer", Role.CRITIC, Purpose.TREATMENT)
INGEST = Principal("msm-mem-ingest", Role.SYSTEM, Purpose.OPERATIONS)
AUDITOR = Principal("auditor-1", Role.AUDITOR, Purpose.AUDIT)

ANSWERS = (
    "small left pleural effusion",
    "right lower lobe opacity, pneumonia not excluded",
    "cardiomegaly with mild pulmonary edema",
    "no acute cardiopulmonary process",
    "left upper lobe nodule, follow-up advised",
)
#: the most calls one child makes (it is killed long before, as a rule) and its time bound
CHILD_MAX_OPS = 400
CHILD_MAX_S = 120.0
# the parent's account of what was acknowledged -------------------------------------------


@dataclass
class Study:
    patient: str
    episode: bool  # an episode (and a visual) was written for it
    seed: int  # the image's seed, to search for it
    claims: list[str] = field(default_factory=list)  # acknowledged feedback claim ids


@dataclass
class Model:
    """Everything acknowledged so far, and what the checks saw last."""

    studies: dict[str, Study] = field(default_factory=dict)
    observed: dict[str, tuple[str, str]] = field(default_factory=dict)  # STM item -> patient, study
    consolidated: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # item -> patient, episode
    consents: dict[str, str] = field(default_factory=dict)  # consent id -> patient
    revoked: set[str] = field(default_factory=set)
    shredded: set[str] = field(default_factory=set)
    patients: list[str] = field(default_factory=list)  # live ones
    next_patient: int = 0
    rotations: int = 0
    #: every study id a child planned a call for (acknowledged or not): no other may be stored
    planned: set[str] = field(default_factory=set)


def image(folder: Path, seed: int) -> str:
    """The path of one study's grayscale PNG in ``folder`` (distinct per seed, so each episode's
    vector is its own); written whole or not at all, since a child may die writing it."""
    path = folder / f"img{seed}.png"
    if not path.exists():
        pixels = np.random.default_rng(seed).integers(0, 256, (16, 16), dtype=np.uint8)
        tmp = folder / f".img{seed}.{os.getpid()}.tmp"
        Image.fromarray(pixels, mode="L").save(tmp, format="PNG")
        os.replace(tmp, path)
    return str(path)


# the child ---------------------------------------------------------------------------------


class Pipe:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def send(self, kind: str, op: str, **data: Any) -> None:
        line = (json.dumps({"k": kind, "op": op, **data}) + "\n").encode()
        view = memoryview(line)
        while view:
            view = view[os.write(self.fd, view) :]


def child_main(directory: Path, model: Model, child_no: int, seed: int, fd: int) -> None:
    """Write through the public API until killed (or out of calls); report every call."""
    rng = random.Random(seed)
    out = Pipe(fd)
    mem = MsmMem.open(directory)
    out.send("ready", "open")
    started = time.monotonic()
    for n in range(CHILD_MAX_OPS):
        if time.monotonic() - started > CHILD_MAX_S:
            break
        op, plan = _plan(model, rng, f"K{child_no}N{n}")
        out.send("start", op, **plan)
        try:
            mem, result = _perform(mem, directory, op, plan)
        except MsmMemError as exc:
            out.send("error", op, error=f"{type(exc).__name__}: {exc}")
            continue
        apply(model, op, plan, result)
        out.send("ack", op, **result)
    os.write(fd, b'{"k": "idle", "op": ""}\n')
    time.sleep(CHILD_MAX_S)  # the parent kills it


def _plan(model: Model, rng: random.Random, tag: str) -> tuple[str, dict[str, Any]]:
    """The next call and its arguments (ids unique to this call), from what is acknowledged."""
    live = model.patients
    asked = [s for s, st in model.studies.items() if st.patient in live]
    choices = ["ingest"] * 3 + ["ask"] * 5 + ["observe"] * 3 + ["reopen"]
    if model.observed:
        choices += ["consolidate"] * 3
    if asked:
        choices += ["feedback"] * 2
    if live:
        choices += ["grant"] * 2 + ["rotate"]
    if [c for c, p in model.consents.items() if c not in model.revoked and p in live]:
        choices += ["revoke"]
    if len(live) > 4:
        choices += ["shred"]
    if not live:
        choices = ["ingest"]
    op = rng.choice(choices)
    seed = rng.randrange(2**31)
    if op == "ingest":
        if not live or rng.random() < 0.3:
            patient = f"P{tag}"
        else:
            patient = rng.choice(live)
        n = rng.randint(1, 3)
        return op, {
            "patient": patient,
            "studies": [f"{tag}S{i}" for i in range(n)],
            "seeds": [seed + i for i in range(n)],
        }
    if op == "ask":
        return op, {"patient": rng.choice(live), "study": f"{tag}S", "seed": seed}
    if op == "observe":
        return op, {"patient": rng.choice(live), "study": f"{tag}S", "seed": seed}
    if op == "consolidate":
        item = rng.choice(sorted(model.observed))
        patient, study = model.observed[item]
        return op, {"patient": patient, "item": item, "study": study, "answer": rng.choice(ANSWERS)}
    if op == "feedback":
        study = rng.choice(sorted(asked))
        return op, {"patient": model.studies[study].patient, "study": study, "correction": rng.choice(ANSWERS)}
    if op == "grant":
        return op, {"patient": rng.choice(live), "consent": f"C-{tag}"}
    if op == "revoke":
        open_ = sorted(c for c, p in model.consents.items() if c not in model.revoked and p in live)
        return op, {"consent": rng.choice(open_)}
    if op == "shred":
        return op, {"patient": rng.choice(live)}
    return op, {}


def _perform(mem: MsmMem, directory: Path, op: str, plan: dict[str, Any]) -> tuple[MsmMem, dict[str, Any]]:
    """Run one planned call; what it acknowledged."""
    images = directory.parent / "images"
    if op == "ingest":
        rows = [
            ManifestRow(plan["patient"], s, 1.6e9 + i, image(images, seed), "Findings?", ANSWERS[seed % len(ANSWERS)])
            for i, (s, seed) in enumerate(zip(plan["studies"], plan["seeds"], strict=True))
        ]
        report = mem.ingest(INGEST, rows)
        return mem, {"ingested": report.ingested}
    if op == "ask":
        answer = mem.ask(
            AGENT, plan["patient"], image(images, plan["seed"]), "What is the impression?", study_id=plan["study"]
        )
        return mem, {"written": bool(answer.gate and answer.gate.written)}
    if op == "observe":
        item = mem.observe(AGENT, plan["patient"], image(images, plan["seed"]), "Any change?", study_id=plan["study"])
        return mem, {"item": item.item_id}
    if op == "consolidate":
        result = mem.consolidate(AGENT, plan["patient"], plan["item"], plan["answer"])
        return mem, {"episode": result.episode_id}
    if op == "feedback":
        claim = mem.feedback(CRITIC, plan["patient"], plan["study"], accept=False, correction=plan["correction"])
        return mem, {"claim": claim.claim_id}
    if op == "grant":
        record = ConsentRecord(
            plan["consent"], plan["patient"], "actor:dr-crash", "treatment", "permit", ("episodic",), 0.0
        )
        mem.grant(ADMIN, [record])
        return mem, {}
    if op == "revoke":
        mem.revoke(ADMIN, plan["consent"])
        return mem, {}
    if op == "shred":
        return mem, {"retracted": mem.shred(ADMIN, plan["patient"], "erasure request").records}
    if op == "rotate":
        return mem, {"rewrapped": mem.rotate_keys(ADMIN, "scheduled rotation")}
    mem.close()  # "reopen": saves the FAISS cache
    return MsmMem.open(directory), {}


def apply(model: Model, op: str, plan: dict[str, Any], result: dict[str, Any]) -> None:
    """Record an acknowledged (or settled in-flight) call in the model."""
    if op == "ingest":
        if plan["patient"] not in model.patients:
            model.patients.append(plan["patient"])
        for s, seed in zip(plan["studies"], plan["seeds"], strict=True):
            model.studies[s] = Study(plan["patient"], True, seed)
    elif op == "ask":
        model.studies[plan["study"]] = Study(plan["patient"], result["written"], plan["seed"])
    elif op == "observe":
        model.observed[result["item"]] = (plan["patient"], plan["study"])
    elif op == "consolidate":
        model.observed.pop(plan["item"], None)
        model.consolidated[plan["item"]] = (plan["patient"], result["episode"])
    elif op == "feedback":
        model.studies[plan["study"]].claims.append(result["claim"])
    elif op == "grant":
        model.consents[plan["consent"]] = plan["patient"]
    elif op == "revoke":
        model.revoked.add(plan["consent"])
    elif op == "shred":
        model.shredded.add(plan["patient"])
        model.patients.remove(plan["patient"])
        for item in [i for i, (p, _) in model.observed.items() if p == plan["patient"]]:
            del model.observed[item]
        for cid in [c for c, p in model.consents.items() if p == plan["patient"]]:
            del model.consents[cid]  # erased with the patient
            model.revoked.discard(cid)
    elif op == "rotate":
        model.rotations += 1

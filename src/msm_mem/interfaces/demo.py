"""The end-to-end demo on the synthetic longitudinal set (``make demo``).

Steps: generate the set; split its patients 30/60/10 (memory / fine-tune / validation, the
memory split into Base and WB1..WB4); ingest the Base patients as base memory (the offline
loop); then, for every memory configuration (the 8 subsets of S, E, V) and the baselines,
answer each write-back phase's studies in time order through the online loop with write-back
(the reference arriving afterwards as a critic verdict), and probe the validation patients
after every phase. Prints Table 1 and writes the reports and plots into ``out``
(see :mod:`msm_mem.eval.report` and :mod:`msm_mem.eval.plots`), and leaves the full
configuration's (S+E+V) store after WB4 in ``out/store`` for ``msm-mem ask`` and friends.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from .._settings import Settings
from ..datasets.synthetic import generate
from ..eval.plots import write_plots
from ..eval.protocol import ProtocolSettings, run_protocol
from ..eval.report import table1_markdown, write_reports

__all__ = ["DEMO_PATIENTS", "run_demo"]

#: Patients of the demo's synthetic set: sized so ``make demo`` ends within minutes on 2 cores.
DEMO_PATIENTS = 200
_MARKER = ".msm-mem-demo"
_OUTPUTS = (
    "data",
    "store",
    "stores",
    "table1.md",
    "table1.csv",
    "phases.md",
    "phases.csv",
    "results.json",
    "answers.jsonl",
    "figure6.png",
    "figure6_finding_f1.png",
    "configs.png",
    "gate.png",
)


#: the baselines' names in the summary
_NAMES = {
    "prior": "population prior",
    "copy-prior": "copy of the patient's last answer",
    "nearest-neighbour": "nearest neighbour",
    "view": "view only",
}


def run_demo(
    out: Path, *, seed: int = 0, patients: int = DEMO_PATIENTS, verbose: bool = True, jobs: int | None = None
) -> int:
    """Run the demo in ``out`` (its previous demo outputs are replaced); returns 0.

    Always prints the summary (mean token F1 of S+E+V, of the best baseline and, when that is
    another one, of the population prior; frozen probe after WB4); ``verbose`` adds progress
    bars and Table 1. ``jobs`` worker processes run the memory configurations (default: up to
    2, the CPUs available); results do not depend on it."""
    started = time.monotonic()
    out = Path(out)
    if (out / _MARKER).exists():
        for name in _OUTPUTS:
            path = out / name
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / _MARKER).touch()
    rows, _ = generate(out / "data", patients=patients, seed=seed)
    if verbose:
        print(f"synthetic set: {len(rows)} studies of {patients} patients in {out / 'data'}")
    jobs = jobs if jobs is not None else max(1, min(2, os.cpu_count() or 1))
    run = run_protocol(
        rows,
        ProtocolSettings(seed=seed),
        memory=Settings(),
        dataset="synthetic",
        jobs=jobs,
        keep_stores=out / "stores",
        progress=verbose,
    )
    shutil.move(out / "stores" / "SEV", out / "store")
    shutil.rmtree(out / "stores")
    records = write_reports(run, out)
    plots = write_plots(records, out, arms=run.arms, configs=run.settings.configs)
    final = {
        r["arm"]: r["token_f1"]["mean"]
        for r in records
        if r["question_type"] == "all" and r["mode"] == "frozen" and r["phase"] == "WB4"
    }
    if verbose:
        counts = run.split.counts()
        print(
            f"\npatients: {counts['memory']} memory (Base {counts['Base']}, WB1-WB4 "
            f"{'/'.join(str(counts[p]) for p in ('WB1', 'WB2', 'WB3', 'WB4'))}), {counts['finetune']} fine-tune "
            f"(unused), {counts['validation']} validation; {len(run.answers)} answers scored\n"
        )
        print(table1_markdown(records, run))
        print(
            f"reports: {', '.join(p.name for p in (out / 'table1.md', out / 'phases.md', out / 'results.json'))}; "
            f"plots: {', '.join(p.name for p in plots)} (in {out})"
        )
    baselines = [arm for arm in run.settings.baselines if arm in final]
    best = max(baselines, key=lambda arm: (final[arm], arm == "prior"))
    print(f"mean token F1 with memory (S+E+V), validation after WB4:       {final['SEV']:.3f}")
    print(f"mean token F1 of the best baseline ({_NAMES.get(best, best)}), same queries: {final[best]:.3f}")
    if best != "prior" and "prior" in final:
        print(f"mean token F1 without memory (population prior), same queries: {final['prior']:.3f}")
    if verbose:
        print(f"store with the S+E+V memory after WB4: {out / 'store'}; done in {time.monotonic() - started:.0f} s")
    return 0

"""Evaluation commands: eval (the paper's protocol) and demo. They build their own stores and
take no principal."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ... import InvalidInput
from ..._settings import Settings
from ..backbone import parse_options
from .registry import backbone_flags, backbone_of, command

__all__ = ["cmd_demo", "cmd_eval"]

_SHOWN = 50  # bad rows printed one by one
#: the evaluation's cross-validation folds unless --folds says otherwise
DEFAULT_FOLDS = 5


def _configure_demo(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", type=Path, help="folder for the demo's data and reports")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--patients", type=int, default=None, help="synthetic patients")


@command("demo", _configure_demo, role=None)
def cmd_demo(args: argparse.Namespace) -> int:
    """Run the main job end to end on the synthetic set: ingest, online loop with write-back, evaluation.

    Prints Table 1 (every memory configuration and the baselines) and writes the reports and
    plots into OUT."""
    from ..demo import DEMO_PATIENTS, run_demo

    return run_demo(args.out, seed=args.seed, patients=args.patients or DEMO_PATIENTS)


def _configure_eval(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dataset",
        nargs=2,
        metavar=("NAME", "PATH"),
        required=True,
        help="a data set loader (synthetic, covid-cxr, iu-xray, mimic-cxr) and its path, or manifest and a "
        "manifest file (CSV or JSONL, docs/manifest.md; question types read from its rows)",
    )
    p.add_argument("--out", type=Path, required=True, help="folder for the reports and plots")
    p.add_argument("--configs", default="all", help="all, or a comma list of none,S,E,V,SE,SV,EV,SEV")
    p.add_argument("--encoder", help="image encoder plugin (default: pixels, or MSM_MEM_ENCODER)")
    p.add_argument(
        "--feedback",
        choices=["truth", "none"],
        default="truth",
        help="truth: the reference arrives after each answer as a critic verdict; none: it never does",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the patient split and the bootstrap")
    p.add_argument(
        "--folds",
        type=int,
        default=DEFAULT_FOLDS,
        help=f"patient-level cross-validation folds; each validates on its own patients, so every patient is "
        f"probed once (default {DEFAULT_FOLDS}; 1: the paper's single 30/60/10 split; at least folds + 2 patients)",
    )
    p.add_argument(
        "--no-baselines", action="store_true", help="skip the prior, copy-prior, nearest-neighbour and view baselines"
    )
    p.add_argument(
        "--no-fit",
        action="store_true",
        help="do not fit the fine-tune split (no ft and SEV-ft rows; fitting needs the fit extra, scikit-learn)",
    )
    p.add_argument(
        "--structured-gate",
        action="store_true",
        help="write-back gate for short structured answers: an answer shorter than the minimum word count "
        "is judged by novelty alone (the paper's gate otherwise; also MSM_MEM_STRUCTURED_GATE=1)",
    )
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a data set loader option (JSON value or text), e.g. patients=60 for synthetic",
    )
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples (default 1000)")
    p.add_argument(
        "--jobs",
        type=int,
        default=max(1, min(2, os.cpu_count() or 1)),
        help="worker processes for the memory configurations (results do not depend on it)",
    )
    p.add_argument("--no-plots", action="store_true", help="write no PNG plots")
    backbone_flags(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _options(pairs: list[str]) -> dict[str, Any]:
    """The data set loader's options: each value JSON (a list as a tuple), else text."""
    parsed = parse_options(pairs, flag="--option")
    return {key: tuple(value) if isinstance(value, list) else value for key, value in parsed.items()}


@command("eval", _configure_eval, role=None)
def cmd_eval(args: argparse.Namespace) -> int:
    """Evaluate memory configurations over write-back phases (the paper's protocol, Table 1, Figure 6).

    --dataset manifest FILE evaluates any manifest (CSV or JSONL, docs/manifest.md): every
    bad row is printed with its line and the good ones are evaluated. Rows are grouped by
    (question_type, question); each group runs the protocol on memories of its own. Patients
    are cut into --folds folds (default 5); each fold validates on its own patients and splits
    the others 30:60 into memory and fine-tune, so every patient is probed once and the scores
    pool the folds (--folds 1: the paper's single 30/60/10 split). The memory split's Base part
    builds the base memory and WB1..WB4 are write-back phases. For
    each group a memory-free image model and a router over the memory experts are fitted on
    the fine-tune patients only (rows ft and SEV-ft beside the untrained ones; --no-fit skips
    them). Each configuration (and each baseline) is scored online (each phase's studies
    answered before write-back) and frozen (the validation patients answered against a copy of
    the memory after each phase), per question type and overall; S+E+V is compared with each
    rival by a paired bootstrap in each of those scopes; first studies and follow-ups are
    scored apart (cohorts.md). With the nonparametric backbone the no-memory row is the
    training split's majority answer. Writes OUT/table1.md and .csv, phases.md and .csv,
    paired.md, cohorts.md, results.json, answers.jsonl, fitted-fold<k>.npz per fold (fitted.npz
    with one fold: the fitted parameters, which MsmMem.open(..., backbone="fitted",
    backbone_options={"path": ...}) loads) and PNG plots, and prints Table 1. The same data,
    options and seed give identical files. The stores it builds are its own (temporary), so it
    takes no acting principal.

    --backbone openai --backbone-option base_url=URL --backbone-option model=NAME answers with
    a multimodal model behind any OpenAI-compatible server (vLLM, Ollama, llama.cpp, TGI): the
    fused prompt and the image go to it; its options are checked and the server probed first."""
    from ...datasets.registry import DATASETS, load_dataset, options_of
    from ...eval.baselines import BASELINES
    from ...eval.protocol import ProtocolSettings, parse_configs, run_protocol
    from ...eval.report import table1_markdown, write_reports
    from ...plugins.backbones import BackboneSpec, option_names
    from ..backbone import probe

    chosen = backbone_of(args)
    loader = set(options_of(args.dataset[0])) if args.dataset[0] in DATASETS else set()
    if misplaced := sorted(set(_options(args.option)) & set(option_names(chosen.name)) - loader):
        raise InvalidInput(
            f"--option {misplaced[0]}=... is a data set loader option; the backbone's is "
            f"--backbone-option {misplaced[0]}=..."
        )
    probe(chosen.build())  # bad options or an unreachable model server: an error before any work
    memory = Settings.from_env()
    if args.structured_gate:
        memory = memory.with_(structured_gate=True)
    settings = ProtocolSettings(
        configs=parse_configs(args.configs),
        baselines=() if args.no_baselines else BASELINES,
        backbone=BackboneSpec(chosen.name, chosen.runtime_options()),
        encoder=args.encoder or memory.encoder,
        feedback=args.feedback,
        seed=args.seed,
        fit=not args.no_fit,
        folds=args.folds,
    )
    if args.bootstrap < 1:
        raise InvalidInput("--bootstrap must be at least 1")
    name, path = args.dataset
    rows, problems = load_dataset(name, path, **_options(args.option))
    if problems:
        print(f"skipped {len(problems)} rows of {name}:", file=sys.stderr)
        for p in problems[:_SHOWN]:
            print(f"  line {p.line}: {p.reason}", file=sys.stderr)
        if len(problems) > _SHOWN:
            print(f"  ... and {len(problems) - _SHOWN} more", file=sys.stderr)
    if problems and not rows:
        first = problems[0]
        raise InvalidInput(
            f"no rows to evaluate: all {len(problems)} rows of {path} were skipped (line {first.line}: {first.reason})"
        )
    if name == "manifest":
        _warn_untyped(Path(path))
    run = run_protocol(rows, settings, memory=memory, dataset=name, jobs=args.jobs, progress=not args.no_progress)
    _warn_one_class(run.answers)
    records = write_reports(run, args.out, n_boot=args.bootstrap)
    if not args.no_plots:
        from ...eval.plots import write_plots

        write_plots(records, args.out, arms=run.arms, configs=run.settings.configs)
    print(table1_markdown(records, run))
    print(f"reports and plots in {args.out}")
    return 0


def _warn_untyped(path: Path) -> None:
    """A warning naming the manifest rows without a question type (scored as free text)."""
    from ...datasets.manifest import untyped_lines

    lines = untyped_lines(path)
    if lines:
        shown = ", ".join(str(n) for n in lines[:_SHOWN]) + (
            f", ... ({len(lines)} rows)" if len(lines) > _SHOWN else ""
        )
        print(
            f"warning: {path}: no question_type on line {shown}: scored as free text (token F1, BLEU, "
            "CIDEr); give label or yes_no where the answers are labels or yes/no",
            file=sys.stderr,
        )


def _warn_one_class(answers: Sequence[Any]) -> None:
    """A warning naming each question group, and each fold, whose validation answers are all
    one answer."""
    from ...eval.metrics import normalize_answer

    refs: dict[tuple[str, str, int], set[str]] = {}
    for a in answers:
        if a.mode == "frozen":
            refs.setdefault((a.question_type, a.question, a.fold), set()).add(normalize_answer(a.reference))
    folds = len({fold for _, _, fold in refs})
    for (kind, question, fold), seen in sorted(refs.items()):
        if len(seen) == 1:
            where = f" in fold {fold}" if folds > 1 else ""
            print(
                f"warning: every validation answer of {kind} question {question!r}{where} is {next(iter(seen))!r}: "
                "its scores measure agreement with one answer, not a discrimination",
                file=sys.stderr,
            )

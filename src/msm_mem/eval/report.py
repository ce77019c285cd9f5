"""The reports of an evaluation: Table 1, per-phase tables, results.json, answers.jsonl.

Metrics come from :mod:`msm_mem.eval.scores` (overall, per question type and per question;
the Markdown tables print percent, like the paper, and CIDEr-D as it is, in [0, 10]).

Files written by :func:`write_reports`: ``table1.md``/``.csv`` (phase WB4, one row per scope,
arm and mode, the untrained and the fitted rows together; the Markdown has the overall table
first, then one per question type and per question, then the frozen paired bootstrap of
S+E+V), ``phases.md``/``.csv`` (every scope, mode, phase and arm; the gate's discard reasons
per phase), ``paired.md`` (:mod:`.bootstrap`, every scope, both modes at WB4),
``results.json`` (settings, data fingerprint, question groups, split, every metric, the paired
tests of every scope and phase, the fitted record), ``fitted.npz`` (the fitted parameters, when
fitted) and ``answers.jsonl`` (every answer with its question). Nothing random or
machine-specific goes in, so equal runs give byte-identical files.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .bootstrap import paired_markdown, scope_tests
from .cohorts import cohort_records, cohorts_markdown
from .records import MODES, ProtocolRun, arm_config
from .scores import ALL, METRICS, SCOPE_METRICS, finding_counts, scopes, summarise
from .split import PHASES

__all__ = [
    "METRICS",
    "arm_titles",
    "finding_counts",
    "fitted_file",
    "results_json",
    "summarise",
    "table1_markdown",
    "write_reports",
]

FINAL = PHASES[-1]
_TYPE_TITLES = {
    ALL: "all questions",
    "label": "label questions (a short finding label)",
    "yes_no": "yes/no questions",
    "text": "free-text questions",
}


# ---------------------------------------------------------------------------------- writing


def _round(x: Any) -> Any:
    if isinstance(x, float):
        return round(x, 6)
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_round(v) for v in x]
    return x


_KEYS = ("question_type", "question", "mode", "phase", "arm", "kind", "n", "patients")


def _columns() -> list[str]:
    cols = list(_KEYS)
    for key in METRICS:
        cols.append(key)
        if key not in ("yes_no_f1", "label_f1", "cider", "finding_f1_macro") and not key.startswith("bleu"):
            cols += [f"{key}_low", f"{key}_high"]
    return [*cols, "gate_written", "gate_discarded", "gate_reasons"]


def _flat(rec: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(_columns(), "")
    row.update({k: rec[k] for k in _KEYS})
    for key in METRICS:
        for part, value in rec.get(key, {}).items():
            row[key if part == "mean" else f"{key}_{part}"] = f"{value:.4f}"
    gate = rec["gate"]
    row.update(
        gate_written=gate["written"],
        gate_discarded=gate["discarded"],
        gate_reasons=";".join(f"{k}:{v}" for k, v in gate["reasons"].items()),
    )
    return row


def _csv(records: Sequence[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=_columns(), lineterminator="\n")
    writer.writeheader()
    writer.writerows(_flat(r) for r in records)
    return buf.getvalue()


def _pct(m: dict[str, float], key: str = "") -> str:
    scale = 1 if key == "cider" else 100  # CIDEr-D is no percentage
    text = f"{scale * m['mean']:.2f}"
    return f"{text} [{scale * m['low']:.1f}, {scale * m['high']:.1f}]" if "low" in m else text


def _scope_title(kind: str, question: str) -> str:
    return f"{_TYPE_TITLES[kind]}: {question}" if question else _TYPE_TITLES[kind]


_ARM_TITLES = {
    "none": "no memory (backbone alone)",
    "ft": "no memory, fitted image model (FT)",
    "SEV-ft": "SEV, fitted backbone and router (MoE-FT)",
    "prior": "baseline: population prior",
    "copy-prior": "baseline: copy patient's last answer",
    "nearest-neighbour": "baseline: nearest neighbour (population)",
    "view": "baseline: view only",
}


def arm_titles(run: ProtocolRun) -> dict[str, str]:
    """Each arm's row title; the ``none`` row names the memory-free model it is."""
    titles = dict(_ARM_TITLES)
    if run.settings.backbone == "nonparametric":
        titles["none"] = "no memory: majority answer of the training split"
    return titles


def _folds_text(run: ProtocolRun) -> str:
    n = len(run.splits)
    return "one patient split (30/60/10)" if n == 1 else f"{n}-fold patient-level cross-validation (answers pooled)"


_MODE_TITLES = {
    "frozen": "Frozen probe: the validation patients answered against the memory after {phase}",
    "online": "Online: the {phase} studies, each answered before its write-back",
}


def _mark(arm: str, letter: str) -> str:
    config = arm_config(arm)
    if config is None:
        return ""
    return "✓" if letter in config else "×"


def table1_markdown(records: Sequence[dict[str, Any]], run: ProtocolRun, phase: str = FINAL) -> str:
    """The paper's Table 1 shape: one row per arm, metric columns (percent, 95% patient CI),
    for all questions first, then per question type and per question."""
    s, m = run.settings, run.memory_settings
    lines = [
        f"# Table 1: performance by memory configuration at {phase}",
        "",
        f"Data: {run.data['name']} ({run.data['labelled']} labelled questions, {run.data['patients']} patients; "
        f"fingerprint `{str(run.data['fingerprint'])[:16]}`). Encoder `{s.encoder}`, backbone `{s.backbone}`, "
        f"feedback `{s.feedback}`, seed {s.seed}, {_folds_text(run)}; "
        f"gate tau {m.tau}, at least {m.min_answer_words} words"
        f"{' (shorter answers: novelty only)' if m.structured_gate else ''}. "
        "Percent (CIDEr-D in [0, 10]); brackets: 95% bootstrap interval over patients.",
        "",
    ]
    for kind, question in scopes(run):
        keys = SCOPE_METRICS[kind]
        for mode in MODES:
            rows = [
                r
                for r in records
                if r["mode"] == mode and r["phase"] == phase and (r["question_type"], r["question"]) == (kind, question)
            ]
            if not rows:
                continue
            title = _MODE_TITLES[mode].format(phase=phase)
            lines += [
                f"## {_scope_title(kind, question)}. {title} ({rows[0]['n']} answers, {rows[0]['patients']} patients; "
                "n: the answers of each row, which the fitted rows give only for the questions they were fitted on)",
                "",
                "| Configuration | S | E | V | n | " + " | ".join(METRICS[k] for k in keys) + " |",
                "|---|:-:|:-:|:-:|---:|" + "---:|" * len(keys),
            ]
            titles = arm_titles(run)
            for r in rows:
                name = titles.get(r["arm"], r["arm"])
                marks = " | ".join(_mark(r["arm"], c) for c in "SEV")
                lines.append(f"| {name} | {marks} | {r['n']} | " + " | ".join(_pct(r[k], k) for k in keys) + " |")
            lines.append("")
    return "\n".join(lines)


def _phases_markdown(records: Sequence[dict[str, Any]], run: ProtocolRun) -> str:
    lines = [
        "# Metrics per write-back phase",
        "",
        "Percent (CIDEr-D in [0, 10]). Frozen: the same validation queries after each phase. Online: each "
        "phase's own studies, answered before write-back. Gate: answers written / discarded by the write-back gate.",
        "",
    ]
    for kind, question in scopes(run):
        mine = [r for r in records if (r["question_type"], r["question"]) == (kind, question)]
        for mode in MODES:
            phases = [p for p in PHASES if any(r["mode"] == mode and r["phase"] == p for r in mine)]
            for key in SCOPE_METRICS[kind][:3]:
                lines += [
                    f"## {_scope_title(kind, question)}. {mode}: {METRICS[key]}",
                    "",
                    "| Arm | " + " | ".join(phases) + " |",
                    "|---|" + "---:|" * len(phases),
                ]
                for arm in run.arms:
                    cells = {
                        r["phase"]: _pct({"mean": r[key]["mean"]}, key)
                        for r in mine
                        if r["mode"] == mode and r["arm"] == arm
                    }
                    lines.append(f"| {arm} | " + " | ".join(cells.get(p, "") for p in phases) + " |")
                lines.append("")
            lines += [
                f"## {_scope_title(kind, question)}. {mode}: write-back gate (written / discarded)",
                "",
                "| Configuration | " + " | ".join(phases) + " |",
                "|---|" + "---:|" * len(phases),
            ]
            for arm in (*run.settings.configs, *run.fitted_arms):
                cells = {r["phase"]: _gate_cell(r["gate"]) for r in mine if r["mode"] == mode and r["arm"] == arm}
                lines.append(f"| {arm} | " + " | ".join(cells.get(p, "") for p in phases) + " |")
            lines.append("")
    return "\n".join(lines)


def _gate_cell(gate: dict[str, Any]) -> str:
    why = ", ".join(f"{k} {v}" for k, v in gate["reasons"].items())
    return f"{gate['written']} / {gate['discarded']}" + (f" ({why})" if why else "")


def results_json(
    records: Sequence[dict[str, Any]],
    run: ProtocolRun,
    *,
    n_boot: int,
    paired: Sequence[dict[str, Any]] = (),
    cohorts: Sequence[dict[str, Any]] = (),
) -> str:
    """Everything as canonical JSON (sorted keys, floats rounded to 6 places)."""
    m = run.memory_settings
    splits = []
    for split in run.splits:
        patients = {name: list(ids) for name, ids in zip(PHASES, split.phases, strict=True)}
        patients.update(finetune=list(split.finetune), validation=list(split.validation))
        splits.append({"fold": split.fold, "counts": split.counts(), "patients": patients})
    doc: dict[str, Any] = {
        "format": "msm-mem-eval/3",
        "settings": {
            **asdict(run.settings),
            "bootstrap_resamples": n_boot,
            "memory": {
                k: getattr(m, k)
                for k in (
                    "k_epi",
                    "k_vis",
                    "top_k",
                    "tau",
                    "min_answer_words",
                    "semantic_history",
                    "prompt_budget_chars",
                    "structured_gate",
                )
            },
        },
        "data": run.data,
        "splits": splits,
        "metrics": list(records),
    }
    fitted = [
        {"fold": fold, "file": fitted_file(run, fold), **models.meta()}
        for fold, models in enumerate(run.fitted_folds)
        if models is not None
    ]
    if fitted:
        doc["fitted"] = fitted
    if paired:
        doc["paired_bootstrap"] = {"resamples": n_boot, "seed": run.settings.seed, "tests": list(paired)}
    if cohorts:
        doc["cohorts"] = list(cohorts)
    return json.dumps(_round(doc), indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def fitted_file(run: ProtocolRun, fold: int) -> str:
    """The file name of a fold's fitted models: ``fitted.npz``, or ``fitted-fold<k>.npz`` in a
    cross-validated run."""
    return "fitted.npz" if len(run.splits) == 1 else f"fitted-fold{fold}.npz"


def write_reports(run: ProtocolRun, out: Path, *, n_boot: int = 1000) -> list[dict[str, Any]]:
    """Write the report files into ``out`` (created); returns the metric records."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    records = summarise(run, n_boot=n_boot)
    final = [r for r in records if r["phase"] == FINAL]
    paired = scope_tests(run, n_resamples=n_boot)
    sections = [paired_markdown(paired, mode=m, phase=FINAL, n_resamples=n_boot) for m in reversed(MODES)]
    table1 = table1_markdown(records, run) + ("\n" + sections[0] if paired else "")
    (out / "table1.md").write_text(table1, encoding="utf-8")
    if paired:
        (out / "paired.md").write_text(
            "# Paired bootstrap tests at " + FINAL + "\n\n" + "\n".join(sections), encoding="utf-8"
        )
    for fold, models in enumerate(run.fitted_folds):
        if models is not None:
            models.save(out / fitted_file(run, fold))
    (out / "table1.csv").write_text(_csv(final), encoding="utf-8")
    (out / "phases.md").write_text(_phases_markdown(records, run), encoding="utf-8")
    (out / "phases.csv").write_text(_csv(records), encoding="utf-8")
    tests = [p.to_json() for p in paired]
    cohorts = cohort_records(run, n_boot=n_boot)
    (out / "cohorts.md").write_text(cohorts_markdown(cohorts, run, titles=arm_titles(run)), encoding="utf-8")
    doc = results_json(records, run, n_boot=n_boot, paired=tests, cohorts=cohorts)
    (out / "results.json").write_text(doc, encoding="utf-8")
    lines = (json.dumps(asdict(a), ensure_ascii=False, sort_keys=True) for a in run.answers)
    (out / "answers.jsonl").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return records

"""Metrics per (mode, phase, arm) and the reports: Table 1, per-phase tables, results.json.

Metrics (every value in [0, 1]; the Markdown tables print percent, like the paper):

- ``token_f1`` and ``exact_match``: SQuAD-style on normalised answers, mean over answers, with a
  95% percentile bootstrap interval that resamples *patients* (:func:`~.metrics.bootstrap_ci`).
- ``bleu4``: corpus BLEU-4 (:func:`~.metrics.corpus_bleu4`); ``rouge_l``: mean ROUGE-L F
  (with a patient bootstrap interval).
- ``finding_f1``: micro F1 of the 14 CheXpert-style finding labels (:mod:`.labeler`, uncertain
  counted positive), with a patient bootstrap interval; ``finding_f1_macro`` beside it.
- gate counts (memory configurations only): answers written to long-term memory, answers
  discarded, and the discard reasons (each discarded answer counted once per failed code).

Files written by :func:`write_reports`: ``table1.md``/``.csv`` (phase WB4, one row per arm and
mode, the untrained and the fitted rows together, then the frozen paired bootstrap of S+E+V),
``phases.md``/``.csv`` (every mode, phase and arm; the gate's discard reasons per phase),
``paired.md`` (:mod:`.bootstrap`, both modes at WB4), ``results.json`` (settings, data
fingerprint, split, every metric, the paired tests of every phase, the fitted record),
``fitted.npz`` (the fitted parameters, when fitted) and ``answers.jsonl`` (every answer). Nothing random or
machine-specific goes in, so equal runs give byte-identical files.
"""

from __future__ import annotations

import csv
import io
import json
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import asdict
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from .._memory.labeler import finding_f1, label
from .bootstrap import paired_markdown, paired_tests, targets_and_rivals
from .metrics import bootstrap_ci, corpus_bleu4, exact_match, rouge_l, token_f1
from .records import CONFIGS, FITTED_ARMS, MODES, Answered, ProtocolRun, arm_config
from .split import PHASES

__all__ = ["METRICS", "finding_counts", "results_json", "summarise", "table1_markdown", "write_reports"]

#: Metric keys in report order, with their column titles.
METRICS: dict[str, str] = {
    "token_f1": "F1",
    "exact_match": "EM",
    "bleu4": "BLEU-4",
    "rouge_l": "ROUGE-L",
    "finding_f1": "Finding F1",
    "finding_f1_macro": "Finding F1 (macro)",
}
FINAL = PHASES[-1]


@lru_cache(maxsize=65536)
def _positives(text: str) -> frozenset[str]:
    return frozenset(obs for obs, v in label(text).items() if v in (1, -1))


def finding_counts(prediction: str, reference: str) -> tuple[int, int, int]:
    """(TP, FP, FN) of the finding labels of one pair over the 14 observations (uncertain = positive)."""
    p, r = _positives(prediction), _positives(reference)
    return len(p & r), len(p - r), len(r - p)


def _micro(counts: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    tp, fp, fn = counts[..., 0], counts[..., 1], counts[..., 2]
    den = 2 * tp + fp + fn
    return np.where(den == 0, 1.0, 2 * tp / np.maximum(den, 1))


Counts = dict[str, list[tuple[int, int, int]]]


def _finding_ci(by_patient: Counts, n_boot: int, seed: int) -> tuple[float, float, float]:
    sums = np.array([np.sum(by_patient[p], axis=0) for p in sorted(by_patient)], dtype=np.float64)
    point = float(_micro(sums.sum(axis=0)))
    idx = np.random.default_rng(seed).integers(0, len(sums), size=(n_boot, len(sums)))
    low, high = np.quantile(_micro(sums[idx].sum(axis=1)), [0.025, 0.975])
    return point, float(low), float(high)


def _ci(by_patient: dict[str, list[float]], n_boot: int, seed: int) -> dict[str, float]:
    mean, low, high = bootstrap_ci(by_patient, n_resamples=n_boot, seed=seed)
    return {"mean": mean, "low": low, "high": high}


def _score(answers: Sequence[Answered], n_boot: int, seed: int) -> dict[str, Any]:
    preds, refs = [a.prediction for a in answers], [a.reference for a in answers]
    per: dict[str, dict[str, list[float]]] = {k: defaultdict(list) for k in ("token_f1", "exact_match", "rouge_l")}
    counts: Counts = defaultdict(list)
    for a in answers:
        per["token_f1"][a.patient_id].append(token_f1(a.prediction, a.reference))
        per["exact_match"][a.patient_id].append(exact_match(a.prediction, a.reference))
        per["rouge_l"][a.patient_id].append(rouge_l(a.prediction, a.reference))
        counts[a.patient_id].append(finding_counts(a.prediction, a.reference))
    mean, low, high = _finding_ci(counts, n_boot, seed)
    gates = [a.gate for a in answers if a.gate]
    reasons = Counter(code for g in gates if g != "written" for code in g.split(":", 1)[1].split("+"))
    return {
        "n": len(answers),
        "patients": len(counts),
        **{k: _ci(v, n_boot, seed) for k, v in per.items()},
        "bleu4": {"mean": corpus_bleu4(preds, refs)},
        "finding_f1": {"mean": mean, "low": low, "high": high},
        "finding_f1_macro": {"mean": finding_f1(preds, refs)["macro"]},
        "gate": {
            "written": sum(g == "written" for g in gates),
            "discarded": sum(g != "written" for g in gates),
            "reasons": dict(sorted(reasons.items())),
        },
    }


def summarise(run: ProtocolRun, *, n_boot: int = 1000) -> list[dict[str, Any]]:
    """One metrics record per (mode, phase, arm) that has answers, in mode, phase, arm order."""
    groups: dict[tuple[str, str, str], list[Answered]] = defaultdict(list)
    for a in run.answers:
        groups[(a.mode, a.phase, a.arm)].append(a)
    out = []
    for mode in MODES:
        for phase in PHASES:
            for arm in run.arms:
                if answers := groups.get((mode, phase, arm)):
                    kind = "memory" if arm in CONFIGS else "fitted" if arm in FITTED_ARMS else "baseline"
                    out.append(
                        {
                            "mode": mode,
                            "phase": phase,
                            "arm": arm,
                            "kind": kind,
                            **_score(answers, n_boot, run.settings.seed),
                        }
                    )
    return out


# ---------------------------------------------------------------------------------- writing


def _round(x: Any) -> Any:
    if isinstance(x, float):
        return round(x, 6)
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_round(v) for v in x]
    return x


def _flat(rec: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {k: rec[k] for k in ("mode", "phase", "arm", "kind", "n", "patients")}
    for key in METRICS:
        for part, value in rec[key].items():
            row[key if part == "mean" else f"{key}_{part}"] = f"{value:.4f}"
    gate = rec["gate"]
    row.update(
        gate_written=gate["written"],
        gate_discarded=gate["discarded"],
        gate_reasons=";".join(f"{k}:{v}" for k, v in gate["reasons"].items()),
    )
    return row


def _csv(records: Sequence[dict[str, Any]]) -> str:
    rows = [_flat(r) for r in records]
    buf = io.StringIO()
    if rows:
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return buf.getvalue()


def _pct(m: dict[str, float]) -> str:
    text = f"{100 * m['mean']:.2f}"
    return f"{text} [{100 * m['low']:.1f}, {100 * m['high']:.1f}]" if "low" in m else text


_ARM_TITLES = {
    "none": "no memory (agent)",
    "ft": "no memory, fitted image model (FT)",
    "SEV-ft": "SEV, fitted backbone and router (MoE-FT)",
    "prior": "baseline: population prior",
    "copy-prior": "baseline: copy patient's last answer",
    "nearest-neighbour": "baseline: nearest neighbour (population)",
}
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
    """The paper's Table 1 shape: one row per arm, metric columns (percent, 95% patient CI)."""
    s, m = run.settings, run.memory_settings
    lines = [
        f"# Table 1: performance by memory configuration at {phase}",
        "",
        f"Data: {run.data['name']} ({run.data['labelled']} labelled studies, {run.data['patients']} patients; "
        f"fingerprint `{str(run.data['fingerprint'])[:16]}`). Encoder `{s.encoder}`, backbone `{s.backbone}`, "
        f"feedback `{s.feedback}`, seed {s.seed}; gate tau {m.tau}, at least {m.min_answer_words} words"
        f"{' (shorter answers: novelty only)' if m.structured_gate else ''}. "
        "Percent; brackets: 95% bootstrap interval over patients.",
        "",
    ]
    for mode in MODES:
        rows = [r for r in records if r["mode"] == mode and r["phase"] == phase]
        if not rows:
            continue
        title = _MODE_TITLES[mode].format(phase=phase)
        lines += [
            f"## {title} ({rows[0]['n']} answers, {rows[0]['patients']} patients)",
            "",
            "| Configuration | S | E | V | " + " | ".join(METRICS.values()) + " |",
            "|---|:-:|:-:|:-:|" + "---:|" * len(METRICS),
        ]
        for r in rows:
            name = _ARM_TITLES.get(r["arm"], r["arm"])
            marks = " | ".join(_mark(r["arm"], c) for c in "SEV")
            lines.append(f"| {name} | {marks} | " + " | ".join(_pct(r[k]) for k in METRICS) + " |")
        lines.append("")
    return "\n".join(lines)


def _phases_markdown(records: Sequence[dict[str, Any]], run: ProtocolRun) -> str:
    lines = [
        "# Metrics per write-back phase",
        "",
        "Percent. Frozen: the same validation queries after each phase. Online: each phase's own "
        "studies, answered before write-back. Gate: answers written / discarded by the write-back gate.",
        "",
    ]
    for mode in MODES:
        phases = [p for p in PHASES if any(r["mode"] == mode and r["phase"] == p for r in records)]
        for key in ("token_f1", "exact_match", "finding_f1"):
            lines += [
                f"## {mode}: {METRICS[key]}",
                "",
                "| Arm | " + " | ".join(phases) + " |",
                "|---|" + "---:|" * len(phases),
            ]
            for arm in run.arms:
                cells = {
                    r["phase"]: f"{100 * r[key]['mean']:.2f}" for r in records if r["mode"] == mode and r["arm"] == arm
                }
                lines.append(f"| {arm} | " + " | ".join(cells.get(p, "") for p in phases) + " |")
            lines.append("")
        lines += [
            f"## {mode}: write-back gate (written / discarded)",
            "",
            "| Configuration | " + " | ".join(phases) + " |",
            "|---|" + "---:|" * len(phases),
        ]
        for arm in (*run.settings.configs, *run.fitted_arms):
            cells = {r["phase"]: _gate_cell(r["gate"]) for r in records if r["mode"] == mode and r["arm"] == arm}
            lines.append(f"| {arm} | " + " | ".join(cells.get(p, "") for p in phases) + " |")
        lines.append("")
    return "\n".join(lines)


def _gate_cell(gate: dict[str, Any]) -> str:
    why = ", ".join(f"{k} {v}" for k, v in gate["reasons"].items())
    return f"{gate['written']} / {gate['discarded']}" + (f" ({why})" if why else "")


def results_json(
    records: Sequence[dict[str, Any]], run: ProtocolRun, *, n_boot: int, paired: Sequence[dict[str, Any]] = ()
) -> str:
    """Everything as canonical JSON (sorted keys, floats rounded to 6 places)."""
    m = run.memory_settings
    split = {name: list(ids) for name, ids in zip(PHASES, run.split.phases, strict=True)}
    split.update(finetune=list(run.split.finetune), validation=list(run.split.validation))
    doc: dict[str, Any] = {
        "format": "msm-mem-eval/1",
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
        "split": {"counts": run.split.counts(), "patients": split},
        "metrics": list(records),
    }
    if run.fitted is not None:
        doc["fitted"] = {"file": "fitted.npz", **run.fitted.meta()}
    if paired:
        doc["paired_bootstrap"] = {"resamples": n_boot, "seed": run.settings.seed, "tests": list(paired)}
    return json.dumps(_round(doc), indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def write_reports(run: ProtocolRun, out: Path, *, n_boot: int = 1000) -> list[dict[str, Any]]:
    """Write the report files into ``out`` (created); returns the metric records."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    records = summarise(run, n_boot=n_boot)
    final = [r for r in records if r["phase"] == FINAL]
    targets, rivals = targets_and_rivals(run.arms)
    paired = paired_tests(run.answers, targets, rivals, n_resamples=n_boot, seed=run.settings.seed)
    sections = [paired_markdown(paired, mode=m, phase=FINAL, n_resamples=n_boot) for m in reversed(MODES)]
    table1 = table1_markdown(records, run) + ("\n" + sections[0] if paired else "")
    (out / "table1.md").write_text(table1, encoding="utf-8")
    if paired:
        (out / "paired.md").write_text(
            "# Paired bootstrap tests at " + FINAL + "\n\n" + "\n".join(sections), encoding="utf-8"
        )
    if run.fitted is not None:
        run.fitted.save(out / "fitted.npz")
    (out / "table1.csv").write_text(_csv(final), encoding="utf-8")
    (out / "phases.md").write_text(_phases_markdown(records, run), encoding="utf-8")
    (out / "phases.csv").write_text(_csv(records), encoding="utf-8")
    tests = [p.to_json() for p in paired]
    (out / "results.json").write_text(results_json(records, run, n_boot=n_boot, paired=tests), encoding="utf-8")
    lines = (json.dumps(asdict(a), ensure_ascii=False, sort_keys=True) for a in run.answers)
    (out / "answers.jsonl").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return records

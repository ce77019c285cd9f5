"""PNG plots of an evaluation (matplotlib, Agg backend, imported lazily).

- ``figure6.png``: a metric against phase, one line per arm (the paper's Figure 6); two panels,
  the frozen probe (Base..WB4) and the online phases (WB1..WB4); baselines dashed. Token F1
  over all questions; ``figure6_finding_f1.png`` the finding-label F1 over all questions; and,
  when the run has several question types, ``figure6_<type>.png`` each type's first metric
  (``label``: exact match, ``yes_no``: accuracy, ``text``: token F1).
- ``configs.png``: bars by arm at WB4, token F1 and exact match over all questions, 95%
  patient intervals.
- ``gate.png``: write-back gate per online phase and memory configuration: answers written,
  and discarded ones by the codes they failed.

Plots are drawn from the metric records of :func:`msm_mem.eval.scores.summarise`; records
without a ``question_type`` (an older results.json) count as all questions.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._errors import MissingExtra
from .records import CONFIGS, MODES
from .scores import ALL, METRICS, SCOPE_METRICS
from .split import PHASES

__all__ = ["write_plots"]


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise MissingExtra("matplotlib", "plots") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _style(arm: str) -> dict[str, Any]:
    return {"linestyle": "-", "marker": "o"} if arm in CONFIGS else {"linestyle": "--", "marker": "x", "alpha": 0.8}


Records = Sequence[dict[str, Any]]


def _figure6(plt: Any, records: Records, arms: Sequence[str], key: str, title: str, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, mode in zip(axes, MODES[::-1], strict=True):
        phases = [p for p in PHASES if any(r["mode"] == mode and r["phase"] == p for r in records)]
        for arm in arms:
            by_phase = {r["phase"]: r[key]["mean"] for r in records if r["mode"] == mode and r["arm"] == arm}
            ax.plot(phases, [100 * by_phase.get(p, float("nan")) for p in phases], label=arm, **_style(arm))
        ax.set_title(f"{mode}: " + ("same validation queries" if mode == "frozen" else "each phase's own studies"))
        ax.set_xlabel("phase")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"{title} (%)")
    axes[1].legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


def _bars(plt: Any, records: Records, arms: Sequence[str], path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, mode in zip(axes, MODES[::-1], strict=True):
        rows = {r["arm"]: r for r in records if r["mode"] == mode and r["phase"] == PHASES[-1]}
        names = [a for a in arms if a in rows]
        for offset, (key, label) in zip((-0.2, 0.2), (("token_f1", "F1"), ("exact_match", "EM")), strict=True):
            means = [100 * rows[a][key]["mean"] for a in names]
            errs = [
                [100 * (rows[a][key]["mean"] - rows[a][key]["low"]) for a in names],
                [100 * (rows[a][key]["high"] - rows[a][key]["mean"]) for a in names],
            ]
            xs = [i + offset for i in range(len(names))]
            bars = ax.bar(xs, means, width=0.4, yerr=errs, capsize=2, label=label)
            for bar, arm in zip(bars, names, strict=True):
                if arm not in CONFIGS:
                    bar.set_hatch("//")
        ax.set_xticks(range(len(names)), names, rotation=45, ha="right")
        ax.set_title(f"{mode} at {PHASES[-1]}")
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("percent (95% patient bootstrap interval)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


def _gate(plt: Any, records: Records, configs: Sequence[str], path: Path) -> None:
    rows = [r for r in records if r["mode"] == "online" and r["arm"] in configs]
    phases = [p for p in PHASES if any(r["phase"] == p for r in rows)]
    codes = sorted({c for r in rows for c in r["gate"]["reasons"]})
    cols = min(4, max(len(configs), 1))
    nrows = -(-max(len(configs), 1) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(3.2 * cols, 3.0 * nrows), sharey=True, squeeze=False)
    for ax, arm in zip(axes.flat, configs, strict=False):
        by_phase = {r["phase"]: r["gate"] for r in rows if r["arm"] == arm}
        written = [by_phase.get(p, {}).get("written", 0) for p in phases]
        ax.bar(phases, written, label="written", color="tab:green")
        discarded = [by_phase.get(p, {}).get("discarded", 0) for p in phases]
        ax.bar(phases, discarded, bottom=written, label="discarded", color="tab:gray", alpha=0.6)
        for j, code in enumerate(codes):  # reasons: one marker per failed code (answers may fail several)
            counts = [by_phase.get(p, {}).get("reasons", {}).get(code, 0) for p in phases]
            ax.plot(phases, counts, marker="_v^sd"[j % 5], linestyle=":", label=f"failed: {code}")
        ax.set_title(arm)
        ax.grid(axis="y", alpha=0.3)
    for ax in list(axes.flat)[len(configs) :]:
        ax.axis("off")
    axes[0][0].set_ylabel("answers (online)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


def write_plots(
    records: Sequence[dict[str, Any]], out: Path, *, arms: Sequence[str], configs: Sequence[str]
) -> list[Path]:
    """Write the PNG plots into ``out``; returns their paths. Raises :class:`MissingExtra`
    when matplotlib is not installed."""
    plt = _pyplot()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    overall = [r for r in records if r.get("question_type", ALL) == ALL]
    paths = [out / "figure6.png", out / "figure6_finding_f1.png", out / "configs.png"]
    _figure6(plt, overall, arms, "token_f1", "token F1", paths[0])
    _figure6(plt, overall, arms, "finding_f1", "finding-label F1", paths[1])
    _bars(plt, overall, arms, paths[2])
    if configs:
        paths.append(out / "gate.png")
        _gate(plt, overall, configs, paths[-1])
    kinds = [k for k in SCOPE_METRICS if k != ALL and any(r.get("question_type") == k for r in records)]
    if len(kinds) > 1:
        for kind in kinds:
            key = SCOPE_METRICS[kind][0]
            mine = [r for r in records if r.get("question_type") == kind and not r.get("question")]
            paths.append(out / f"figure6_{kind}.png")
            _figure6(plt, mine, arms, key, f"{kind}: {METRICS[key]}", paths[-1])
    return paths

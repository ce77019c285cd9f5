"""Tables and the plot of `bench_peers.py`, from its report (``peers.json``)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

LIMITS = {"patient": "numpy over the patient's rows", "population": "faiss-flat"}


def _n(n: int) -> str:
    return f"{n // 1_000_000}M" if n >= 1_000_000 and n % 1_000_000 == 0 else f"{n // 1000}k"


def _rows(report: dict[str, Any], kind: str, scope: str) -> tuple[list[int], dict[str, dict[int, dict[str, Any]]]]:
    sizes: list[int] = sorted({r["n"] for r in report["runs"] if r["kind"] == kind})
    table: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for run in report["runs"]:
        if run["kind"] != kind:
            continue
        for row in run.get(scope, []):
            table[row["label"]][run["n"]] = row
    return sizes, table


def _cell(row: dict[str, Any] | None, limit: dict[str, Any] | None) -> str:
    if row is None:
        return "-"
    text = f"{row['median_ms']:.3f} ({row['p95_ms']:.3f})"
    if limit is not None:
        text += f" {row['median_ms'] / limit['median_ms']:.2f}x"
    if "recall" in row:
        text += f" r={row['recall']:.3f}"
    if row.get("value") is not None:
        text += f" {row['knob']}={row['value']}"
    if "paired" in row:
        text += f" [{row['paired']['ratio']:.2f}x {row['paired'].get('limit', 'numpy')}, paired]"
    return text


def _latency_table(report: dict[str, Any], kind: str, scope: str, limit_label: str) -> None:
    sizes, table = _rows(report, kind, scope)
    print("| system | " + " | ".join(f"N={_n(n)}" for n in sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    limit = table.get(limit_label, {})
    for label, by_n in table.items():
        print(f"| {label} | " + " | ".join(_cell(by_n.get(n), limit.get(n)) for n in sizes) + " |")


def _footprint_table(report: dict[str, Any], kind: str) -> None:
    runs = [r for r in report["runs"] if r["kind"] == kind]
    sizes = sorted({r["n"] for r in runs})
    print("| system | " + " | ".join(f"N={_n(n)}: rows/s; index s; disk B/row; RSS B/row" for n in sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    by_system: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for r in runs:
        by_system[r["system"]][r["n"]] = r
    for name, by_n in by_system.items():
        cells = []
        for n in sizes:
            r = by_n.get(n)
            if r is None:
                cells.append("-")
                continue
            index = sum(x.get("index_s", 0.0) for x in [r.get("prepare", {}), *r["patient"]])
            pg = name == "pgvector"
            rss = "server" if pg else f"{r['per_row']['resident']:,.0f}"
            cells.append(f"{r['build']['build_rows_per_s']:,.0f}; {index:.1f}; {r['per_row']['disk']:,.0f}; {rss}")
        print(f"| {name} | " + " | ".join(cells) + " |")


def print_tables(report: dict[str, Any]) -> None:
    kinds = list(dict.fromkeys(r["kind"] for r in report["runs"]))
    versions: dict[str, str] = {}
    for r in report["runs"]:
        versions.update(r.get("versions", {}))
    threads = report.get("threads") or "each library's default"
    print(
        f"\nmachine: {report['machine']}; threads: {threads}; "
        + ", ".join(f"{k} {v}" for k, v in sorted(versions.items()))
    )
    for name, (limit, why) in report["caps"].items():
        print(f"capped: {name} at N <= {limit:,}: {why}")
    for kind in kinds:
        desc = next(r["description"] for r in report["runs"] if r["kind"] == kind)
        print(f"\n### {kind}: {desc.split(' + ')[0] if kind == 'random' else 'real embeddings + clustered'}\n")
        print("Patient-scoped exact top-5, median ms (p95), ratio to numpy over the patient's rows, recall@5:\n")
        _latency_table(report, kind, "patient", LIMITS["patient"])
        print("\nPopulation top-10, median ms (p95), ratio to FAISS flat, recall@10 against it, knob:\n")
        _latency_table(report, kind, "population", LIMITS["population"])
        print("\nBuild and footprint (rows/s of the build; index builds apart; per dataset row):\n")
        _footprint_table(report, kind)


def merge(paths: list[Path]) -> dict[str, Any]:
    """One report of several runs' ``peers.json`` (their runs and caps together; a system at a
    size and data set measured twice is kept from the last file naming it)."""
    import json

    reports = [json.loads(p.read_text()) for p in paths]
    runs: dict[tuple[str, int, str], Any] = {}
    caps: dict[str, Any] = {}
    for r in reports:
        runs.update({(run["kind"], run["n"], run["system"]): run for run in r["runs"]})
        caps.update(r["caps"])
    built = {name.split("/")[0] for _, _, name in runs}
    caps = {name: cap for name, cap in caps.items() if "/" in name or name not in built}
    return {**reports[-1], "runs": list(runs.values()), "caps": caps}


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(14, 10))
    panels: list[tuple[Any, str, Callable[[dict[str, Any]], list[tuple[str, float]]]]] = [
        (axes[0][0], "patient-scoped top-5, median ms", lambda r: [(x["label"], x["median_ms"]) for x in r["patient"]]),
        (
            axes[0][1],
            "population top-10, median ms (at recall@10 >= 0.95 where tuned)",
            lambda r: [(x["label"], x["median_ms"]) for x in r["population"]],
        ),
        (axes[1][0], "build, rows/s", lambda r: [(r["system"], r["build"]["build_rows_per_s"])]),
        (
            axes[1][1],
            "bytes per row: disk (solid), resident (dotted)",
            lambda r: (
                [(r["system"] + " disk", r["per_row"]["disk"])]
                + ([] if r["system"] == "pgvector" else [(r["system"] + " RSS", r["per_row"]["resident"])])
            ),
        ),
    ]
    for ax, title, pick in panels:
        series: dict[str, list[tuple[int, float]]] = defaultdict(list)
        for r in report["runs"]:
            for label, value in pick(r):
                series[f"{label} [{r['kind']}]"].append((r["n"], value))
        for label, points in sorted(series.items()):
            points.sort()
            style = ":" if label.split(" [")[0].endswith(" RSS") else ("-" if "[random]" in label else "--")
            ax.plot([p[0] for p in points], [p[1] for p in points], style, marker="o", label=label)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("N (rows)")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=5)
    fig.tight_layout()
    fig.savefig(path, dpi=120)

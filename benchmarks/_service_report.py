"""The tables bench_service.py prints: each run's medians over rounds, the service's overhead
over an in-process call, and the library versions."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import sqlite3
import statistics
import subprocess

__all__ = ["LABELS", "report", "versions"]

LABELS = {"retrieve": "retrieve (upload)", "retrieve-study": "retrieve (stored study)", "ask": "ask + write-back"}


def versions() -> str:
    names = ["msm-mem", "fastapi", "uvicorn", "uvloop", "httptools", "starlette", "pydantic", "httpx", "numpy"]
    out = [f"Python {platform.python_version()}", f"SQLite {sqlite3.sqlite_version}"]
    for name in names + ["psycopg", "pgserver"]:
        try:
            out.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            if name in names:
                out.append(f"{name} (not installed)")
    wrk_version = subprocess.run(["wrk", "--version"], capture_output=True, text=True).stdout.split("[")[0].strip()
    return ", ".join(out + [wrk_version or "wrk"])


def _median(runs: list[dict[str, float] | str], key: str) -> float | None:
    values = [r[key] for r in runs if isinstance(r, dict)]
    return statistics.median(values) if values else None


def report(
    args: argparse.Namespace,
    results: dict[tuple[str, str, int, int, str], list[dict[str, float] | str]],
    over: dict[tuple[str, str], tuple[float, float]],
    loads: list[float],
) -> None:
    print(
        f"\nwrk, {', '.join(map(str, args.connections))} connections, {args.seconds:.0f} s per run, "
        f"median of {args.rounds} interleaved rounds; {os.cpu_count()} cores shared with the load generator; "
        "load average during the runs "
        f"{min(loads):.1f} to {max(loads):.1f}\n"
    )
    print(
        "| store | server setting | workers | connections | operation | requests/s | p50 ms | p99 ms "
        "| server CPU ms/request | of it, event loop | context switches/request | refused |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (store, setting, workers, conns, op), runs in results.items():
        label = LABELS[op]
        refused = [r for r in runs if isinstance(r, str)]
        if len(refused) == len(runs):
            print(f"| {store} | {setting} | {workers} | {conns} | {label} | {refused[0]} | | | | | | |")
            continue
        rps, p50, p99, cpu, loop, switches, err = (
            _median(runs, k) for k in ("rps", "p50", "p99", "cpu_ms", "loop_ms", "switches", "refused")
        )
        figures = f"{rps:.0f} | {p50:.1f} | {p99:.1f} | {cpu:.2f} | {loop:.2f} | {switches:.0f} | {err:.0f}"
        print(f"| {store} | {setting} | {workers} | {conns} | {label} | {figures} |")
    print(
        "\n| store | server setting | one retrieve over HTTP, median ms | MsmMem.retrieve in process, median ms "
        "| ratio |"
    )
    print("|---|---|---|---|---|")
    for (store, setting), (h, d) in over.items():
        print(f"| {store} | {setting} | {h:.2f} | {d:.2f} | {h / d:.2f}x |")
    print(f"\n{versions()}")

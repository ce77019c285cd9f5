"""Timing, recall and memory helpers of `bench_peers.py`."""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np


def rss_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def timed(query: Any, args: list[tuple[Any, ...]], warmup: int) -> tuple[list[float], list[list[int]]]:
    for a in args[:warmup]:
        query(*a)
    times, results = [], []
    for a in args:
        t = time.perf_counter()
        r = query(*a)
        times.append(time.perf_counter() - t)
        results.append(r)
    return times, results


def paired(
    query: Any, limit: Any, args: list[tuple[Any, ...]], warmup: int
) -> tuple[list[float], list[list[int]], dict[str, Any]]:
    """``query`` timed as :func:`timed` does, with ``limit`` timed alternately on the same
    arguments (which one goes first alternating too): their ratio is measured side by side,
    whatever the load does."""
    for a in args[:warmup]:
        query(*a), limit(*a)
    mine: list[float] = []
    base: list[float] = []
    results = []
    for i, a in enumerate(args):
        for first in (i % 2 == 0, i % 2 == 1):
            t = time.perf_counter()
            r = (query if first else limit)(*a)
            (mine if first else base).append(time.perf_counter() - t)
            if first:
                results.append(r)
    a_ms, b_ms = statistics.median(mine) * 1e3, statistics.median(base) * 1e3
    return mine, results, {"median_ms": a_ms, "limit_ms": b_ms, "ratio": a_ms / b_ms}


def recall(got: list[list[int]], truth: np.ndarray) -> float:
    return float(np.mean([len(set(g) & set(t.tolist())) / len(t) for g, t in zip(got, truth, strict=True)]))


def stats(times: list[float]) -> dict[str, float]:
    return {"median_ms": statistics.median(times) * 1e3, "p95_ms": float(np.percentile(times, 95)) * 1e3}

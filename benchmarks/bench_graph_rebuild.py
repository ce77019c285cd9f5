"""What the population graph's rebuild costs the writes and searches around it: the rebuild on
the write that crosses the mark (as before) against the rebuild in a background thread.

The embedded store rebuilds its graph in one batch when a link would take it to twice its last
build (``graph.py``). This builds a ``VectorIndex`` graph over ``--rows`` / 2 clustered 1024-d
unit vectors (300 random centres, spread 0.6) in one batch, then writes ``--batch`` vectors at a
time at ``--rate`` vectors a second (a write-back's pace; a write that overruns its slot starts
the next at once), with ``--searches`` population top-10 searches after each write, until the
write that crosses ``--rows`` has started the rebuild and the rebuild is taken (or
``--max-seconds``, or 4 x ``--rows`` vectors are written; ``--rate`` past what links keep up
with shows the store under a bulk load). It does that twice in one process, as the store does now (the rebuild in
the background) and then with the rebuild on the write (``BACKGROUND`` set past the size),
the second writing as many vectors as the first, and prints per way: the crossing write, the
longest write and the write median and p99 (ms); the population searches from the crossing
to the last write (the same vectors both ways), median and p99 (ms); how long after the
crossing the rebuild was taken; the graph's last build; and recall@10 of the grown graph
against exact search on ``--queries`` of the rows, after every vector is linked.

Usage: python benchmarks/bench_graph_rebuild.py [--rows 100000] [--batch 1000] [--rate 1000]
    [--searches 20] [--queries 500] [--max-seconds 900]
"""

from __future__ import annotations

import argparse
import statistics
import time

import faiss
import numpy as np

from msm_mem._storage.sqlite import graph as graph_module
from msm_mem._storage.sqlite.vector_index import VectorIndex

DIM = 1024
DEFAULT_BACKGROUND = graph_module.BACKGROUND


def _p(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def run(x: np.ndarray, rows: int, args: argparse.Namespace, background: bool, stop: int) -> dict[str, float]:
    """One way; writes go on until the rebuild is taken and at least ``stop`` vectors are written."""
    graph_module.BACKGROUND = DEFAULT_BACKGROUND if background else 1 << 62
    half = rows // 2
    index = VectorIndex(DIM, 16)
    index.add(x[:half], ["p"] * half, link=False)
    index.link()  # built in one batch, waited for
    graph = index.graph
    assert graph is not None and graph.built == half
    rng = np.random.default_rng(1)
    writes: list[float] = []
    searches: list[float] = []
    crossing = float("nan")
    crossed_at = taken_at = 0.0
    at, start = half, time.perf_counter()
    while at + args.batch <= len(x):
        slot = start + (at - half) / args.rate
        wait = slot - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        t0 = time.perf_counter()
        index.add(x[at : at + args.batch], ["p"] * args.batch)
        spent = time.perf_counter() - t0
        writes.append(spent)
        at += args.batch
        if not crossed_at and at >= rows:
            crossing, crossed_at = spent, time.perf_counter()
        if crossed_at and not taken_at and not graph.rebuilding and graph.built >= rows:
            taken_at = time.perf_counter()
        if taken_at and at >= stop:
            break
        for z in x[rng.integers(at, size=args.searches)]:
            t0 = time.perf_counter()
            index.population(z, 10, None)
            if crossed_at:
                searches.append(time.perf_counter() - t0)
        if time.perf_counter() - start > args.max_seconds:
            break
    index.link()
    q = x[rng.integers(index.ntotal, size=args.queries)]
    exact = faiss.IndexFlatIP(DIM)
    exact.add(x[: index.ntotal])
    want = exact.search(q, 10)[1]
    got = [[p for p, _ in index.population(z, 10, None)] for z in q]
    recall = float(np.mean([len(set(g) & set(w)) / 10 for g, w in zip(got, want.tolist(), strict=True)]))
    return {
        "crossing write ms": crossing * 1e3,
        "longest write ms": max(writes) * 1e3,
        "write median ms": statistics.median(writes) * 1e3,
        "write p99 ms": _p(writes, 99) * 1e3,
        "search median ms (crossing to last write)": _p(searches, 50) * 1e3,
        "search p99 ms (crossing to last write)": _p(searches, 99) * 1e3,
        "crossing to taken s": (taken_at - crossed_at) if taken_at else float("nan"),
        "vectors written": float(at),
        "last build, vectors": float(graph.built),
        "recall@10 after": recall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=100_000, help="the size whose write starts the rebuild")
    ap.add_argument("--batch", type=int, default=1000, help="vectors a write")
    ap.add_argument("--rate", type=float, default=1000.0, help="vectors written a second")
    ap.add_argument("--searches", type=int, default=20, help="population searches after each write")
    ap.add_argument("--queries", type=int, default=500, help="queries for recall@10 at the end")
    ap.add_argument("--max-seconds", type=float, default=900.0, help="stop writing after this long")
    args = ap.parse_args()
    if args.rows < 20_000 or args.batch < 1 or args.rate <= 0 or args.searches < 0 or args.queries < 10:
        ap.error("need --rows >= 20000, --batch >= 1, --rate > 0, --searches >= 0 and --queries >= 10")
    total = args.rows + int(args.rate * args.max_seconds) + args.batch
    total = min(total, 4 * args.rows)
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((300, DIM)).astype(np.float32)
    x = centres[rng.integers(300, size=total)]
    x += 0.6 * rng.standard_normal(x.shape, dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    now = run(x, args.rows, args, True, 0)
    before = run(x, args.rows, args, False, int(now["vectors written"]))  # as many vectors as ``now``
    columns = {"on the write (before)": before, "in the background (now)": now}
    print(
        f"{args.rows // 2:,} clustered {DIM}-d vectors built in one batch, then writes of {args.batch:,} "
        f"at {args.rate:,.0f} vectors/s with {args.searches} population searches after each; "
        f"the write that reaches {args.rows:,} starts the rebuild"
    )
    names = list(columns)
    print("| | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for key in columns[names[0]]:
        print(f"| {key} | " + " | ".join(f"{columns[n][key]:,.3f}" for n in names) + " |")
    print(f"faiss-cpu {faiss.__version__}, numpy {np.__version__}, OpenMP threads {faiss.omp_get_max_threads()}")


if __name__ == "__main__":
    main()

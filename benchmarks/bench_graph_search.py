"""Benchmark of one population search through the embedded store's graph against the same
FAISS HNSW graph searched directly: what the store's wrapper (``_storage/sqlite/graph.py``)
adds per search.

Builds one graph (``Graph``, the store's M and construction depth) over ``--rows`` clustered
unit vectors of 1024 dimensions on two threads, then times, on one thread, each query three
ways: ``Graph.search`` (the store's call, its search parameters made once per depth), the
graph's FAISS index given new ``SearchParametersHNSW`` for each search (as the store did before
it kept them), and the FAISS index with its depth set on the index (the cheapest way FAISS
offers, as the peers benchmark calls FAISS HNSW). Every query is run once untimed before each
timed run, so each way times a query whose path through the graph is already in cache; the
ways take turns first. Prints medians, and ratios to the direct search.

Usage: python benchmarks/bench_graph_search.py [--rows 50000] [--queries 2000] [--ef 32]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import faiss
import numpy as np

from msm_mem._storage.sqlite.graph import Graph

DIM = 1024


def clustered(rng: np.random.Generator, n: int, centres: int, spread: float) -> np.ndarray:
    c = rng.standard_normal((centres, DIM)).astype(np.float32)
    x = c[rng.integers(0, centres, n)] + spread * rng.standard_normal((n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--queries", type=int, default=2_000)
    ap.add_argument("--ef", type=int, default=32, help="search depth (population_ef_search)")
    ap.add_argument("--k", type=int, default=10)
    args = ap.parse_args()
    if args.rows < 1000 or args.queries < 100 or not 1 <= args.ef <= 4096 or not 1 <= args.k <= args.ef:
        ap.error("need --rows >= 1000, --queries >= 100, 1 <= --ef <= 4096 and 1 <= --k <= --ef")
    rng = np.random.default_rng(0)
    x = clustered(rng, args.rows, 200, 0.3)
    graph = Graph(DIM, args.ef)
    faiss.omp_set_num_threads(2)
    graph.extend(x)
    faiss.omp_set_num_threads(1)
    q = x[rng.integers(0, args.rows, args.queries)] + 0.1 * rng.standard_normal((args.queries, DIM)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    none = np.zeros(0, dtype=np.int64)
    index = graph.hnsw

    def store(z: np.ndarray) -> list[int]:
        return [i for i, _ in graph.search(z, args.k, none, 0)]

    def new_params(z: np.ndarray) -> list[int]:
        params = faiss.SearchParametersHNSW()  # type: ignore[attr-defined]
        params.efSearch = args.ef
        _, ids = index.search(z.reshape(1, -1), args.k, params=params)
        return [int(i) for i in ids[0]]

    def depth_on_index(z: np.ndarray) -> list[int]:
        index.hnsw.efSearch = args.ef
        _, ids = index.search(z.reshape(1, -1), args.k)
        return [int(i) for i in ids[0]]

    ways: dict[str, Callable[[np.ndarray], list[int]]] = {
        "Graph.search (the store's)": store,
        "FAISS, new SearchParametersHNSW per search": new_params,
        "FAISS, depth set on the index": depth_on_index,
    }
    names = list(ways)
    for z in q[:100]:
        answers = [ways[name](z) for name in names]
        assert all(a == answers[0] for a in answers), "the three ways must return the same hits"
    times: dict[str, list[int]] = {name: [] for name in names}
    for j, z in enumerate(q):
        for r in range(len(names)):
            name = names[(j + r) % len(names)]
            ways[name](z)
            start = time.perf_counter_ns()
            ways[name](z)
            times[name].append(time.perf_counter_ns() - start)
    base = statistics.median(times[names[2]])
    print(f"{args.rows:,} clustered {DIM}-d rows, ef {args.ef}, k {args.k}, {args.queries:,} queries, one thread")
    print("| search | median us | ratio to the depth set on the index |")
    print("|---|---|---|")
    for name in names:
        med = statistics.median(times[name])
        print(f"| {name} | {med / 1e3:.1f} | {med / base:.2f}x |")
    print(f"faiss-cpu {faiss.__version__}, numpy {np.__version__}")


if __name__ == "__main__":
    main()

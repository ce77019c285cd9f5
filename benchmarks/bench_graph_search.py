"""Benchmark of one population search through the embedded store, layer by layer, against the
same FAISS HNSW graph searched directly: what each layer above FAISS adds per search.

Writes ``--rows`` clustered unit vectors of 1024 dimensions as episodic records of a new store
(``MsmMem.init``, ``population_search="hnsw"``, 10 rows a patient; the store links them into
its graph, on two threads), then times, on one thread, each query five ways on that one graph:
``search_many`` (the store's call: the query checked, the store's lock, the retired rows left
out, the ids of the hits), ``VectorIndex.population`` (the graph's hits merged with the tail
not linked yet, sorted), ``Graph.search`` (the store's graph call, its search parameters made
once per depth), the graph's FAISS index given new ``SearchParametersHNSW`` for each search (as
the store did before it kept them), and the FAISS index with its depth set on the index (the
cheapest way FAISS offers, as the peers benchmark calls FAISS HNSW). Every query is run once
untimed before each timed run, so each way times a query whose path through the graph is
already in cache; the ways take turns first. Prints medians, and ratios to the direct search.

Usage: python benchmarks/bench_graph_search.py [--rows 50000] [--queries 2000] [--ef 32] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import faiss
import numpy as np

from msm_mem import EpisodicRecord, MsmMem, Principal, Settings
from msm_mem._storage.base import WriteBatch
from msm_mem._storage.sqlite import SqliteStore
from msm_mem._storage.sqlite.vectors import RETIRED
from msm_mem.testing import FixedClock

DIM = 1024


def clustered(rng: np.random.Generator, n: int, centres: int, spread: float) -> np.ndarray:
    c = rng.standard_normal((centres, DIM)).astype(np.float32)
    x = c[rng.integers(0, centres, n)] + spread * rng.standard_normal((n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def build(directory: Path, x: np.ndarray, ef: int) -> MsmMem:
    """A store holding the rows as episodic records, opened for approximate population search."""
    admin = Principal("bench-admin", "admin", "operations")
    settings = Settings(population_search="hnsw", population_ef_search=ef)
    with MsmMem.init(directory, admin, settings=settings, clock=FixedClock(1.7e9)) as mem:
        for start in range(0, len(x), 5000):
            rows = range(start, min(len(x), start + 5000))
            episodes = [EpisodicRecord(f"E-{i}", f"P{i // 10}", 1.6e9, x[i], "q?", "a.") for i in rows]
            mem._store.write(WriteBatch(episodes=episodes))
    faiss.omp_set_num_threads(2)
    mem = MsmMem.open(directory, settings=settings, clock=FixedClock(1.7e9))
    faiss.omp_set_num_threads(1)
    return mem


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--queries", type=int, default=2_000)
    ap.add_argument("--ef", type=int, default=32, help="search depth (population_ef_search)")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--workdir", type=Path, default=None, help="scratch folder, created if missing")
    args = ap.parse_args()
    if args.rows < 1000 or args.queries < 100 or not 1 <= args.ef <= 4096 or not 1 <= args.k <= args.ef:
        ap.error("need --rows >= 1000, --queries >= 100, 1 <= --ef <= 4096 and 1 <= --k <= --ef")
    if args.workdir is not None:
        if args.workdir.exists() and not args.workdir.is_dir():
            ap.error(f"--workdir {args.workdir} is not a folder")
        args.workdir.mkdir(parents=True, exist_ok=True)  # the store goes in a temporary folder inside
    with tempfile.TemporaryDirectory(dir=args.workdir) as work:
        run(args, Path(work) / "store")


def run(args: argparse.Namespace, directory: Path) -> None:
    rng = np.random.default_rng(0)
    x = clustered(rng, args.rows, 200, 0.3)
    mem = build(directory, x, args.ef)
    store = mem._store
    assert isinstance(store, SqliteStore)
    vectors = store._index["episodic"]
    graph = vectors.graph
    assert graph is not None and graph.covered == args.rows, "the store's graph must cover every row"
    q = x[rng.integers(0, args.rows, args.queries)] + 0.1 * rng.standard_normal((args.queries, DIM)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    none = np.zeros(0, dtype=np.int64)
    index = graph.hnsw

    def search_many(z: np.ndarray) -> list[str]:
        return [i for i, _ in store.search_many(z, [("episodic", args.k)], None)[0]]

    def population(z: np.ndarray) -> list[int]:
        return [i for i, _ in vectors.population(z, args.k, RETIRED)]

    def store_graph(z: np.ndarray) -> list[int]:
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

    ways: dict[str, Callable[[np.ndarray], list[int] | list[str]]] = {
        "store.search_many (the store's call)": search_many,
        "VectorIndex.population (hits and tail, sorted)": population,
        "Graph.search (the store's graph call)": store_graph,
        "FAISS, new SearchParametersHNSW per search": new_params,
        "FAISS, depth set on the index": depth_on_index,
    }
    names = list(ways)
    for z in q[:100]:  # the same graph, the same depth: the same hits (record E-i is at position i)
        answers = [sorted(int(str(i).removeprefix("E-")) for i in ways[name](z)) for name in names]
        assert all(a == answers[0] for a in answers), "every way must return the same hits"
    times: dict[str, list[int]] = {name: [] for name in names}
    for j, z in enumerate(q):
        for r in range(len(names)):
            name = names[(j + r) % len(names)]
            ways[name](z)
            start = time.perf_counter_ns()
            ways[name](z)
            times[name].append(time.perf_counter_ns() - start)
    base = statistics.median(times[names[-1]])
    print(f"{args.rows:,} clustered {DIM}-d rows, ef {args.ef}, k {args.k}, {args.queries:,} queries, one thread")
    print("| search | median us | ratio to the depth set on the index |")
    print("|---|---|---|")
    for name in names:
        med = statistics.median(times[name])
        print(f"| {name} | {med / 1e3:.1f} | {med / base:.2f}x |")
    print(f"faiss-cpu {faiss.__version__}, numpy {np.__version__}")
    mem.close()


if __name__ == "__main__":
    main()

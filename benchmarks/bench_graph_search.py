"""Benchmark of one population search through the embedded store, layer by layer, beside a
FAISS HNSW index of float32 vectors (the peer as ``bench_peers.py`` builds it) on the same rows.

Writes ``--rows`` unit vectors of 1024 dimensions (``--data``: ``bench_peers.py``'s realistic
cxr set, or random clusters) as episodic records of a new store (``MsmMem.init``, exact search,
10 rows a patient), reopens it with ``population_search="hnsw"`` (the store links every vector
into its graph in one batch on open, on two threads, as ``bench_peers.py --hnsw-from-exact``
does; with ``--grown`` the store is written with the graph on, so it is grown by the writes as
a store in use grows it: rebuilt in one batch when it doubles, the rows between linked 5,000 a
write at level 0) and builds FAISS's ``IndexHNSWFlat`` (the store's M and efConstruction, inner product,
the rows added in one batch): two graphs built the same way, one walked on 8-bit codes, one on
float32 vectors. Then, at each depth of ``--ef``, it times on one thread five ways of answering
the top-k: ``search_many`` (the store's call: the query
checked, the store's lock, the retired rows left out, the ids of the hits),
``VectorIndex.population`` (the graph's hits merged with the tail not linked yet),
``Graph.search`` (the walk on the graph's 8-bit codes and its best candidates scored exactly),
the walk on codes alone (its scores approximate: what the exact scoring adds) and the peer, its
depth set on the index (the cheapest way FAISS offers). Each query is answered by one way only,
the ways taking turns query by query, so no way finds another's path through memory in cache
(the store's ways share one graph); each way answers ``--queries`` queries, one at a time.
Prints medians, p95, recall@k against exact search and the ratio of each median to the
peer's.

Usage: python benchmarks/bench_graph_search.py [--rows 50000] [--queries 2000] [--ef 16 32 64]
       [--data cxr|clustered] [--grown] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import faiss
import numpy as np
from _peers_data import CXR_DIR, cxr_embeddings, make_data

from msm_mem import EpisodicRecord, MsmMem, Principal, Settings
from msm_mem._storage.base import WriteBatch
from msm_mem._storage.sqlite import SqliteStore
from msm_mem._storage.sqlite.graph import EF_CONSTRUCTION, M
from msm_mem._storage.sqlite.vectors import RETIRED
from msm_mem.testing import FixedClock

DIM = 1024


#: warm-up queries, answered by every way untimed and then left out
WARMUP = 50
WAYS = [
    "store.search_many (the store's call)",
    "VectorIndex.population (hits and tail, sorted)",
    "Graph.search (walk on codes, candidates scored exactly)",
    "the walk on codes alone (FAISS IndexHNSWSQ, approximate scores)",
    "FAISS IndexHNSWFlat, depth set on the index (the peer)",
]


def clustered(rng: np.random.Generator, n: int, centres: int, spread: float) -> np.ndarray:
    c = rng.standard_normal((centres, DIM)).astype(np.float32)
    x = c[rng.integers(0, centres, n)] + spread * rng.standard_normal((n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def build(directory: Path, x: np.ndarray, ef: int, one_batch: bool = False) -> MsmMem:
    """A store holding the rows as episodic records, opened for approximate population search:
    its graph linked as the rows were written or (``one_batch``) the rows written with exact
    search and the store reopened with the graph, which links them all in one batch."""
    admin = Principal("bench-admin", "admin", "operations")
    settings = Settings(population_search="hnsw", population_ef_search=ef)
    first = Settings() if one_batch else settings
    with MsmMem.init(directory, admin, settings=first, clock=FixedClock(1.7e9)) as mem:
        for start in range(0, len(x), 5000):
            rows = range(start, min(len(x), start + 5000))
            episodes = [EpisodicRecord(f"E-{i}", f"P{i // 10}", 1.6e9, x[i], "q?", "a.") for i in rows]
            mem._store.write(WriteBatch(episodes=episodes))
    del mem
    gc.collect()  # the closed store's vectors, before the reopened store reads its own
    faiss.omp_set_num_threads(2)
    mem = MsmMem.open(directory, settings=settings, clock=FixedClock(1.7e9))
    faiss.omp_set_num_threads(1)
    return mem


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--queries", type=int, default=2_000)
    ap.add_argument("--ef", type=int, nargs="+", default=[16, 32, 64], help="search depths (population_ef_search)")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--workdir", type=Path, default=None, help="scratch folder, created if missing")
    ap.add_argument(
        "--data",
        choices=["cxr", "clustered"],
        default="cxr",
        help="cxr: bench_peers.py's realistic set (the shared chest X-rays' embeddings and vectors "
        "clustered around them; needs ../shared); clustered: 200 random centres, spread 0.3",
    )
    ap.add_argument("--grown", action="store_true", help="the store's graph grown by its writes, not built on reopen")
    args = ap.parse_args()
    if args.rows < 1000 or args.queries < 100 or not all(1 <= ef <= 4096 for ef in args.ef) or args.k < 1:
        ap.error("need --rows >= 1000, --queries >= 100, every --ef in [1, 4096] and --k >= 1")
    if args.workdir is not None:
        if args.workdir.exists() and not args.workdir.is_dir():
            ap.error(f"--workdir {args.workdir} is not a folder")
        args.workdir.mkdir(parents=True, exist_ok=True)  # the store goes in a temporary folder inside
    real = None
    if args.data == "cxr":
        real = cxr_embeddings()
        if real is None:
            ap.error(f"--data cxr needs the shared chest X-rays ({CXR_DIR}); use --data clustered without them")
    with tempfile.TemporaryDirectory(dir=args.workdir) as work:
        run(args, Path(work), real)


def _rows_and_queries(args: argparse.Namespace, work: Path, real: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    total = WARMUP + args.queries * len(WAYS)
    if real is None:
        rng = np.random.default_rng(0)
        x = clustered(rng, args.rows, 200, 0.3)
        q = x[rng.integers(0, args.rows, total)] + 0.1 * rng.standard_normal((total, DIM)).astype(np.float32)
        return x, q / np.linalg.norm(q, axis=1, keepdims=True)
    make_data("cxr", args.rows, total, work / "data", real)
    # the rows read in place (the page cache holds them, not the process): at 1M they are 4 GB
    return np.load(work / "data" / "x.npy", mmap_mode="r"), np.load(work / "data" / "popq.npy")[:total]


def run(args: argparse.Namespace, work: Path, real: np.ndarray | None) -> None:
    rows, q = _rows_and_queries(args, work, real)
    mem = build(work / "store", rows, args.ef[0], one_batch=not args.grown)
    del rows
    store = mem._store
    assert isinstance(store, SqliteStore)
    vectors = store._index["episodic"]
    graph = vectors.graph
    assert graph is not None and graph.covered == args.rows, "every row linked"
    assert args.grown or graph.built == args.rows, "one graph built over every row"
    x = vectors.vectors()  # the rows, in order: the store's float32 vectors, read in place
    faiss.omp_set_num_threads(2)
    peer = faiss.IndexHNSWFlat(DIM, M, faiss.METRIC_INNER_PRODUCT)
    peer.hnsw.efConstruction = EF_CONSTRUCTION
    peer.add(x)
    _, truth = faiss.knn(q, x, args.k, metric=faiss.METRIC_INNER_PRODUCT)
    faiss.omp_set_num_threads(1)
    how = "both graphs built in one batch"
    if args.grown:
        how = f"the store's graph grown by its writes (last built in one batch at {graph.built:,} rows)"
    print(
        f"{args.rows:,} {args.data} {DIM}-d rows, k {args.k}, {args.queries:,} queries a way and depth,"
        f" one thread; {how}"
    )
    print(f"| depth | search | median us | p95 us | recall@{args.k} | ratio to the peer's median |")
    print("|---|---|---|---|---|---|")
    for ef in args.ef:
        graph.ef_search = peer.hnsw.efSearch = graph.hnsw.hnsw.efSearch = ef
        times, found = _timed(args, store, q, truth, peer)
        base = statistics.median(times[-1])
        for w, name in enumerate(WAYS):
            med = statistics.median(times[w])
            p95 = float(np.percentile(times[w], 95))
            recall = found[w] / len(times[w])
            print(f"| {ef} | {name} | {med / 1e3:.1f} | {p95 / 1e3:.1f} | {recall:.3f} | {med / base:.2f}x |")
    print(f"faiss-cpu {faiss.__version__}, numpy {np.__version__}")
    mem.close()


def _timed(
    args: argparse.Namespace, store: SqliteStore, q: np.ndarray, truth: np.ndarray, peer: faiss.IndexHNSWFlat
) -> tuple[list[list[int]], list[float]]:
    """Each query answered by one way (the ways in turn): the times and recall sums of each."""
    vectors = store._index["episodic"]
    graph = vectors.graph
    assert graph is not None
    none = np.zeros(0, dtype=np.int64)

    def search_many(z: np.ndarray) -> list[int]:
        return [int(i.removeprefix("E-")) for i, _ in store.search_many(z, [("episodic", args.k)], None)[0]]

    def population(z: np.ndarray) -> list[int]:
        return [i for i, _ in vectors.population(z, args.k, RETIRED)]

    def store_graph(z: np.ndarray) -> list[int]:
        return [i for i, _ in graph.search(z, args.k, none, 0, vectors._index)]

    def codes_only(z: np.ndarray) -> list[int]:
        _, ids = graph.hnsw.search(z.reshape(1, -1), args.k)
        return [int(i) for i in ids[0]]

    def flat_peer(z: np.ndarray) -> list[int]:
        _, ids = peer.search(z.reshape(1, -1), args.k)
        return [int(i) for i in ids[0]]

    ways: list[Callable[[np.ndarray], list[int]]] = [search_many, population, store_graph, codes_only, flat_peer]
    for z in q[:WARMUP]:  # warm-up, untimed, on queries of their own
        for way in ways:
            way(z)
    times: list[list[int]] = [[] for _ in ways]
    found: list[float] = [0.0 for _ in ways]
    for j, z in enumerate(q[WARMUP:], start=WARMUP):
        w = (j + j // len(ways)) % len(ways)  # every way in turn, in an order that rotates
        start = time.perf_counter_ns()
        hits = ways[w](z)
        times[w].append(time.perf_counter_ns() - start)
        found[w] += len(set(hits) & set(truth[j].tolist())) / args.k
    return times, found


if __name__ == "__main__":
    main()

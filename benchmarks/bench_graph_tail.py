"""What the unlinked tail of the embedded store's population graph costs: a population search
with a tail of each size, and a link of each size.

Vectors added to a ``VectorIndex`` with a graph wait in a tail, scored exactly at every
population search, until :data:`TAIL` of them are linked in one call (``graph.py``). This builds
the graph over ``--rows`` clustered 1024-d unit vectors (300 random centres, spread 0.6) in one
batch, then times (medians, two threads for links as the store uses them):

- a link of 1,024, 256 and 64 vectors (``--links`` calls each, the tail size set for the call),
  per call and per vector: each call also prepares state for every node of the graph;
- ``VectorIndex.population`` (top-10, ``--queries`` queries) with a tail of 0, 64, 256 and
  1,023 vectors.

Usage: python benchmarks/bench_graph_tail.py [--rows 300000] [--queries 400] [--links 8]
"""

from __future__ import annotations

import argparse
import statistics
import time

import faiss
import numpy as np

from msm_mem._storage.sqlite import vector_index as vector_index_module
from msm_mem._storage.sqlite.graph import TAIL
from msm_mem._storage.sqlite.vector_index import VectorIndex

DIM = 1024
LINKS = (1024, 256, 64)
TAILS = (0, 64, 256, TAIL - 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=300_000)
    ap.add_argument("--queries", type=int, default=400)
    ap.add_argument("--links", type=int, default=8, help="link calls timed at each size")
    args = ap.parse_args()
    if args.rows < 10_000 or args.queries < 10 or args.links < 1:
        ap.error("need --rows >= 10000, --queries >= 10 and --links >= 1")
    extra = args.links * sum(LINKS) + sum(TAILS)
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((300, DIM)).astype(np.float32)
    x = centres[rng.integers(300, size=args.rows + extra)]
    x += 0.6 * rng.standard_normal(x.shape, dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    q = x[rng.integers(args.rows, size=args.queries)]
    index = VectorIndex(DIM, 16)
    start = time.perf_counter()
    index.add(x[: args.rows], ["p"] * args.rows, link=False)
    index.link()  # built in one batch, waited for
    print(f"{args.rows:,} clustered {DIM}-d vectors, graph built in one batch in {time.perf_counter() - start:.0f} s")
    at = args.rows
    print("| link call | median ms | us a vector |")
    print("|---|---|---|")
    for size in LINKS:
        vector_index_module.TAIL = size  # the add that fills the tail links it
        times = []
        for _ in range(args.links):
            start = time.perf_counter()
            index.add(x[at : at + size], ["p"] * size)
            times.append(time.perf_counter() - start)
            at += size
        median = statistics.median(times)
        print(f"| {size:,} vectors | {median * 1e3:.1f} | {median / size * 1e6:.0f} |")
    vector_index_module.TAIL = TAIL
    graph = index.graph
    assert graph is not None and graph.covered == index.ntotal
    print(f"| tail | population top-10, median us ({args.queries} queries) |")
    print("|---|---|")
    for size in TAILS:
        if size:
            index.add(x[at : at + size], ["p"] * size)  # fewer than TAIL: left in the tail
            at += size
        assert index.ntotal - graph.covered == size
        times_ns = []
        for z in q:
            start_ns = time.perf_counter_ns()
            index.population(z, 10, None)
            times_ns.append(time.perf_counter_ns() - start_ns)
        print(f"| {size:,} | {statistics.median(times_ns) / 1e3:.0f} |")
        index.link()
    print(f"faiss-cpu {faiss.__version__}, numpy {np.__version__}")


if __name__ == "__main__":
    main()

"""Recall of the embedded store's population graph when part of it is linked after its last
build in one batch, the way each part is linked: why the store links that part at level 0.

Draws ``--rows`` 1024-d unit vectors with ``bench_peers.py``'s realistic generator (10 rows a
patient, patient i's rows i, i + P, i + 2P, ... as a patient's studies arrive; the first rows
the real embeddings themselves), around only the first ``--images`` of the shared chest X-rays'
embeddings, so that many patients share a
cluster (30 images at 100,000 rows: 333 patients an image, as many as 1,000,000 rows around all
299). Then builds graphs of the store's kind (``graph.py``: 8-bit codes, M 32, construction
depth 40) over the rows and measures recall@10 against exact search at each ``--ef``:

- all rows in one batch;
- the first ``1 - --late`` of the rows in one batch, the rest linked ``--write`` at a time
  as FAISS links a batch (each node's level drawn, some raised into the upper layers): with the
  rows in arrival order, shuffled first, and on float32 vectors (``IndexHNSWFlat``);
- the same, the rest linked at level 0 only (the store's ``Graph.extend``), and at level 0
  after a build over a half, a tenth and a fiftieth of the rows.

Each search is the store's (``Graph.search``: the walk, its best candidates scored exactly).
Prints a table and the time each graph took to build. Recall, not time, is the point.

Usage: python benchmarks/bench_graph_growth.py [--rows 100000] [--images 30] [--late 0.25]
       [--queries 500] [--ef 16 64] [--write 5000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import faiss
import numpy as np
from _peers_data import CXR_DIR, PATIENT_ROWS, cxr_embeddings, make_data

from msm_mem._storage.sqlite import graph as graph_module
from msm_mem._storage.sqlite.graph import EF_CONSTRUCTION, Graph, M

DIM = 1024


def rows_and_queries(args: argparse.Namespace, real: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``bench_peers.py``'s cxr set drawn around ``real`` (its generator, ``make_data``)."""
    with tempfile.TemporaryDirectory() as work:
        make_data("cxr", args.rows, args.queries, Path(work), real)
        return np.load(Path(work) / "x.npy"), np.load(Path(work) / "popq.npy")[: args.queries]


def grown(x: np.ndarray, built: int, write: int, level0: bool, flat_vectors: bool = False) -> Graph:
    """A graph built in one batch over ``x[:built]``, the rest linked ``write`` at a time."""
    graph = Graph(DIM, 16)
    if flat_vectors:  # FAISS's graph of float32 vectors, built as the store builds its own
        graph.hnsw = faiss.IndexHNSWFlat(DIM, M, faiss.METRIC_INNER_PRODUCT)  # type: ignore[assignment]
        graph.hnsw.hnsw.efConstruction = EF_CONSTRUCTION
        graph.hnsw.add(np.ascontiguousarray(x[:built]))
        graph.covered = graph.built = built
    else:
        graph.extend(x[:built])
    rebuild, graph_module.REBUILD = graph_module.REBUILD, 10**9  # no rebuild: the split is the point
    try:
        for start in range(built, len(x), write):
            stop = min(len(x), start + write)
            if level0:
                graph.extend(x[:stop])
            else:
                graph.hnsw.add(np.ascontiguousarray(x[start:stop]))
                graph.covered = stop
    finally:
        graph_module.REBUILD = rebuild
    return graph


def recall(graph: Graph, flat: faiss.IndexFlatIP, q: np.ndarray, truth: np.ndarray, ef: int) -> float:
    graph.ef_search, graph._search_params = ef, None
    none = np.zeros(0, dtype=np.int64)
    found = sum(
        len({p for p, _ in graph.search(z, 10, none, 0, flat)} & set(t.tolist())) for z, t in zip(q, truth, strict=True)
    )
    return found / truth.size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--images", type=int, default=30, help="real embeddings the rows are drawn around")
    ap.add_argument("--late", type=float, default=0.25, help="share of the rows linked after the build")
    ap.add_argument("--queries", type=int, default=500)
    ap.add_argument("--ef", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--write", type=int, default=5000, help="rows linked a call")
    args = ap.parse_args()
    if args.rows < 1000 or not 0 < args.late < 1 or args.queries < 10 or args.write < 1:
        ap.error("need --rows >= 1000, 0 < --late < 1, --queries >= 10 and --write >= 1")
    if not all(1 <= ef <= 4096 for ef in args.ef):
        ap.error("every --ef must be in [1, 4096]")
    real = cxr_embeddings()
    if real is None:
        ap.error(f"needs the shared chest X-rays ({CXR_DIR})")
    if not 1 <= args.images <= len(real):
        ap.error(f"--images must be in [1, {len(real)}]")
    x, q = rows_and_queries(args, real[: args.images])
    built = round(args.rows * (1 - args.late))
    shuffled = x[np.random.default_rng(5).permutation(len(x))]
    late = f"the last {args.rows - built:,} linked {args.write:,} a call"
    # (graph, its rows, rows in the one batch, the rest at level 0, float32 vectors)
    cases = [
        ("all rows in one batch", x, len(x), True, False),
        (f"{late}, levels drawn (as FAISS links a batch)", x, built, False, False),
        (f"{late}, levels drawn, rows shuffled first", shuffled, built, False, False),
        (f"{late}, levels drawn, float32 vectors", x, built, False, True),
        (f"{late}, at level 0 (the store)", x, built, True, False),
    ]
    cases += [(f"built over 1/{s}, the rest at level 0 (the store)", x, len(x) // s, True, False) for s in (2, 10, 50)]
    print(
        f"{args.rows:,} cxr rows around {args.images} real embeddings"
        f" ({args.rows // PATIENT_ROWS // args.images:,} patients an image), {args.queries} queries, recall@10"
    )
    print("| graph | build s | " + " | ".join(f"depth {ef}" for ef in args.ef) + " |")
    print("|---|---|" + "---|" * len(args.ef))
    for name, rows, first, level0, flat_vectors in cases:
        exact = faiss.IndexFlatIP(DIM)
        exact.add(rows)  # the positions the graph returns are positions in ``rows``
        want = exact.search(q, 10)[1]
        start = time.perf_counter()
        graph = grown(rows, first, args.write, level0, flat_vectors)
        seconds = time.perf_counter() - start
        figures = " | ".join(f"{recall(graph, exact, q, want, ef):.3f}" for ef in args.ef)
        print(f"| {name} | {seconds:.0f} | {figures} |", flush=True)
    print(f"faiss-cpu {faiss.__version__}, numpy {np.__version__}")


if __name__ == "__main__":
    main()

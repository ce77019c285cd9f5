"""The approximate population index of the embedded store: an HNSW graph walked on 8-bit codes,
its candidates scored exactly.

Chosen by the setting ``population_search="hnsw"`` (exact search is the default). The graph
(``faiss.IndexHNSWSQ``, inner product, :data:`M` links a node, construction depth
:data:`EF_CONSTRUCTION`) keeps its own copy of each vector as 8-bit codes (one byte a
dimension, a quarter of the float32 vector), and the walk through it reads only those. Its
best :data:`RESCORE` times k candidates (at most the search depth) are then scored exactly
against the float32 vectors of the flat index the patient-scoped search reads, and the top k of
those exact scores is the answer: the scores a search returns are exact cosines, and only
which vectors are found is approximate. On 100,000 of the benchmark's realistic 1024-d rows,
both graphs built in one batch, this search found as much of the true top-10 as the same walk
on float32 vectors (FAISS's ``IndexHNSWFlat``, the same M and construction depth) at every
depth (0.964 against 0.957 at depth 16, 0.974 against 0.972 at 32, 0.986 against 0.988 at 64)
in 0.68x to 0.80x its time (``benchmarks/bench_graph_search.py``): the walk is bound by memory
traffic, and a code is a quarter of a vector.

The codes are quantised per dimension over a range read from the vectors at each build in one
batch (their minimum and maximum, widened by :data:`PAD` of the range and at least
``0.5 / sqrt(dim)``); a vector linked later that falls outside it is clamped, which only makes
its walk distances coarser. The graph covers the first ``covered`` positions; the vectors added
after them (the *tail*, fewer than :data:`TAIL` unless the graph is being caught up) are scored
exactly at every search, and are linked into the graph in one batch when the tail reaches
:data:`TAIL` (and before every save). So a write does not pay an HNSW insert per vector; one
write in :data:`TAIL` vectors pays for the batch. On 300,000 clustered 1024-d vectors (two
threads; ``benchmarks/bench_graph_tail.py``), a tail of 1,023 added 0.07 ms to a population
search (0.20 ms with none, 0.27 with 1,023), and linking cost 279 us a vector 1,024 at a time,
319 us 256 at a time and 391 us 64 at a time (each call prepares state for every node).

The tail is linked at level 0 only: its nodes' levels are preset to the base level, so the
layers above it (the routes a walk takes down to level 0) hold only nodes of the last build in
one batch. Linked the way FAISS links a batch, with some of its nodes raised to the upper
layers, the tail broke those routes: on 100,000 of the benchmark's realistic 1024-d rows, drawn
around 30 of its real images (333 patients an image, as many as 1,000,000 rows around all 299),
a graph built in one batch over the first 75,000 and given the other 25,000 5,000 at a time
recalled 0.929 of the top-10 at depth 16, and no more than 0.933 at depth 64 (whole patients
out of reach of a walk), against 0.988 for the same rows built in one batch; 0.938 with the
rows shuffled first, so it is not the order they arrive in; 0.940 on float32 vectors (FAISS's
``IndexHNSWFlat``), so not the codes. Linked at level 0 only: 0.999, and 0.995 with half the
graph linked that way, 0.989 with nine tenths, 0.968 with 49 parts in 50
(``benchmarks/bench_graph_growth.py``; ``bench_graph_search.py --grown`` times a store's graph
grown by its writes beside FAISS's). When a link would take the graph to :data:`REBUILD`
times the size of its last full build, the whole graph is rebuilt in one batch instead, so at
most half its nodes are linked at level 0 and the upper layers are drawn again from every
vector: each vector is linked about twice over the life of the store, and the write that
crosses the mark pays for the rebuild (the time of an HNSW build of every vector, 53 s for
300,000 on two threads in ``bench_graph_tail.py``; the codes are held twice while it runs).

Retired positions (superseded or retracted records, a shredded patient's among them) stay in
the graph, which cannot delete nodes, but a bitmap selector of the live positions goes with
every search: FAISS walks through them and never returns one.

The graph is saved in a file of its own beside the flat index's. The file is checked before
use (its SHA-256 recorded in the sidecar, the kind of index, the metric, the sizes, the code
ranges and the neighbour ids): a file that fails any check is rebuilt from the vectors.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import faiss
import numpy as np
import numpy.typing as npt

__all__ = ["EF_CONSTRUCTION", "M", "REBUILD", "RESCORE", "TAIL", "Graph", "file_sha256"]

#: links per node (FAISS's ``M``; level 0 has ``2 M``)
M = 32
#: candidate list depth while linking a node
EF_CONSTRUCTION = 40
#: vectors kept out of the graph (and scored exactly) before they are linked in one batch
TAIL = 1024
#: the graph is rebuilt in one batch when a link would take it to this many times its last build
REBUILD = 2
#: a search scores this many times k of the walk's best candidates exactly (at most its depth)
RESCORE = 2
#: the code range of a dimension is widened by this share of it on each side
PAD = 0.05
#: rows read for the code ranges at a build (evenly spaced over the vectors)
RANGE_SAMPLE = 65_536
_QT: Any = faiss.ScalarQuantizer.QT_8bit  # an enum value; faiss's stubs type it as the class


def _new_hnsw(dim: int) -> faiss.IndexHNSWSQ:
    hnsw = faiss.IndexHNSWSQ(dim, _QT, M, faiss.METRIC_INNER_PRODUCT)
    hnsw.hnsw.efConstruction = EF_CONSTRUCTION
    return hnsw


def _codes(hnsw: faiss.IndexHNSW) -> faiss.IndexScalarQuantizer:
    return cast(faiss.IndexScalarQuantizer, faiss.downcast_index(hnsw.storage))


def _set_ranges(hnsw: faiss.IndexHNSWSQ, view: npt.NDArray[np.float32]) -> None:
    """Quantise each dimension over the range of ``view`` (a sample of it), widened (module)."""
    n, dim = view.shape
    sample = view[:: max(1, n // RANGE_SAMPLE)]
    lo, hi = sample.min(axis=0).astype(np.float64), sample.max(axis=0).astype(np.float64)
    pad = np.maximum(PAD * (hi - lo), 0.5 / np.sqrt(dim))
    lo, hi = np.maximum(lo - pad, -1.0), np.minimum(hi + pad, 1.0)
    codes = _codes(hnsw)
    faiss.copy_array_to_vector(np.concatenate([lo, hi - lo]).astype(np.float32), codes.sq.trained)
    codes.is_trained = True
    hnsw.is_trained = True


@contextmanager
def _one_thread() -> Iterator[None]:
    """FAISS on one OpenMP thread in the calling thread (OpenMP's setting is per thread).

    A search answers one query, which FAISS cannot split over threads, but its exact scoring
    (``compute_distance_subset``) still wakes a team of OpenMP threads, which then spin for a
    while; numpy's product over the tail on two BLAS threads, started while they spin, shared
    two cores with them: a population search with a tail of 1,023 vectors took 8.0 ms instead
    of 0.27 (``benchmarks/bench_graph_tail.py``, 300,000 vectors). Links keep every thread."""
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(threads)


def file_sha256(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 22):
            sha.update(chunk)
    return sha.hexdigest()


class Graph:
    """An HNSW graph over 8-bit codes of the first ``covered`` vectors (see the module docstring)."""

    def __init__(self, dim: int, ef_search: int, hnsw: faiss.IndexHNSWSQ | None = None) -> None:
        self.dim = dim
        self.hnsw = _new_hnsw(dim) if hnsw is None else hnsw
        self.ef_search = ef_search
        self.covered = int(self.hnsw.ntotal)
        #: nodes at the last build in one batch (a loaded graph: as its sidecar says)
        self.built = self.covered
        self._selector: tuple[tuple[int, int], faiss.IDSelectorBitmap, npt.NDArray[np.uint8]] | None = None
        self._search_params: tuple[tuple[int, tuple[int, int] | None], Any] | None = None

    @classmethod
    def of(cls, hnsw: faiss.Index, dim: int, ef_search: int) -> Graph | None:
        """A graph read from a cache file, or None when it is not a well-formed one of ``dim``."""
        if not isinstance(hnsw, faiss.IndexHNSWSQ) or hnsw.d != dim or not hnsw.is_trained:
            return None
        codes = _codes(hnsw)
        if hnsw.metric_type != faiss.METRIC_INNER_PRODUCT or codes.ntotal != hnsw.ntotal:
            return None
        if codes.metric_type != faiss.METRIC_INNER_PRODUCT or codes.sq.qtype != _QT or codes.sq.d != dim:
            return None
        if codes.code_size != dim or codes.codes.size() != codes.ntotal * dim:  # (FAISS's reader checks it too)
            return None
        ranges = faiss.vector_to_array(codes.sq.trained)
        if ranges.size != 2 * dim or not np.isfinite(ranges).all() or not (ranges[dim:] > 0).all():
            return None
        n = int(hnsw.ntotal)
        links: Any = hnsw.hnsw  # the SWIG struct: its vectors are not in faiss's type stubs
        if links.levels.size() != n or links.offsets.size() != n + 1:
            return None
        neighbours = faiss.vector_to_array(links.neighbors)
        offsets = faiss.vector_to_array(links.offsets)
        if n and (int(offsets[-1]) != neighbours.size or int(neighbours.max()) >= n or int(neighbours.min()) < -1):
            return None
        if n and not 0 <= int(links.entry_point) < n:
            return None
        return cls(dim, ef_search, hnsw)

    def extend(self, view: npt.NDArray[np.float32]) -> None:
        """Link the tail (positions ``covered ..`` of ``view``, the flat index's vectors) into
        the graph, or rebuild the graph over all of ``view`` in one batch (module docstring)."""
        n = view.shape[0]
        if n == self.covered:
            return
        if n >= REBUILD * self.built:
            fresh = _new_hnsw(view.shape[1])
            _set_ranges(fresh, view)
            fresh.add(np.ascontiguousarray(view))
            self.hnsw, self._selector, self._search_params = fresh, None, None
            self.covered = self.built = n
            return
        links: Any = self.hnsw.hnsw  # the SWIG struct: its vectors are not in faiss's type stubs
        links.levels.resize(n)  # preset: the tail joins level 0 only (module docstring)
        faiss.rev_swig_ptr(links.levels.data(), n)[self.covered :] = 1
        try:
            self.hnsw.add(np.ascontiguousarray(view[self.covered :]))
        except BaseException:
            links.levels.resize(int(self.hnsw.ntotal))  # no preset left for nodes never added
            raise
        self.covered = int(self.hnsw.ntotal)

    def search(
        self,
        z: npt.NDArray[np.float32],
        k: int,
        excluded: npt.NDArray[np.int64],
        version: int,
        flat: faiss.IndexFlat,
    ) -> list[tuple[int, float]]:
        """Approximate top-k ``(position, cosine)`` among covered positions not ``excluded``
        (``version`` names the excluded set, so its selector is built once per change): the
        walk's best candidates scored exactly against ``flat`` (the float32 vectors), descending
        cosine, ties by ascending position."""
        if self.covered == 0 or k <= 0:
            return []
        params = self._params(k, excluded, version)
        query = np.ascontiguousarray(z, dtype=np.float32).reshape(1, -1)
        with _one_thread():
            _, found = self.hnsw.search(query, min(params.efSearch, RESCORE * k), params=params)
            ids = found[:, found[0] >= 0]
            if ids.size == 0:
                return []
            scores = np.empty(ids.shape, dtype=np.float32)
            exact: Any = flat  # compute_distance_subset is missing from faiss's stubs
            exact.compute_distance_subset(
                1, faiss.swig_ptr(query), ids.shape[1], faiss.swig_ptr(scores), faiss.swig_ptr(ids)
            )
        top = np.lexsort((ids[0], -scores[0]))[:k]
        return list(zip(ids[0, top].tolist(), scores[0, top].tolist(), strict=True))

    def _params(self, k: int, excluded: npt.NDArray[np.int64], version: int) -> Any:
        """The search parameters (depth, live-position selector), made once per depth and
        excluded set: a search only reads them, and searches run under the store's lock."""
        depth = max(self.ef_search, k)
        key = (depth, (version, self.covered) if excluded.size else None)
        cached = self._search_params
        if cached is not None and cached[0] == key:
            return cached[1]
        params = faiss.SearchParametersHNSW()  # type: ignore[attr-defined]  # missing from faiss's stubs
        params.efSearch = depth
        if excluded.size:
            params.sel = self._live(excluded, version)
        self._search_params = (key, params)
        return params

    def _live(self, excluded: npt.NDArray[np.int64], version: int) -> faiss.IDSelectorBitmap:
        key = (version, self.covered)
        cached = self._selector
        if cached is not None and cached[0] == key:
            return cached[1]
        live = np.ones(self.covered, dtype=bool)
        live[excluded[excluded < self.covered]] = False
        bits = np.packbits(live, bitorder="little")
        selector = faiss.IDSelectorBitmap(self.covered, faiss.swig_ptr(bits))
        self._selector = (key, selector, bits)  # the selector reads ``bits``: keep it alive
        return selector

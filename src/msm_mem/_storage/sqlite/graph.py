"""The approximate population index of the embedded store: a FAISS HNSW graph over the vectors.

Chosen by the setting ``population_search="hnsw"`` (exact search is the default). The graph
(``faiss.IndexHNSWFlat``, inner product, :data:`M` links a node, construction depth
:data:`EF_CONSTRUCTION`) owns the flat storage the patient-scoped search reads, so every vector
is held once in memory and once in the cache file. It covers the first ``covered`` positions;
the vectors added after them (the *tail*, fewer than :data:`TAIL` unless the graph is being
caught up) are scored exactly at every search, and are linked into the graph in one batch when
the tail reaches :data:`TAIL` (and before every save). So a write does not pay an HNSW insert
per vector; one write in :data:`TAIL` vectors pays for the batch.

Linking vectors in the order they arrive makes a poor graph when that order is not random. A
patient's rows arrive spread over time, between other patients' rows; linked in such rounds
(every patient's first row, then every patient's second, ...), the graph of 100,000 clustered
1024-d rows (the benchmark's realistic set) recalled 0.829 of the top-10 at search depth 32
(linked 5,000 at a time; 0.811 one by one) where the same rows linked in one batch, which
FAISS links in a random order, recalled 0.980; on 20,000 such rows of 20 clusters linked 1,024
at a time, 0.785 against 1.000, and 0.997 with the same rows shuffled first. So the order is
the cause, not the batching, the construction depth (0.775 at 128) or the links a node (0.883
at ``M`` 64). When a link would take the graph to :data:`REBUILD` times the size of its last
full build, the whole graph is rebuilt in one batch instead: at most half its nodes were then
linked in arrival order, every vector is linked about twice over the life of the store, and
the write that crosses the mark pays for the rebuild (the time of an HNSW build of every
vector; the storage is held twice while it runs).

Retired positions (superseded or retracted records, a shredded patient's among them) stay in
the graph, which cannot delete nodes, but a bitmap selector of the live positions goes with
every search: FAISS walks through them and never returns one.

The cache file of a graph is checked before use (its SHA-256 recorded in the sidecar, the
metric, the sizes and the neighbour ids): a file that fails any check is rebuilt from the rows.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, cast

import faiss
import numpy as np
import numpy.typing as npt

__all__ = ["EF_CONSTRUCTION", "M", "REBUILD", "TAIL", "Graph", "file_sha256"]

#: links per node (FAISS's ``M``; level 0 has ``2 M``)
M = 32
#: candidate list depth while linking a node
EF_CONSTRUCTION = 40
#: vectors kept out of the graph (and scored exactly) before they are linked in one batch
TAIL = 1024
#: the graph is rebuilt in one batch when a link would take it to this many times its last build
REBUILD = 2


def _new_hnsw(dim: int) -> faiss.IndexHNSWFlat:
    hnsw = faiss.IndexHNSWFlat(dim, M, faiss.METRIC_INNER_PRODUCT)
    hnsw.hnsw.efConstruction = EF_CONSTRUCTION
    return hnsw


def file_sha256(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 22):
            sha.update(chunk)
    return sha.hexdigest()


class Graph:
    """An HNSW graph and the flat storage it owns (see the module docstring)."""

    def __init__(self, dim: int, ef_search: int, hnsw: faiss.IndexHNSWFlat | None = None) -> None:
        self.hnsw = _new_hnsw(dim) if hnsw is None else hnsw
        self.ef_search = ef_search
        self.storage = cast(faiss.IndexFlat, faiss.downcast_index(self.hnsw.storage))
        self.covered = int(self.hnsw.ntotal)
        #: nodes at the last build in one batch (a loaded graph: as its sidecar says)
        self.built = self.covered
        self._selector: tuple[tuple[int, int], faiss.IDSelectorBitmap, npt.NDArray[np.uint8]] | None = None
        self._search_params: tuple[tuple[int, tuple[int, int] | None], Any] | None = None

    @classmethod
    def of(cls, hnsw: faiss.Index, dim: int, ef_search: int) -> Graph | None:
        """A graph read from a cache file, or None when it is not a well-formed one of ``dim``."""
        if not isinstance(hnsw, faiss.IndexHNSWFlat) or hnsw.d != dim:
            return None
        if hnsw.metric_type != faiss.METRIC_INNER_PRODUCT or hnsw.storage.ntotal != hnsw.ntotal:
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
        """Link the tail (positions ``covered ..`` of ``view``, the storage) into the graph, or
        rebuild the graph over all of ``view`` in one batch (see the module docstring): a new
        graph and storage then replace these (the caller re-reads :attr:`storage`).

        ``IndexHNSWFlat.add`` appends to the storage and links the new nodes; the tail is in
        the storage already, so it is cut off the storage first and added back through it."""
        n = view.shape[0]
        if n == self.covered:
            return
        if n >= REBUILD * self.built:
            fresh = _new_hnsw(view.shape[1])
            fresh.add(np.ascontiguousarray(view))  # copied into the new storage
            self.hnsw, self._selector, self._search_params = fresh, None, None
            self.storage = cast(faiss.IndexFlat, faiss.downcast_index(fresh.storage))
            self.covered = self.built = n
            return
        tail = np.array(view[self.covered :], dtype=np.float32, copy=True)
        self.storage.codes.resize(self.covered * self.storage.code_size)
        self.storage.ntotal = self.covered
        self.hnsw.add(tail)
        self.covered = int(self.hnsw.ntotal)

    def search(
        self, z: npt.NDArray[np.float32], k: int, excluded: npt.NDArray[np.int64], version: int
    ) -> list[tuple[int, float]]:
        """Approximate top-k ``(position, cosine)`` among covered positions not ``excluded``
        (``version`` names the excluded set, so its selector is built once per change)."""
        if self.covered == 0 or k <= 0:
            return []
        scores, ids = self.hnsw.search(z.reshape(1, -1), k, params=self._params(k, excluded, version))
        return [(i, s) for i, s in zip(ids[0].tolist(), scores[0].tolist(), strict=True) if i >= 0]

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

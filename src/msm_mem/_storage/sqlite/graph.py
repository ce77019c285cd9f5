"""The approximate population index of the embedded store: a FAISS HNSW graph over the vectors.

Chosen by the setting ``population_search="hnsw"`` (exact search is the default). The graph
(``faiss.IndexHNSWFlat``, inner product, :data:`M` links a node, construction depth
:data:`EF_CONSTRUCTION`) owns the flat storage the patient-scoped search reads, so every vector
is held once in memory and once in the cache file. It covers the first ``covered`` positions;
the vectors added after them (the *tail*, fewer than :data:`TAIL` unless the graph is being
caught up) are scored exactly at every search, and are linked into the graph in one batch when
the tail reaches :data:`TAIL` (and before every save). So a write does not pay an HNSW insert
per vector; one write in :data:`TAIL` vectors pays for the batch.

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

__all__ = ["EF_CONSTRUCTION", "M", "TAIL", "Graph", "file_sha256"]

#: links per node (FAISS's ``M``; level 0 has ``2 M``)
M = 32
#: candidate list depth while linking a node
EF_CONSTRUCTION = 40
#: vectors kept out of the graph (and scored exactly) before they are linked in one batch
TAIL = 1024


def file_sha256(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 22):
            sha.update(chunk)
    return sha.hexdigest()


class Graph:
    """An HNSW graph and the flat storage it owns (see the module docstring)."""

    def __init__(self, dim: int, ef_search: int, hnsw: faiss.IndexHNSWFlat | None = None) -> None:
        if hnsw is None:
            hnsw = faiss.IndexHNSWFlat(dim, M, faiss.METRIC_INNER_PRODUCT)
            hnsw.hnsw.efConstruction = EF_CONSTRUCTION
        self.hnsw = hnsw
        self.ef_search = ef_search
        self.storage = cast(faiss.IndexFlat, faiss.downcast_index(hnsw.storage))
        self.covered = int(hnsw.ntotal)
        self._selector: tuple[tuple[int, int], faiss.IDSelectorBitmap, npt.NDArray[np.uint8]] | None = None

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
        """Link the tail (positions ``covered ..`` of ``view``, the storage) into the graph.

        ``IndexHNSWFlat.add`` appends to the storage and links the new nodes; the tail is in
        the storage already, so it is cut off the storage first and added back through it."""
        n = view.shape[0]
        if n == self.covered:
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
        params = faiss.SearchParametersHNSW()  # type: ignore[attr-defined]  # missing from faiss's stubs
        params.efSearch = max(self.ef_search, k)
        if excluded.size:
            params.sel = self._live(excluded, version)
        scores, ids = self.hnsw.search(z.reshape(1, -1), k, params=params)
        return [(int(i), float(s)) for i, s in zip(ids[0], scores[0], strict=True) if i >= 0]

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

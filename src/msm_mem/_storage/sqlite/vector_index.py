"""An exact in-memory cosine index over unit vectors, with per-patient position lists.

Vectors live once in memory, inside a FAISS ``IndexFlatIP`` (inner product on unit vectors =
cosine); with approximate population search on, an HNSW graph (``graph.py``) holds 8-bit codes
of them besides. Patient-scoped queries gather that patient's rows from the FAISS storage
(through a zero-copy numpy view) and score them with one matrix-vector product, so they cost
O(rows of the patient) instead of a scan of the whole index; they are exact in both modes.
Population queries are one BLAS matrix-vector product over every row (exact; FAISS's own flat
scan runs a single query on one thread) or, with a graph, an HNSW search whose candidates are
scored exactly, plus the exact scores of the vectors not yet linked into it.

The index is a cache: the store of record rebuilds it (or catches it up) from its rows, and
:func:`save` / :func:`load` persist it (the flat index, the graph in a file of its own) with a
sidecar that says which rows it covers.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

import faiss
import numpy as np
import numpy.typing as npt

from ..._private import PRIVATE_FILE, private_file
from ..._records import Vector
from .graph import TAIL, Graph, file_sha256

__all__ = ["VectorIndex", "graph_path"]

_L = TypeVar("_L")
#: a tail of at most this many vectors is scored by the graph's search, on one thread, with its
#: candidates; a longer one (the whole store while a first build runs) by a BLAS product
SCORED_WITH_GRAPH = 4 * TAIL
_log = logging.getLogger("msm_mem")


class VectorIndex:
    """Top-k search by cosine; position i is the i-th vector added. Exact, except population
    search with ``ef_search`` given: an HNSW graph searched with that candidate depth.

    Not thread-safe: the store calls it under its lock (an add may move the FAISS storage).
    """

    def __init__(self, dim: int, ef_search: int | None = None) -> None:
        self.dim = dim
        self.graph = None if ef_search is None else Graph(dim, ef_search)
        self._index: faiss.IndexFlat = faiss.IndexFlatIP(dim)
        self._by_scope: dict[str, array[int]] = {}
        self._scope_of: list[str] = []  # position -> scope (the inverse of _by_scope)
        self._view: npt.NDArray[np.float32] | None = None
        self._n = 0  # mirrors self._index.ntotal (a SWIG attribute, slow to read on the hot path)
        self._version = 0  # changes whenever a position changes scope

    @property
    def ntotal(self) -> int:
        return self._n

    def add(self, vectors: npt.NDArray[np.float32], scopes: list[str], link: bool = True) -> None:
        """Append unit vectors (n, dim) and the scope (patient id) of each; with ``link``
        False they stay in the exact tail until the next :meth:`add` or :meth:`link` (a
        load of many rows links them once, at its end)."""
        start = self.ntotal
        self._index.add(np.ascontiguousarray(vectors, dtype=np.float32))
        self._n = int(self._index.ntotal)
        self._view = None
        for offset, scope in enumerate(scopes):
            self._by_scope.setdefault(scope, array("q")).append(start + offset)
        self._scope_of.extend(scopes)
        if self.graph is not None and link:
            if self._n - self.graph.covered >= TAIL:
                self.graph.extend(self.vectors(), wait=False)
            elif self.graph.rebuilding:
                self.graph.adopt(self.vectors())

    def link(self) -> None:
        """Link every vector not yet in the graph into it, after a rebuild in flight is done
        (no-op without a graph)."""
        if self.graph is not None and (self.graph.covered < self._n or self.graph.rebuilding):
            self.graph.extend(self.vectors())

    def set_scopes(self, scopes: list[str]) -> None:
        """Replace the scopes of positions ``0 .. len(scopes) - 1`` (vectors already stored)."""
        self._by_scope = {}
        self._scope_of = list(scopes)
        self._version += 1
        for position, scope in enumerate(scopes):
            self._by_scope.setdefault(scope, array("q")).append(position)

    def move(self, position: int, old_scope: str, new_scope: str) -> None:
        """Move one position to another scope (anonymisation moves records to ``""``)."""
        self._version += 1
        positions = self._by_scope.get(old_scope)
        if positions is not None and position in positions:
            positions.remove(position)
            if not positions:
                del self._by_scope[old_scope]
        self._by_scope.setdefault(new_scope, array("q")).append(position)
        bucket = self._by_scope[new_scope]
        if len(bucket) > 1 and bucket[-2] > position:
            self._by_scope[new_scope] = array("q", sorted(bucket))
        if position < len(self._scope_of):
            self._scope_of[position] = new_scope

    def rescope(self, position: int, scope: str) -> None:
        """Give one stored position the scope ``scope``, whatever its scope was."""
        if self._scope_of[position] != scope:
            self.move(position, self._scope_of[position], scope)

    def vectors(self) -> npt.NDArray[np.float32]:
        """A read-only zero-copy view (ntotal, dim) of the stored vectors."""
        if self._view is None:
            n = self._n
            if n == 0:
                self._view = np.zeros((0, self.dim), dtype=np.float32)
            else:
                ptr = self._index.get_xb()
                self._view = faiss.rev_swig_ptr(ptr, n * self.dim).reshape(n, self.dim)
            self._view.flags.writeable = False
        return self._view

    def positions(self, scope: str) -> npt.NDArray[np.int64]:
        """Positions of one scope, ascending."""
        bucket = self._by_scope.get(scope)
        if bucket is None:
            return np.zeros(0, dtype=np.int64)
        return np.frombuffer(bucket, dtype=np.int64)

    def scope_names(self) -> list[str]:
        return [s for s, b in self._by_scope.items() if len(b)]

    def search(self, z: Vector, k: int, scope: str | None) -> list[tuple[int, float]]:
        """Top-k ``(position, cosine)``: descending cosine, ties by ascending position."""
        if scope is None:
            return self.population(z, k, None)
        if k <= 0 or self._n == 0:
            return []
        return self.top_k(-z, k, scope, range(self._n))

    def population(self, z: Vector, k: int, excluded: str | None) -> list[tuple[int, float]]:
        """Top-k ``(position, cosine)`` over every position outside the scope ``excluded``:
        descending cosine, ties by ascending position. Exact without a graph; with one, the
        graph's approximate hits merged with the exact hits of the vectors not linked yet."""
        if k <= 0 or self._n == 0:
            return []
        skip = np.zeros(0, dtype=np.int64) if excluded is None else self.positions(excluded)
        if self.graph is None:
            return self._exact(-z, k, 0, skip)
        covered = self.graph.covered
        if self._n - covered <= SCORED_WITH_GRAPH:  # the tail scored in the graph's call
            return self.graph.search(z, k, skip, self._version, self._index, self._n)
        hits = self.graph.search(z, k, skip, self._version, self._index) + self._exact(-z, k, covered, skip)
        hits.sort(key=lambda p: (-p[1], p[0]))
        return hits[:k]

    def _exact(self, neg_z: Vector, k: int, start: int, skip: npt.NDArray[np.int64]) -> list[tuple[int, float]]:
        """Exact top-k over positions ``start ..`` not in ``skip`` (ascending), in the order of
        :meth:`top_k`: one BLAS matrix-vector product, skipped rows scored +inf."""
        view = self._view if self._view is not None else self.vectors()
        neg = view[start:] @ neg_z
        skip = skip[skip >= start] - start
        neg[skip] = np.inf
        k = min(k, neg.size - skip.size)
        if k <= 0:
            return []
        if neg.size > 4 * k:
            kth = np.partition(neg, k - 1)[k - 1]
            keep = np.flatnonzero(neg <= kth)
            top = keep[neg[keep].argsort(kind="stable")[:k]]
        else:
            top = neg.argsort(kind="stable")[:k]
        return [(start + i, -s) for i, s in zip(top.tolist(), neg[top].tolist(), strict=True)]

    def top_k(self, neg_z: Vector, k: int, scope: str, labels: Sequence[_L]) -> list[tuple[_L, float]]:
        """Top-k ``(labels[position], cosine)`` of one scope, given the negated query ``-z``.

        Descending cosine, ties by ascending position. Ascending ``x @ -z`` is descending
        ``x @ z`` (negation only flips sign bits, so the two are exact negatives), and a
        scope's positions ascend, so one stable ascending sort gives that order. ``neg_z`` is
        not checked: the caller validates and negates the query once for all its searches.
        """
        bucket = self._by_scope.get(scope)
        if not bucket or k <= 0:
            return []
        view = self._view if self._view is not None else self.vectors()
        neg = view.take(bucket, 0) @ neg_z  # gather the scope's rows (a copy), one mat-vec
        if len(bucket) > 4 * k:
            # keep every candidate tied with the k-th score, then order exactly
            kth = np.partition(neg, k - 1)[k - 1]
            keep = np.flatnonzero(neg <= kth)
            top = keep[neg[keep].argsort(kind="stable")[:k]]
        else:
            top = neg.argsort(kind="stable")[:k]
        return [(labels[bucket[i]], -s) for i, s in zip(top.tolist(), neg[top].tolist(), strict=True)]

    def max_score(self, z: Vector, scope: str) -> float | None:
        """The largest cosine of ``z`` in one scope (the top-1 score of :meth:`top_k`, computed
        the same way), None for an empty scope."""
        bucket = self._by_scope.get(scope)
        if not bucket:
            return None
        view = self._view if self._view is not None else self.vectors()
        return -float((view.take(bucket, 0) @ -z).min())

    # persistence -------------------------------------------------------------------------

    def save(self, path: Path, last_vector_sha: str) -> None:
        """Write the flat index, the graph (every vector linked first) to :func:`graph_path`,
        and their sidecar, each atomically (tmp + rename); the sidecar last, naming both."""
        tmp = path.with_suffix(path.suffix + ".tmp")
        self.link()
        faiss.write_index(self._index, str(tmp))
        os.chmod(tmp, PRIVATE_FILE)
        side: dict[str, object] = {"count": self.ntotal, "dim": self.dim, "last_sha": last_vector_sha}
        graph_file = graph_path(path)
        if self.graph is not None:
            graph_tmp = graph_file.with_suffix(graph_file.suffix + ".tmp")
            faiss.write_index(self.graph.hnsw, str(graph_tmp))
            os.chmod(graph_tmp, PRIVATE_FILE)
            side["graph_file_sha256"] = file_sha256(graph_tmp)
            side["graph_built"] = self.graph.built
            os.replace(graph_tmp, graph_file)
        else:
            graph_file.unlink(missing_ok=True)  # a graph of the other mode: no stale copy kept
        os.replace(tmp, path)
        side_tmp = path.with_suffix(".json.tmp")
        private_file(side_tmp).write_text(json.dumps(side))
        os.replace(side_tmp, path.with_suffix(".json"))

    @classmethod
    def load(cls, path: Path, dim: int, ef_search: int | None = None) -> tuple[VectorIndex, dict[str, object]] | None:
        """Load a saved index and its sidecar, or ``None`` when absent, unreadable or not the
        file its sidecar describes. With ``ef_search`` the graph is loaded from its own file;
        when that file is absent (a cache of exact search), damaged or not the one the sidecar
        fingerprints, the graph is left empty, for :meth:`link` to build from the vectors (the
        time of an HNSW build) once the caller has checked them. A cache
        of the format before, the graph's flat storage in the main file, gives its vectors."""
        side_path = path.with_suffix(".json")
        if not path.is_file() or not side_path.is_file():
            return None
        try:
            side = json.loads(side_path.read_text())
            if not isinstance(side, dict):
                return None
            legacy_sha = side.get("graph_sha256")
            if legacy_sha is not None and legacy_sha != file_sha256(path):
                return None
            index = faiss.read_index(str(path))
        except (OSError, ValueError, RuntimeError):
            return None
        if index.d != dim or side.get("count") != index.ntotal:
            return None
        if legacy_sha is not None:
            flat = _legacy_flat(index, dim)
            if flat is None:
                return None
        elif isinstance(index, faiss.IndexFlatIP):
            flat = index
        else:
            return None
        vi = cls(dim, ef_search)
        vi._index, vi._n = flat, int(flat.ntotal)
        if vi.graph is not None:
            graph = _load_graph(graph_path(path), side, dim, vi.graph.ef_search, vi._n)
            if graph is not None:
                vi.graph = graph
            elif legacy_sha is None and side.get("graph_file_sha256") is not None:
                _log.warning("the graph of the %s vector cache is damaged; rebuilding it from the vectors", path.stem)
        return vi, side  # a graph not loaded is built by the caller's link, after the vectors are checked


def graph_path(path: Path) -> Path:
    """Where the graph of the index saved at ``path`` is saved."""
    return path.with_suffix(".graph")


def _load_graph(path: Path, side: dict[str, object], dim: int, ef_search: int, count: int) -> Graph | None:
    """The graph the sidecar fingerprints, or None when absent, unreadable or not well-formed."""
    sha = side.get("graph_file_sha256")
    if not isinstance(sha, str):
        return None
    try:
        if file_sha256(path) != sha:
            return None
        graph = Graph.of(faiss.read_index(str(path)), dim, ef_search)
    except (OSError, ValueError, RuntimeError):
        return None
    if graph is None or graph.covered > count:
        return None
    built = side.get("graph_built")
    if type(built) is int and 0 < built <= graph.covered:  # else: as if built in one batch
        graph.built = built
    return graph


def _legacy_flat(index: faiss.Index, dim: int) -> faiss.IndexFlat | None:
    """The vectors of a cache of the format before (an ``IndexHNSWFlat`` owning its flat
    storage), copied into a flat index; None when the file is not one."""
    if not isinstance(index, faiss.IndexHNSWFlat) or index.metric_type != faiss.METRIC_INNER_PRODUCT:
        return None
    storage = faiss.downcast_index(index.storage)
    n = int(index.ntotal)
    if not isinstance(storage, faiss.IndexFlatIP) or storage.ntotal != n:
        return None
    flat = faiss.IndexFlatIP(dim)
    if n:
        flat.add(np.array(faiss.rev_swig_ptr(storage.get_xb(), n * dim), dtype=np.float32).reshape(n, dim))
    return flat


def vector_sha(blob: bytes) -> str:
    """Fingerprint of one stored vector, used to check an index file against the store."""
    return hashlib.sha256(blob).hexdigest()

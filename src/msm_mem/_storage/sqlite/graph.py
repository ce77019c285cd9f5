"""The approximate population index of the embedded store: an HNSW graph walked on 8-bit codes,
its candidates scored exactly.

Chosen by the setting ``population_search="hnsw"`` (exact search is the default). The graph
(``faiss.IndexHNSWSQ``, inner product, :data:`M` links a node, construction depth
:data:`EF_CONSTRUCTION`) keeps its own copy of each vector as 8-bit codes (one byte a
dimension, a quarter of the float32 vector), and the walk through it reads only those: the walk
is bound by memory traffic, so reading a quarter of the bytes makes it faster at the same
recall. Its best :data:`RESCORE` times k candidates (at most the search depth) are then scored
exactly against the float32 vectors of the flat index the patient-scoped search reads, and the
top k of those exact scores is the answer: the scores a search returns are exact cosines in
[-1, 1], and only which vectors are found is approximate. Recall and latency against FAISS's
own HNSW are in ``docs/performance.md``.

The codes are quantised per dimension over a range read from the vectors at each build in one
batch (their minimum and maximum, widened by ``graph_build.PAD`` of the range and at least
``0.5 / sqrt(dim)``); a vector linked later that falls outside it is clamped, which only makes
its walk distances coarser. The graph covers the first ``covered`` positions; the vectors added
after them (the *tail*, fewer than :data:`TAIL` unless the graph is being caught up) are scored
exactly at every search, and are linked into the graph in one batch when the tail reaches
:data:`TAIL` (and before every save). So a write does not pay an HNSW insert per vector; one
write in :data:`TAIL` vectors pays for the batch (a link call prepares state for every node, so
smaller batches cost more a vector). The tail is scored in the same call as the walk's
candidates (:meth:`Graph.search`), so a vector's score is the same in the tail or in the graph.

The tail is linked at level 0 only: its nodes' levels are preset to the base level, so the
layers above it (the routes a walk takes down to level 0) hold only nodes of the last build in
one batch. Nodes linked later and raised into the upper layers, as FAISS raises some nodes of
every batch it adds, break those routes and leave whole patients out of reach of a walk, at any
depth; nodes held to level 0 do not. When a link would take the graph to :data:`REBUILD` times
the size of its last build in one batch, the whole graph is rebuilt in one batch, so the upper
layers are drawn again from every vector and at most about half its nodes are linked at level
0: each vector is linked about twice over the life of the store.

A rebuild of fewer than :data:`BACKGROUND` vectors runs on the write that crosses the mark. A
larger one (an HNSW build of every vector) runs in a background thread over a copy of the
vectors (``graph_build.py``), on one OpenMP thread fewer than the machine has, one at a time in
the process (a graph that crosses its mark while another's build runs tries again at its next
link); the write returns at once. Until it is taken, the graph of before serves searches and
takes the tail at level 0 as usual (its links also on one thread fewer). The first write after
it is done takes it: the vectors written since its copy are linked into it on that write when
they are at most :data:`CATCH_UP`, else by a catch-up job in the background first (again while
each gains on the writes; when one leaves as many behind as it linked, writes come as fast as
its links: the rebuild is dropped, the graph of before kept, and a new one started at the next
link, so no write waits for a catch-up, and once the writes slow down a rebuild is taken). A
rebuild that fails in its thread (out of memory) is logged by the write that finds it, and the
graph grows by links until twice that size (so does one that cannot start or whose catch-up
cannot, and in a forked child any job of its parent, whose thread is not there). A save (every
close) waits for a job in flight and takes it, so the file holds the rebuilt graph; an open
builds a missing graph on the spot, once, over every row. While a rebuild runs, its copy of the
vectors (float32, 4 bytes a dimension: about 4 GB at 1M 1024-d vectors) and the new graph are held
beside the graph of before.

Retired positions (superseded or retracted records, a shredded patient's among them) stay in
the graph, which cannot delete nodes, but a bitmap selector of the live positions goes with
every search: FAISS walks through them and never returns one.

The graph is saved in a file of its own beside the flat index's. The file is checked before
use (its SHA-256 recorded in the sidecar, the kind of index, the metric, the sizes, the code
ranges and the neighbour ids): a file that fails any check is rebuilt from the vectors.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import numpy.typing as npt

from . import graph_build
from .graph_build import EF_CONSTRUCTION, QT, M, codes, link_level0, new_hnsw, spare, threads

__all__ = ["BACKGROUND", "CATCH_UP", "EF_CONSTRUCTION", "M", "REBUILD", "RESCORE", "TAIL", "Graph", "file_sha256"]

#: vectors kept out of the graph (and scored exactly) before they are linked in one batch
TAIL = 1024
#: the graph is rebuilt in one batch when a link would take it to this many times its last build
REBUILD = 2
#: a rebuild of at least this many vectors runs in a background thread (fewer: on the write)
BACKGROUND = 8192
#: vectors written during a background job linked into its graph on the write that takes it
#: (more: a catch-up job links them in the background first)
CATCH_UP = 1024
#: a search scores this many times k of the walk's best candidates exactly (at most its depth)
RESCORE = 2
_log = logging.getLogger("msm_mem")


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
        self.hnsw = new_hnsw(dim) if hnsw is None else hnsw
        self.ef_search = ef_search
        self.covered = int(self.hnsw.ntotal)
        #: nodes at the last build in one batch (a loaded graph: as its sidecar says)
        self.built = self.covered
        self._selector: tuple[tuple[int, int], faiss.IDSelectorBitmap, npt.NDArray[np.uint8]] | None = None
        self._search_params: tuple[tuple[int, tuple[int, int] | None], Any] | None = None
        self._job: graph_build.Job | None = None  # a rebuild (or its catch-up) running in the background
        self._retry_at = 0  # after a failed background rebuild: the size of the next attempt

    @classmethod
    def of(cls, hnsw: faiss.Index, dim: int, ef_search: int) -> Graph | None:
        """A graph read from a cache file, or None when it is not a well-formed one of ``dim``."""
        if not isinstance(hnsw, faiss.IndexHNSWSQ) or hnsw.d != dim or not hnsw.is_trained:
            return None
        quantiser = codes(hnsw)
        if hnsw.metric_type != faiss.METRIC_INNER_PRODUCT or quantiser.ntotal != hnsw.ntotal:
            return None
        if quantiser.metric_type != faiss.METRIC_INNER_PRODUCT or quantiser.sq.qtype != QT or quantiser.sq.d != dim:
            return None
        if (
            quantiser.code_size != dim or quantiser.codes.size() != quantiser.ntotal * dim
        ):  # (FAISS's reader checks it too)
            return None
        ranges = faiss.vector_to_array(quantiser.sq.trained)
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

    def extend(self, view: npt.NDArray[np.float32], wait: bool = True) -> None:
        """Link the tail (positions ``covered ..`` of ``view``, the flat index's vectors) into
        the graph, or rebuild the graph over all of ``view`` in one batch (module docstring).

        With ``wait`` False (a write), a rebuild of :data:`BACKGROUND` vectors or more starts in
        a background thread over a copy of ``view``, and the tail is linked into the current
        graph meanwhile (:meth:`adopt` takes the new graph once it is done). With ``wait`` (a
        save, an open) a rebuild in flight is waited for and taken, and every vector of
        ``view`` is linked on return."""
        self.adopt(view, wait)
        n = view.shape[0]
        if n == self.covered:
            return
        if self._job is None and n >= max(REBUILD * self.built, self._retry_at):
            if wait or n < BACKGROUND:
                self._swap(graph_build.build(view), n)
                return
            self._job = self._start_build(view)
        if self.covered == 0:
            return  # no graph yet: the tail stays exact until a build (in flight, or tried again)
        if self._job is None:
            link_level0(self.hnsw, view[self.covered :])
        else:
            with threads(spare()):  # beside the job's thread, not a team spinning against it
                link_level0(self.hnsw, view[self.covered :])
        self.covered = int(self.hnsw.ntotal)

    def _start_build(self, view: npt.NDArray[np.float32]) -> graph_build.Job | None:
        """A background build over a copy of ``view``; None while another graph's build holds
        the process's one slot (tried again at the next link) or when the copy or its thread
        cannot be made (logged; tried again at twice the size)."""
        if not graph_build.BUILD_SLOT.acquire(blocking=False):
            return None
        try:
            return graph_build.Job(np.array(view, dtype=np.float32), None, view.shape[0])
        except (MemoryError, RuntimeError) as exc:  # (a thread that cannot start is a RuntimeError)
            graph_build.BUILD_SLOT.release()
            self._give_up("the background rebuild of the population graph could not start", exc, view)
            return None

    def adopt(self, view: npt.NDArray[np.float32], wait: bool = False) -> None:
        """Take the graph of a background job that is done (with ``wait``: of one in flight,
        once done); a no-op without one. The vectors of ``view`` written since the job's copy
        are linked into the new graph first: here when they are at most :data:`CATCH_UP` or
        ``wait``, else by a catch-up job, the current graph serving searches meanwhile."""
        job = self._job
        if job is None or not (wait or job.done()):
            return
        job.wait()
        self._job = None
        forked = job.pid != os.getpid()  # (its thread ran in the parent: its graph is not whole here)
        if forked or job.error is not None or job.hnsw is None:
            why = "begun before this process was forked" if forked else job.error
            self._give_up("a background rebuild of the population graph failed", why, view)
            return
        gap = view.shape[0] - job.end
        if gap > CATCH_UP and not wait:
            if job.linking is not None and gap >= job.linking:
                # writes as fast as its links: another catch-up would not gain either, and linking
                # the gap here would hold this write as long; the graph of before stays
                _log.info("the population graph's rebuild did not catch up with the writes; started again")
                return
            try:
                self._job = graph_build.Job(np.array(view[job.end :], dtype=np.float32), job.hnsw, job.built)
            except (MemoryError, RuntimeError) as exc:  # no copy or no thread: dropped, not linked here
                self._give_up("the catch-up of the population graph's rebuild could not start", exc, view)
            return
        if gap > 0:
            link_level0(job.hnsw, view[job.end :])
        self._swap(job.hnsw, job.built)

    def _give_up(self, what: str, why: BaseException | str | None, view: npt.NDArray[np.float32]) -> None:
        """Log a background rebuild given up (``why``: its exception or a reason) and grow the
        graph by links until twice the size of ``view`` (the next try)."""
        self._retry_at = REBUILD * view.shape[0]
        reason = why if isinstance(why, str) else type(why).__name__
        _log.warning("%s (%s); the graph grows by links until %d vectors", what, reason, self._retry_at)

    @property
    def rebuilding(self) -> bool:
        """Whether a background job (a rebuild or its catch-up) is in flight or not yet taken."""
        return self._job is not None

    def _swap(self, hnsw: faiss.IndexHNSWSQ, built: int) -> None:
        self.hnsw, self._selector, self._search_params = hnsw, None, None
        self.built, self.covered = built, int(hnsw.ntotal)

    def search(
        self,
        z: npt.NDArray[np.float32],
        k: int,
        excluded: npt.NDArray[np.int64],
        version: int,
        flat: faiss.IndexFlat,
        end: int = 0,
    ) -> list[tuple[int, float]]:
        """Approximate top-k ``(position, cosine)`` among covered positions not ``excluded``
        (``version`` names the excluded set, so its selector is built once per change), and
        with ``end`` past ``covered`` the exact top-k of the tail ``covered .. end`` besides:
        the walk's best candidates and every tail position not excluded, scored exactly
        against ``flat`` (the float32 vectors) in one call, descending cosine, ties by
        ascending position.

        FAISS runs on one OpenMP thread of the calling thread here (the setting is per thread;
        links keep every thread, or one fewer beside a background job). One query cannot be
        split over threads, and a team of OpenMP threads woken for the exact scoring would spin
        against any other thread on the cores. The tail is scored in this call, not by numpy,
        so no BLAS thread waits for a core a background rebuild holds."""
        if k <= 0 or max(end, self.covered) == 0:
            return []
        query = np.ascontiguousarray(z, dtype=np.float32).reshape(1, -1)
        with threads(1):
            if self.covered:
                params = self._params(k, excluded, version)
                _, found = self.hnsw.search(query, min(params.efSearch, RESCORE * k), params=params)
                ids = found[0, found[0] >= 0]
            else:
                ids = np.zeros(0, dtype=np.int64)
            if end > self.covered:
                tail = np.arange(self.covered, end, dtype=np.int64)
                if excluded.size:
                    tail = tail[~np.isin(tail, excluded[excluded >= self.covered])]
                ids = np.concatenate([ids, tail])
            if ids.size == 0:
                return []
            scores = np.empty(ids.size, dtype=np.float32)
            exact: Any = flat  # compute_distance_subset is missing from faiss's stubs
            exact.compute_distance_subset(
                1, faiss.swig_ptr(query), ids.size, faiss.swig_ptr(scores), faiss.swig_ptr(ids)
            )
        top = np.lexsort((ids, -scores))[:k]
        return list(zip(ids[top].tolist(), scores[top].tolist(), strict=True))

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

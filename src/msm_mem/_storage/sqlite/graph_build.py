"""The FAISS building blocks of the population graph (``graph.py``, whose docstring says what
they are for) and its background jobs: a new HNSW graph over 8-bit codes, its code ranges, a
build in one batch, a link at level 0, and a :class:`Job` that runs a build or a catch-up link
in a thread of its own, one at a time in the process, on one OpenMP thread fewer than the
machine has.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import faiss
import numpy as np
import numpy.typing as npt

__all__ = [
    "BUILDING",
    "BUILD_SLOT",
    "EF_CONSTRUCTION",
    "M",
    "QT",
    "Job",
    "build",
    "codes",
    "link_level0",
    "new_hnsw",
    "spare",
    "threads",
]

#: links per node (FAISS's ``M``; level 0 has ``2 M``)
M = 32
#: candidate list depth while linking a node
EF_CONSTRUCTION = 40
#: the code range of a dimension is widened by this share of it on each side
PAD = 0.05
#: rows read for the code ranges at a build (evenly spaced over the vectors)
RANGE_SAMPLE = 65_536
#: the codes' quantiser, 8 bits a dimension
QT: Any = faiss.ScalarQuantizer.QT_8bit  # an enum value; faiss's stubs type it as the class
#: one background build in the process from its start (its copy of the vectors) to its end
BUILD_SLOT = threading.Lock()
#: taken by a background job while it builds or links: one at a time in the process
BUILDING = threading.Lock()


def _fresh_locks() -> None:
    """A forked child has none of the parent's jobs (a job found there reads as failed): its
    locks start free, whoever held them in the parent."""
    global BUILD_SLOT, BUILDING
    BUILD_SLOT, BUILDING = threading.Lock(), threading.Lock()


os.register_at_fork(after_in_child=_fresh_locks)


def new_hnsw(dim: int) -> faiss.IndexHNSWSQ:
    hnsw = faiss.IndexHNSWSQ(dim, QT, M, faiss.METRIC_INNER_PRODUCT)
    hnsw.hnsw.efConstruction = EF_CONSTRUCTION
    return hnsw


def codes(hnsw: faiss.IndexHNSW) -> faiss.IndexScalarQuantizer:
    return cast(faiss.IndexScalarQuantizer, faiss.downcast_index(hnsw.storage))


def set_ranges(hnsw: faiss.IndexHNSWSQ, view: npt.NDArray[np.float32]) -> None:
    """Quantise each dimension over the range of ``view`` (a sample of it), widened (``graph.py``)."""
    n, dim = view.shape
    sample = view[:: max(1, n // RANGE_SAMPLE)]
    lo, hi = sample.min(axis=0).astype(np.float64), sample.max(axis=0).astype(np.float64)
    pad = np.maximum(PAD * (hi - lo), 0.5 / np.sqrt(dim))
    lo, hi = np.maximum(lo - pad, -1.0), np.minimum(hi + pad, 1.0)
    quantiser = codes(hnsw)
    faiss.copy_array_to_vector(np.concatenate([lo, hi - lo]).astype(np.float32), quantiser.sq.trained)
    quantiser.is_trained = True
    hnsw.is_trained = True


def build(view: npt.NDArray[np.float32]) -> faiss.IndexHNSWSQ:
    """A graph over every row of ``view``, built in one batch (its code ranges read from it)."""
    fresh = new_hnsw(view.shape[1])
    set_ranges(fresh, view)
    fresh.add(np.ascontiguousarray(view))
    return fresh


def link_level0(hnsw: faiss.IndexHNSWSQ, tail: npt.NDArray[np.float32]) -> None:
    """Link ``tail`` into ``hnsw`` at level 0 only: the new nodes' levels are preset to the base
    level (``graph.py``). A link that fails leaves no preset behind for nodes never added."""
    links: Any = hnsw.hnsw  # the SWIG struct: its vectors are not in faiss's type stubs
    start = int(hnsw.ntotal)
    n = start + tail.shape[0]
    links.levels.resize(n)
    faiss.rev_swig_ptr(links.levels.data(), n)[start:] = 1
    try:
        hnsw.add(np.ascontiguousarray(tail))
    except BaseException:
        links.levels.resize(int(hnsw.ntotal))
        raise


class Job:
    """A build in one batch (``target`` None) or a link at level 0 into ``target``, run in a
    thread of its own over ``vectors``, a copy (the flat index may move its storage meanwhile).
    The thread runs FAISS on one OpenMP thread fewer than the machine has (at least one), so
    searches and writes keep a core, and one job runs at a time in the process; a build holds
    the process's build slot (``BUILD_SLOT``, taken by the write that starts it) until it ends."""

    def __init__(self, vectors: npt.NDArray[np.float32], target: faiss.IndexHNSWSQ | None, built: int) -> None:
        self.hnsw = target
        self.built = built  # nodes of the result's build in one batch
        self.linking = None if target is None else vectors.shape[0]  # a catch-up: how many it links
        self.end = built if target is None else int(target.ntotal) + vectors.shape[0]
        self.error: BaseException | None = None
        self.pid = os.getpid()
        self._vectors: npt.NDArray[np.float32] | None = vectors
        self._thread = threading.Thread(target=self._run, name="msm-mem graph build", daemon=False)
        self._thread.start()

    def _run(self) -> None:
        vectors, self._vectors = self._vectors, None
        assert vectors is not None
        faiss.omp_set_num_threads(spare())
        try:
            with BUILDING:
                if self.hnsw is None:
                    self.hnsw = build(vectors)
                else:
                    link_level0(self.hnsw, vectors)
        except BaseException as exc:  # reported to the write that adopts the job
            self.error = exc
        finally:
            del vectors
            if self.linking is None:
                BUILD_SLOT.release()  # taken by the write that started this build

    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self) -> None:
        self._thread.join()


def spare() -> int:
    """OpenMP threads for work beside a background job: one fewer than the machine's (at least 1)."""
    return max(1, faiss.omp_get_max_threads() - 1)


@contextmanager
def threads(count: int) -> Iterator[None]:
    """FAISS on ``count`` OpenMP threads in the calling thread (OpenMP's setting is per thread)."""
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(count)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)

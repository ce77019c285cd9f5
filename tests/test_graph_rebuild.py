"""The population graph's rebuild off the write path (``graph.py``): a write that crosses the
rebuild mark starts the rebuild in a background thread and returns; the graph of before serves
searches and takes new vectors until the rebuild is taken, with the vectors written meanwhile
linked into it; a save waits for it; a failed one leaves the graph growing by links.

The tests hold the process's build lock (``graph_build.BUILDING``), which every background job takes
before it builds, so a rebuild is in flight for exactly as long as a test says."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import faiss
import numpy as np
import pytest

from msm_mem._storage.sqlite import graph as graph_module
from msm_mem._storage.sqlite import graph_build
from msm_mem._storage.sqlite.graph import Graph
from msm_mem._storage.sqlite.vector_index import VectorIndex
from tests.graph_helpers import DIM, clustered, hnsw_store, hnsw_store_created, write


@pytest.fixture
def background(monkeypatch: pytest.MonkeyPatch, small_tail: None) -> None:
    """Rebuilds of 300 vectors or more in the background, catch-ups past 8 vectors."""
    monkeypatch.setattr(graph_module, "BACKGROUND", 300)
    monkeypatch.setattr(graph_module, "CATCH_UP", 8)


@pytest.fixture
def held() -> Iterator[threading.Lock]:
    """The build lock, held by the test until it releases it (released at the end in any case)."""
    lock = graph_build.BUILDING
    lock.acquire()
    yield lock
    if lock.locked():
        lock.release()


def _finish(graph: Graph) -> None:
    """Wait until the background job in flight is done (it is not taken)."""
    job = graph._job
    assert job is not None
    job.wait()


def _top1(index: VectorIndex, x: np.ndarray, positions: range) -> list[int]:
    return [index.population(x[i], 1, None)[0][0] for i in positions]


def _rebuilt(seed: int, n: int, held: threading.Lock) -> tuple[np.ndarray, VectorIndex, Graph]:
    """``n`` rows and an index whose graph (built over 200) has a rebuild over 400 done, not
    taken yet, and 20 vectors written since its copy (``held`` released)."""
    x = clustered(np.random.default_rng(seed), n, 6)
    index = VectorIndex(DIM, 64)
    index.add(x[:200], ["p"] * 200)
    index.add(x[200:400], ["p"] * 200)  # a rebuild over 400, held
    index.add(x[400:420], ["p"] * 20)
    graph = index.graph
    assert graph is not None and graph.built == 200
    held.release()
    _finish(graph)
    return x, index, graph


def _held_catch_up(seed: int, n: int, held: threading.Lock) -> tuple[np.ndarray, VectorIndex, Graph]:
    """As :func:`_rebuilt`, the rebuild then taken by a write of 1 into a catch-up of the 21
    written since its copy, held (``held`` taken again)."""
    x, index, graph = _rebuilt(seed, n, held)
    held.acquire()
    index.add(x[420:421], ["p"])  # the rebuild taken into a catch-up of 21, held
    assert graph.rebuilding and graph.built == 200
    return x, index, graph


def _in_child(check: Callable[[], bool]) -> int:
    """The exit code of a forked child that runs ``check`` (0: true, 2: false, 3: raised); the
    child never returns into pytest and kills itself after 20 s."""
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            signal.alarm(20)
            code = 0 if check() else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_a_write_past_the_mark_returns_before_the_rebuild_and_the_rebuild_is_taken_later(
    background: None, held: threading.Lock
) -> None:
    """The write that crosses twice the last build returns with the rebuild still held; the
    graph of before takes the new vectors at level 0 and finds them; once the rebuild is done,
    the next write takes it, after a catch-up job has linked the vectors written meanwhile."""
    x = clustered(np.random.default_rng(0), 430, 6)
    index = VectorIndex(DIM, 64)
    index.add(x[:200], ["p"] * 200)  # under BACKGROUND: built on the write
    graph = index.graph
    assert graph is not None and graph.built == graph.covered == 200 and not graph.rebuilding
    before = graph.hnsw
    index.add(x[200:400], ["p"] * 200)  # 400 >= 2 x 200: the rebuild starts, held
    assert graph.rebuilding and graph.hnsw is before and graph.built == 200 and graph.covered == 400
    index.add(x[400:420], ["p"] * 20)  # written while the rebuild runs: linked into the graph of before
    assert graph.covered == 420 and _top1(index, x, range(0, 420, 7)) == list(range(0, 420, 7))
    levels = faiss.vector_to_array(before.hnsw.levels)
    assert (levels[200:] == 1).all()
    held.release()
    _finish(graph)
    index.add(x[420:421], ["p"])  # takes the rebuild; 21 written since its copy > CATCH_UP: a catch-up
    assert graph.rebuilding and graph.hnsw is before
    _finish(graph)
    index.add(x[421:422], ["p"])  # takes the catch-up, links the one written since
    assert not graph.rebuilding and graph.hnsw is not before
    assert graph.built == 400 and graph.covered == 422
    levels = faiss.vector_to_array(graph.hnsw.hnsw.levels)
    assert (levels[400:] == 1).all() and levels[:400].max() > 1
    assert _top1(index, x, range(422)) == list(range(422))
    index.add(x[422:], ["p"] * 8)
    assert graph.covered == 430


def test_a_link_waits_for_the_rebuild_in_flight_and_takes_it(background: None, held: threading.Lock) -> None:
    """An explicit link (every save) waits for a rebuild in flight, takes it and links the
    vectors written since: on return every vector is in the rebuilt graph."""
    x = clustered(np.random.default_rng(1), 500, 6)
    index = VectorIndex(DIM, 64)
    index.add(x[:200], ["p"] * 200)
    index.add(x[200:400], ["p"] * 200)
    index.add(x[400:], ["p"] * 100)
    graph = index.graph
    assert graph is not None and graph.rebuilding and graph.built == 200
    threading.Timer(0.2, held.release).start()
    index.link()
    assert not graph.rebuilding and graph.built == 400 and graph.covered == 500
    assert _top1(index, x, range(0, 500, 5)) == list(range(0, 500, 5))


def test_a_rebuild_outgrown_while_it_ran_is_taken_and_the_next_one_starts(
    background: None, held: threading.Lock
) -> None:
    """As many vectors written during a rebuild as it holds: it is still taken (its upper layers
    span twice those of the graph before), after a catch-up job links them, and the next
    rebuild, over every vector, starts at the next link."""
    x = clustered(np.random.default_rng(2), 830, 6)
    index = VectorIndex(DIM, 64)
    index.add(x[:200], ["p"] * 200)
    index.add(x[200:400], ["p"] * 200)  # a rebuild over 400 starts, held
    index.add(x[400:800], ["p"] * 400)  # 800 written: >= 2 x 400
    graph = index.graph
    assert graph is not None and graph.built == 200 and graph.covered == 800
    held.release()
    _finish(graph)
    index.add(x[800:810], ["p"] * 10)  # a catch-up of the 410 written since the copy
    assert graph.rebuilding and graph.built == 200 and graph.covered == 810
    _finish(graph)
    index.add(x[810:812], ["p"] * 2)  # taken, the 2 written since the catch-up's copy linked here
    assert graph.built == 400 and graph.covered == 812 and not graph.rebuilding
    index.add(x[812:816], ["p"] * 4)  # the next link: 816 >= 2 x 400, a rebuild over 816 starts
    assert graph.rebuilding and graph.built == 400 and graph.covered == 816
    index.add(x[816:], ["p"] * 14)
    index.link()
    assert not graph.rebuilding and graph.built == 816 and graph.covered == 830
    assert _top1(index, x, range(0, 830, 3)) == list(range(0, 830, 3))


def test_a_rebuild_whose_catch_up_does_not_gain_on_the_writes_is_dropped_and_started_again(
    background: None, held: threading.Lock, caplog: pytest.LogCaptureFixture
) -> None:
    """A catch-up job that leaves as many vectors behind as it linked (writes as fast as its
    links) is followed by no other, and its gap is not linked on a write either (that write
    would wait as long): the rebuild is dropped, the graph of before (every vector linked)
    kept, and a new rebuild starts at the next link."""
    x, index, graph = _held_catch_up(6, 470, held)
    before = graph.hnsw
    index.add(x[421:460], ["p"] * 39)  # 39 more written meanwhile: more than it links
    held.release()
    _finish(graph)
    with caplog.at_level(logging.INFO, logger="msm_mem"):
        index.add(x[460:461], ["p"])
    assert "did not catch up with the writes" in caplog.text
    assert not graph.rebuilding and graph.hnsw is before and graph.built == 200 and graph.covered == 460
    index.add(x[461:465], ["p"] * 4)  # the next link: 465 >= 2 x 200, a new rebuild starts
    assert graph.rebuilding and graph.hnsw is before and graph.covered == 465
    index.add(x[465:], ["p"] * 5)
    index.link()
    assert graph.built == 465 and graph.covered == 470
    assert _top1(index, x, range(470)) == list(range(470))


def test_a_failed_rebuild_leaves_the_graph_growing_by_links(
    background: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A rebuild that fails in its thread (here out of memory) is reported by the write that
    finds it, and the graph of before keeps every vector and its answers; the next rebuild is
    tried at twice the size it failed at."""
    x = clustered(np.random.default_rng(3), 900, 6)
    index = VectorIndex(DIM, 64)
    index.add(x[:200], ["p"] * 200)
    graph = index.graph
    assert graph is not None

    def fails(view: np.ndarray) -> faiss.IndexHNSWSQ:
        raise MemoryError("no room for the graph")

    build = graph_build.build
    monkeypatch.setattr(graph_build, "build", fails)
    index.add(x[200:400], ["p"] * 200)
    _finish(graph)
    with caplog.at_level(logging.WARNING, logger="msm_mem"):
        index.add(x[400:404], ["p"] * 4)
    assert "rebuild of the population graph failed (MemoryError)" in caplog.text
    assert not graph.rebuilding and graph.built == 200 and graph.covered == 404
    monkeypatch.setattr(graph_build, "build", build)
    index.add(x[404:800], ["p"] * 396)  # under 2 x 404: linked, no new attempt yet
    assert not graph.rebuilding and graph.covered == 800
    assert _top1(index, x, range(0, 800, 9)) == list(range(0, 800, 9))
    index.add(x[800:], ["p"] * 100)  # 900 >= 2 x 404: tried again, and it succeeds
    assert graph.rebuilding
    index.link()
    assert graph.built == 900 and graph.covered == 900


def test_a_store_write_returns_during_the_rebuild_and_close_saves_the_rebuilt_graph(
    tmp_path: Path, background: None, held: threading.Lock
) -> None:
    """Through the store: the write that crosses the mark commits and returns with the rebuild
    held, its rows are found at once, and close waits for the rebuild and saves it, so a reopen
    loads the rebuilt graph (its build in one batch named by the sidecar)."""
    x = clustered(np.random.default_rng(4), 460, 6)
    store = hnsw_store_created(tmp_path / "s")
    ids = write(store, x[:200])
    ids += write(store, x[200:450], start=200)  # 450 >= 2 x 200: the rebuild starts, held
    graph = store._vectors._index["episodic"].graph
    assert graph is not None and graph.rebuilding and graph.built == 200
    for i in range(0, 450, 11):
        assert store.search("episodic", x[i], 1, None)[0][0] == ids[i]
    threading.Timer(0.2, held.release).start()
    store.close()
    reopened = hnsw_store(tmp_path / "s")
    graph = reopened._vectors._index["episodic"].graph
    assert graph is not None and graph.built == graph.covered == 450 and not graph.rebuilding
    ids += write(reopened, x[450:], start=450)
    for i in range(0, 460, 7):
        assert reopened.search("episodic", x[i], 1, None)[0][0] == ids[i]
    reopened.close()


def test_an_open_without_a_graph_builds_it_once_over_every_row(tmp_path: Path, background: None) -> None:
    """A store opened without its vector cache loads every row first and builds the graph once,
    in one batch over all of them (not at each doubling while they load, nor in the
    background): on return the graph covers every row and is its own last build. (The rows
    load 8,192 at a time: linked as they came, the graph would be built over the first 8,192.)"""
    x = clustered(np.random.default_rng(5), 10_000, 6)
    store = hnsw_store_created(tmp_path / "s")
    ids = write(store, x)
    store.close()
    for name in ("episodic.graph", "episodic.faiss"):  # the vectors read from the rows
        (tmp_path / "s" / "index" / name).unlink()
    reopened = hnsw_store(tmp_path / "s")
    graph = reopened._vectors._index["episodic"].graph
    assert graph is not None and graph.built == graph.covered == 10_000 and not graph.rebuilding
    assert [reopened.search("episodic", z, 1, None)[0][0] for z in x[::97]] == ids[::97]
    reopened.close()


def test_one_background_build_at_a_time_the_other_graph_tries_again(background: None, held: threading.Lock) -> None:
    """A graph that crosses its mark while another graph's build runs (each build holds a copy
    of its vectors) starts none: it links at level 0 and starts its own at the first link after
    the other's build has ended."""
    x = clustered(np.random.default_rng(7), 420, 6)
    first, second = VectorIndex(DIM, 64), VectorIndex(DIM, 64)
    for index in (first, second):
        index.add(x[:200], ["p"] * 200)
    first.add(x[200:400], ["p"] * 200)  # the first's rebuild starts, held
    second.add(x[200:400], ["p"] * 200)  # the second's is due, but the slot is taken
    a, b = first.graph, second.graph
    assert a is not None and b is not None
    assert a.rebuilding and not b.rebuilding and b.built == 200 and b.covered == 400
    held.release()
    _finish(a)
    first.add(x[400:404], ["p"] * 4)
    assert not a.rebuilding and a.built == 400
    second.add(x[400:404], ["p"] * 4)  # the next link: the slot is free, its rebuild starts
    assert b.rebuilding
    second.link()
    assert b.built == 404 and b.covered == 404


def test_a_rebuild_that_cannot_start_leaves_the_graph_growing_by_links(
    background: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """When the build's thread cannot be started (or its copy made), the write still succeeds:
    the tail is linked at level 0, the failure is logged, the slot is free again, and the next
    try is at twice the size."""
    x = clustered(np.random.default_rng(8), 900, 6)
    index = VectorIndex(DIM, 64)
    index.add(x[:200], ["p"] * 200)

    def cannot_start(*args: object) -> None:
        raise RuntimeError("can't start new thread")

    job = graph_build.Job
    monkeypatch.setattr(graph_build, "Job", cannot_start)
    with caplog.at_level(logging.WARNING, logger="msm_mem"):
        index.add(x[200:400], ["p"] * 200)
    graph = index.graph
    assert graph is not None and not graph.rebuilding and graph.built == 200 and graph.covered == 400
    assert "could not start (RuntimeError)" in caplog.text
    assert not graph_build.BUILD_SLOT.locked()
    monkeypatch.setattr(graph_build, "Job", job)
    index.add(x[400:796], ["p"] * 396)  # under 2 x 400: linked
    assert not graph.rebuilding and graph.covered == 796
    index.add(x[796:], ["p"] * 104)  # 900 >= 2 x 400: tried again
    assert graph.rebuilding
    index.link()
    assert graph.built == 900 and graph.covered == 900


def test_a_forked_child_has_free_locks_and_takes_no_job_of_its_parent(background: None, held: threading.Lock) -> None:
    """A process forked while a rebuild is in flight (and the build lock held) has none of its
    parent's threads: its build locks start free, and the job it finds reads as failed rather
    than being waited for or taken half made. (The child touches no FAISS call: OpenMP itself
    is not safe to use after a fork.)"""
    x = clustered(np.random.default_rng(9), 400, 6)
    index = VectorIndex(DIM, 64)
    index.add(x[:200], ["p"] * 200)
    index.add(x[200:400], ["p"] * 200)  # the rebuild starts, held
    graph = index.graph
    assert graph is not None and graph.rebuilding and graph_build.BUILD_SLOT.locked()

    def check() -> bool:
        free = not graph_build.BUILDING.locked() and not graph_build.BUILD_SLOT.locked()
        graph.adopt(index.vectors())
        return free and not graph.rebuilding and graph.built == 200 and graph.covered == 400

    assert _in_child(check) == 0
    assert graph.rebuilding  # the parent's job is untouched
    held.release()
    index.link()
    assert graph.built == 400 and graph.covered == 400


def test_a_forked_child_does_not_take_its_parents_catch_up(background: None, held: threading.Lock) -> None:
    """A catch-up job (its target graph already made) found in a forked child is not taken there:
    its links ran, or were to run, in the parent's thread."""
    _, index, graph = _held_catch_up(10, 421, held)

    def check() -> bool:
        graph.adopt(index.vectors())  # nothing written since the catch-up's copy: no link needed
        return not graph.rebuilding and graph.built == 200

    assert _in_child(check) == 0
    held.release()
    index.link()
    assert graph.built == 400 and graph.covered == 421


def test_a_catch_up_that_cannot_start_drops_the_rebuild_without_holding_the_write(
    background: None, held: threading.Lock, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """When the catch-up's thread cannot be started, the write does not link the gap itself:
    the rebuild is dropped (logged), the graph of before kept, and tried again at twice the size."""
    x, index, graph = _rebuilt(11, 440, held)
    before = graph.hnsw

    def cannot_start(*args: object) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(graph_build, "Job", cannot_start)
    with caplog.at_level(logging.WARNING, logger="msm_mem"):
        index.add(x[420:421], ["p"])  # takes the rebuild: 21 written since its copy, no catch-up
    assert "catch-up of the population graph's rebuild could not start (RuntimeError)" in caplog.text
    assert not graph.rebuilding and graph.hnsw is before and graph.built == 200 and graph.covered == 420
    index.add(x[421:], ["p"] * 19)
    assert graph.covered == 440 and _top1(index, x, range(0, 440, 3)) == list(range(0, 440, 3))

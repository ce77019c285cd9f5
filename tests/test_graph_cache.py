"""The embedded store's population graph on disk: saved beside the flat cache, loaded and
extended, rebuilt from the vectors when its file is damaged, converted between modes and from
the format before (``graph.py``, ``vector_index.py``)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import faiss
import numpy as np
import pytest

from msm_mem._storage.sqlite import SqliteStore
from msm_mem._storage.sqlite.graph import file_sha256
from msm_mem._storage.sqlite.vector_index import graph_path
from tests.conftest import with_codec
from tests.graph_helpers import DIM, clustered, hnsw_store, hnsw_store_created, results, saved, write


def test_a_loaded_graph_links_new_vectors_at_level_0_and_saves_them(
    tmp_path: Path, small_tail: None, caplog: pytest.LogCaptureFixture
) -> None:
    """Writes to a reopened store link into the graph read from its file, at level 0 (its last
    build in one batch is the one the sidecar names), and the graph saved after them loads again
    as it was, without a rebuild."""
    rng = np.random.default_rng(3)
    x = clustered(rng, 390, 6)
    store = hnsw_store_created(tmp_path / "s")
    ids = write(store, x[:200])
    store.close()
    reopened = hnsw_store(tmp_path / "s")
    graph = reopened._vectors._index["episodic"].graph
    assert graph is not None and graph.built == graph.covered == 200
    ids += write(reopened, x[200:], start=200)
    assert graph.built == 200 and graph.covered == 390  # linked, not rebuilt (390 < 2 x 200)
    levels = faiss.vector_to_array(graph.hnsw.hnsw.levels)
    assert (levels[200:] == 1).all() and levels[:200].max() > 1
    for i, z in enumerate(x):
        assert reopened.search("episodic", z, 1, None)[0][0] == ids[i]
    reopened.close()
    with caplog.at_level(logging.WARNING):
        again = hnsw_store(tmp_path / "s")
    graph = again._vectors._index["episodic"].graph
    assert not caplog.records and graph is not None and (graph.built, graph.covered) == (200, 390)
    assert np.array_equal(faiss.vector_to_array(graph.hnsw.hnsw.levels), levels)
    for i, z in enumerate(x):
        assert again.search("episodic", z, 1, None)[0][0] == ids[i]
    again.close()


@pytest.mark.parametrize(
    "damage", ["flip", "truncate", "bad-neighbour", "bad-range", "short-codes", "foreign-sidecar", "missing"]
)
def test_a_corrupt_graph_file_is_rebuilt_from_the_vectors(
    tmp_path: Path, small_tail: None, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A graph file that is absent, not the one its sidecar fingerprints, or not well-formed (a
    neighbour id past the end, a dimension quantised over an empty range, or fewer codes than
    nodes, the fingerprint updated to match) is rebuilt from the vectors: the same answers, and a warning."""
    x, want, path = saved(tmp_path, 2, 80, 8)
    path = graph_path(path)
    side_path = path.with_suffix(".json")
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[len(data) // 3] ^= 0xFF
        path.write_bytes(bytes(data))
    elif damage == "truncate":
        path.write_bytes(bytes(data[: len(data) // 2]))
    elif damage in ("bad-neighbour", "bad-range", "short-codes"):
        hnsw = faiss.read_index(str(path))
        if damage == "short-codes":
            codes = faiss.downcast_index(hnsw.storage)
            codes.codes.resize((codes.ntotal - 1) * codes.code_size)  # a search would read past the end
        elif damage == "bad-neighbour":
            neighbours = faiss.vector_to_array(hnsw.hnsw.neighbors)
            neighbours[np.flatnonzero(neighbours >= 0)[0]] = 10_000
            faiss.copy_array_to_vector(neighbours, hnsw.hnsw.neighbors)
        else:
            sq = faiss.downcast_index(hnsw.storage).sq
            ranges = faiss.vector_to_array(sq.trained)
            ranges[DIM + 3] = 0.0
            faiss.copy_array_to_vector(ranges, sq.trained)
        faiss.write_index(hnsw, str(path))
        side = json.loads(side_path.read_text())
        side["graph_file_sha256"] = file_sha256(path)
        side_path.write_text(json.dumps(side))
    elif damage == "missing":
        path.unlink()
    else:
        side = json.loads(side_path.read_text())
        side["graph_file_sha256"] = "0" * 64
        side_path.write_text(json.dumps(side))
    with caplog.at_level(logging.WARNING, logger="msm_mem"):
        reopened = hnsw_store(tmp_path / "s")
    assert "rebuilding" in caplog.text
    graph = reopened._vectors._index["episodic"].graph
    assert graph is not None and graph.covered == len(x)
    got = results(reopened, x)
    assert [[rid for rid, _ in hits] for hits in got] == [[rid for rid, _ in hits] for hits in want]
    reopened.close()


def test_a_damaged_flat_cache_of_a_graph_store_is_rebuilt_from_the_rows(
    tmp_path: Path, small_tail: None, caplog: pytest.LogCaptureFixture
) -> None:
    """The flat file beside the graph, changed, is caught by the stored vectors' digest: both
    are rebuilt from the rows, with the same answers."""
    x, want, path = saved(tmp_path, 4, 80, 8)
    flat = faiss.read_index(str(path))
    vectors = faiss.rev_swig_ptr(flat.get_xb(), flat.ntotal * DIM)
    vectors[5] += 0.25  # one coordinate of the first vector: still a well-formed file
    faiss.write_index(flat, str(path))
    with caplog.at_level(logging.WARNING, logger="msm_mem"):
        reopened = hnsw_store(tmp_path / "s")
    assert "does not match the store; rebuilding" in caplog.text
    assert np.array_equal(reopened._vectors._index["episodic"].vectors(), x)
    assert results(reopened, x) == want
    reopened.close()


def test_a_cache_of_the_format_before_opens(tmp_path: Path, small_tail: None, caplog: pytest.LogCaptureFixture) -> None:
    """A store whose cache is the format before (the graph, an IndexHNSWFlat, owning the flat
    vectors in the main file, fingerprinted by ``graph_sha256``) opens without a rebuild from
    the rows: its vectors are taken from that file and a graph of codes is built from them."""
    x, want, path = saved(tmp_path, 5, 60, 6)
    old = faiss.IndexHNSWFlat(DIM, 32, faiss.METRIC_INNER_PRODUCT)
    old.add(x)
    faiss.write_index(old, str(path))
    graph_path(path).unlink()
    side = json.loads(path.with_suffix(".json").read_text())
    del side["graph_file_sha256"]
    side["graph_sha256"] = file_sha256(path)
    path.with_suffix(".json").write_text(json.dumps(side))
    with caplog.at_level(logging.WARNING, logger="msm_mem"):
        reopened = hnsw_store(tmp_path / "s")
    assert "rebuilding" not in caplog.text  # neither from the rows nor a damaged graph
    graph = reopened._vectors._index["episodic"].graph
    assert graph is not None and graph.covered == len(x)
    assert [[rid for rid, _ in h] for h in results(reopened, x)] == [[rid for rid, _ in h] for h in want]
    reopened.close()
    assert faiss.read_index(str(path)).__class__ is faiss.IndexFlatIP  # saved in the new format
    assert isinstance(faiss.read_index(str(graph_path(path))), faiss.IndexHNSWSQ)


def test_a_store_reopened_exact_keeps_no_graph_file(tmp_path: Path, small_tail: None) -> None:
    """Saved in exact mode, a store drops the graph file of its HNSW days (the codes of its
    vectors are not left behind)."""
    store = hnsw_store_created(tmp_path / "s")
    write(store, clustered(np.random.default_rng(6), 40, 4))
    store.close()
    path = graph_path(tmp_path / "s" / "index" / "episodic.faiss")
    assert path.is_file()
    with_codec(SqliteStore.open(tmp_path / "s")).close()
    assert not path.exists()


def test_switching_modes_converts_the_cache(tmp_path: Path) -> None:
    """A store made exact and reopened with the graph answers from a graph; reopened exact
    again it answers exactly what it answered first."""
    store = with_codec(SqliteStore.create(tmp_path / "s", dim=DIM, encoder="t"))
    x = clustered(np.random.default_rng(3), 200, 10)
    write(store, x)
    exact = results(store, x)
    store.close()
    approx = hnsw_store(tmp_path / "s", ef_search=200)
    assert approx._vectors._index["episodic"].graph is not None
    assert [[rid for rid, _ in h] for h in results(approx, x)] == [[rid for rid, _ in h] for h in exact]
    approx.close()
    again = with_codec(SqliteStore.open(tmp_path / "s"))
    assert again._vectors._index["episodic"].graph is None and results(again, x) == exact
    again.close()

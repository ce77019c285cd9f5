"""Helpers of the population-search tests (``test_population_search.py``, ``test_graph_cache.py``):
clustered vectors, stores with the graph on, writes of episodic rows and their answers."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from msm_mem import EpisodicRecord
from msm_mem._storage.base import WriteBatch
from msm_mem._storage.sqlite import SqliteStore
from tests.conftest import with_codec

DIM = 32
#: the recall@10 against exact search the default search depth reaches on clustered vectors
DOCUMENTED_RECALL = 0.95


def clustered(rng: np.random.Generator, n: int, clusters: int, spread: float = 0.35) -> np.ndarray:
    """``n`` unit vectors around ``clusters`` random unit centres (embeddings are clustered)."""
    centres = rng.standard_normal((clusters, DIM))
    x = centres[rng.integers(clusters, size=n)] + spread * rng.standard_normal((n, DIM))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def hnsw_store_created(path: Path) -> SqliteStore:
    return with_codec(SqliteStore.create(path, dim=DIM, encoder="t", population_search="hnsw"))


def hnsw_store(path: Path, **options: object) -> SqliteStore:
    return with_codec(SqliteStore.open(path, population_search="hnsw", **options))  # type: ignore[arg-type]


def write(store: SqliteStore, x: np.ndarray, start: int = 0, patients: int = 10) -> list[str]:
    ids = [f"E-{start + i}" for i in range(len(x))]
    episodes = [
        EpisodicRecord(rid, f"p{(start + i) % patients}", 1e9, z, "q", "a")
        for i, (rid, z) in enumerate(zip(ids, x, strict=True))
    ]
    store.write(WriteBatch(episodes=episodes))
    return ids


def recall_at(got: list[list[int]], want: list[list[int]]) -> float:
    return float(np.mean([len(set(g) & set(w)) / len(w) for g, w in zip(got, want, strict=True)]))


def results(store: SqliteStore, x: np.ndarray) -> list[list[tuple[str, float]]]:
    return [store.search("episodic", z, 5, None) for z in x[:20]]


def saved(tmp_path: Path, seed: int, n: int, clusters: int) -> tuple[np.ndarray, list[list[tuple[str, float]]], Path]:
    """A graph store of ``n`` clustered rows, closed (its caches saved): the rows, its answers
    to the first 20 and the path of its flat cache file."""
    store = hnsw_store_created(tmp_path / "s")
    x = clustered(np.random.default_rng(seed), n, clusters)
    write(store, x)
    want = results(store, x)
    store.close()
    return x, want, tmp_path / "s" / "index" / "episodic.faiss"
